"""``rllab crosscheck verl``: rllab's components as an imported verl config sets them, against verl
0.9.1's own core_algos functions (skipped where verl is not installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rllab.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "frameworks"
A = "actor_rollout_ref.actor."


def _verl_available() -> bool:
    from rllab_referee.verl_reference import VerlUnavailable, load_verl

    try:
        return load_verl().version == "0.9.1"
    except VerlUnavailable:
        return False


needs_verl = pytest.mark.skipif(not _verl_available(), reason="verl 0.9.1 is not installed "
                                "(pip install omegaconf orjson && pip install --no-deps verl==0.9.1)")


def run(capsys, *argv):
    code = main(["--plugin", "rllab_referee", "crosscheck", "verl", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_shared_batches_have_signal_in_every_group():
    from rllab_referee.verl_check import batch

    b = batch(0, prompts=4, n=3, width=8)
    for g in range(4):
        scores = b["score"][b["index"] == g]
        assert scores.max() == 1.0 and scores.min() == 0.0
    # the outcome reward sits on each row's last response token
    last = b["mask"].sum(-1) - 1
    assert (b["rewards"].sum(-1) == b["score"]).all() and (b["rewards"][range(12), last] == b["score"]).all()
    assert b["mask"].all(-1).any() and not b["mask"].all()


def test_a_refused_config_gets_the_importers_message(capsys):
    code, out, err = run(capsys, str(EXAMPLES / "verl_dapo.yaml"), A + "optim.optimizer=SGD")
    assert code != 0 and "optim.optimizer" in err and "rllab trains with AdamW" in err and "Traceback" not in err


@needs_verl
def test_the_dapo_example_agrees_with_verls_functions(capsys):
    code, out, err = run(capsys, str(EXAMPLES / "verl_dapo.yaml"), "--batches", "2")
    assert code == 0, out + err
    for what in ("[advantage] grpo vs compute_grpo_outcome_advantage", "[policy_loss] ppo_dual_clip vs get_policy_loss_fn('vanilla')",
                 "[aggregation] token-mean vs agg_loss('token-mean')"):
        assert what in out
    assert "not compared: KL: the config has no KL term" in out and "not compared: rollout correction" in out
    assert "agree: advantages, aggregation, policy loss, policy loss gradient on 2 batch(es) with signal; largest difference" in out


@needs_verl
def test_kl_loss_rollout_is_and_a_loss_scale_factor_agree(capsys):
    code, out, err = run(capsys, str(EXAMPLES / "verl_dapo.yaml"), A + "use_kl_loss=true", A + "kl_loss_coef=0.01",
                         A + "loss_agg_mode=seq-mean-token-sum-norm", A + "loss_scale_factor=32", "algorithm.adv_estimator=rloo",
                         "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=1.5",
                         "--batches", "1")
    assert code == 0, out + err
    assert "[kl] k3 vs kl_penalty('low_var_kl')" in out and "| KL loss gradient |" in out
    assert "compute_rollout_correction_weights('token')" in out and "compute_rloo_outcome_advantage" in out


@needs_verl
def test_a_wrong_mapping_is_caught(capsys, monkeypatch):
    # the import made to drop DAPO's clip-higher: rllab clips at 0.2 where verl clips at 0.28
    from rllab_referee import verl

    loss = verl._loss

    def lower(t, c):
        loss(t, c)
        t.values[("policy_loss", "clip_high")] = (0.2, "")

    monkeypatch.setattr(verl, "_loss", lower)
    code, out, err = run(capsys, str(EXAMPLES / "verl_dapo.yaml"), "--batches", "1")
    assert code == 1 and "DISAGREE on batch 0, policy loss" in out, out + err
