"""``rllab crosscheck trl``: the comparison and its report, careless inputs, and (with TRL installed)
rllab against TRL's GRPOTrainer on TRL's own batches, step for step."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from rllab.cli import main
from rllab_referee import crosscheck_report as report

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "frameworks"
HAS_TRL = importlib.util.find_spec("trl") is not None


def run(capsys, *argv):
    code = main(["--plugin", "rllab_referee", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------- the report


def test_rel_diff_by_hand():
    assert report.rel_diff(2.0, 2.5) == pytest.approx(0.5 / 2.5)
    assert report.rel_diff(0.0, 0.0) == 0.0
    assert report.rel_diff(1e-5, 2e-5, 1e-2) == pytest.approx(1e-5 / 1e-2)  # a loss near 0: its absolute error
    assert report.rel_diff(math.nan, math.nan) == 0.0 and report.rel_diff(1.0, math.nan) == math.inf


def test_first_disagreement_is_the_earliest_step_then_the_first_quantity():
    trl = {"grad_norm": [1.0, 2.0, 3.0], "lr": [1e-6, 1e-6, 1e-6], "weights": [0.1, 0.2, 0.3]}
    ours = {"grad_norm": [1.0, 2.0, 3.5], "lr": [1e-6, 1e-6, 1e-6], "weights": [0.1, 0.2, 0.3]}
    # the weights of step 1 are off by a distance measured between the two models
    rows = report.compare(trl, ours, distance={"weights": [0.0, 0.01, 0.0]})
    bad = report.first_disagreement(rows)
    assert (bad.step, bad.quantity) == (1, "weights") and bad.rel == pytest.approx(0.01 / 0.2)
    assert [(r.step, r.quantity) for r in rows if not r.ok] == [(1, "weights"), (2, "grad_norm")]
    text = report.verdict(rows)
    assert text.startswith("DISAGREE first at optimizer step 1, weights") and "5.00e-02" in text
    table = report.table(rows)
    assert table.splitlines()[0] == "| step | quantity | trl | rllab | rel diff | agrees |"
    assert "| 2 | grad_norm | 3 | 3.5 | 1.43e-01 | NO |" in table


def test_agreement_within_tolerance_and_unequal_lengths_refused():
    rows = report.compare({"grad_norm": [1.0, 2.0]}, {"grad_norm": [1.00001, 2.0]})
    assert report.first_disagreement(rows) is None and report.verdict(rows).startswith("agree: 2 optimizer steps")
    with pytest.raises(ValueError, match="grad_norm: 2 steps on the TRL side, 1 on rllab's"):
        report.compare({"grad_norm": [1.0, 2.0]}, {"grad_norm": [1.0]})


def test_rows_reordered_so_rllab_minibatches_are_trls():
    import torch

    from rllab_referee.stepcheck import permute_for_rllab
    from rllab.types import RolloutBatch

    B = 6
    batch = RolloutBatch(input_ids=torch.arange(B).reshape(B, 1).repeat(1, 3), attention_mask=torch.ones(B, 3, dtype=torch.bool),
                         response_mask=torch.ones(B, 2, dtype=torch.bool), rollout_log_prob=torch.zeros(B, 2),
                         index=torch.arange(B) // 2, rewards=torch.arange(B).float())
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    out = permute_for_rllab(batch, order)
    assert out.rewards[order].tolist() == batch.rewards.tolist()  # rllab's order[i] picks TRL's row i
    assert out.index[order].tolist() == batch.index.tolist()
    assert permute_for_rllab(batch, None) is batch


# --------------------------------------------------------------------------- careless inputs


def test_missing_config_and_a_verl_config_are_refused_by_name(capsys, tmp_path):
    code, _, err = run(capsys, "crosscheck", "trl", str(tmp_path / "nope.yaml"))
    assert code != 0 and "no file" in err and "nope.yaml" in err
    code, _, err = run(capsys, "crosscheck", "trl", str(EXAMPLES / "verl_dapo.yaml"))
    assert code != 0 and "looks like a verl config" in err and "rllab import verl" in err


@pytest.mark.parametrize("seeds, words", [("x", "not a whole number of seeds"), ("-2", "-2: the number of seeds must be at least 0")])
def test_bad_seeds_are_refused_by_the_parser(capsys, seeds, words):
    with pytest.raises(SystemExit):
        run(capsys, "crosscheck", "trl", str(EXAMPLES / "trl_grpo.yaml"), "--seeds", seeds)
    assert words in capsys.readouterr().err


def test_one_seed_is_refused_before_anything_runs(capsys):
    code, _, err = run(capsys, "crosscheck", "trl", str(EXAMPLES / "trl_grpo.yaml"), "--seeds", "1")
    assert code != 0 and "--seeds 1 gives no spread" in err


def test_trl_missing_says_how_to_install(capsys, monkeypatch):
    from rllab_referee import trl_capture

    monkeypatch.setattr(trl_capture, "trl_missing", lambda: "TRL is not installed; install it with:\n  " + trl_capture.INSTALL)
    code, _, err = run(capsys, "crosscheck", "trl", str(EXAMPLES / "trl_grpo.yaml"))
    assert code != 0 and "pip install --no-deps trl==1.16.0" in err and "--install-trl" in err


# --------------------------------------------------------------------------- against TRL


needs_trl = pytest.mark.skipif(not HAS_TRL, reason="TRL is not installed (pip install --no-deps trl==1.16.0, or the 'trl' extra)")


def _agrees(capsys, tmp_path, yaml: str, optimizer_steps: int, generations: int = 2) -> None:
    """``rllab crosscheck trl`` of the TRL config ``yaml`` agrees over that many optimizer steps."""
    src = tmp_path / "trl.yaml"
    src.write_text(yaml)
    code, out, err = run(capsys, "crosscheck", "trl", str(src), "--steps", str(generations))
    assert code == 0 and f"agree: {optimizer_steps} optimizer steps" in out, out + err[-2000:]


@needs_trl
def test_default_trl_config_agrees_step_for_step(capsys):
    code, out, err = run(capsys, "crosscheck", "trl", str(EXAMPLES / "trl_grpo.yaml"), "--steps", "2")
    assert "| 1 | weights |" in out, err[-2000:]
    assert code == 0 and "agree: 2 optimizer steps" in out, out


@needs_trl
@pytest.mark.slow
def test_several_optimizer_steps_per_generation_agree_with_a_decaying_lr(capsys, tmp_path):
    # GSPO: steps_per_generation 4 (2 optimizer steps per generation with gradient accumulation 2),
    # TRL's default linear schedule moving every optimizer step
    _agrees(capsys, tmp_path, (EXAMPLES / "trl_gspo.yaml").read_text().replace("gradient_accumulation_steps: 1", "gradient_accumulation_steps: 2"), 4)


def test_the_import_follows_trls_split_normaliser_and_schedule():
    from rllab_referee import trl

    def v(**knobs):
        t = trl.translate(knobs)
        t.finish()
        return {k: val for k, (val, _) in t.values.items()}, t.differs

    got, differs = v(num_iterations=2, steps_per_generation=2)  # TRL's default loss_type: dapo
    assert got["algorithm", "minibatch_order"] == "once" and got["algorithm", "token_count"] == "batch_mean"
    assert got["train", "lr_schedule_unit"] == "optimizer_step" and not differs
    got, _ = v(num_iterations=2, steps_per_generation=2, loss_type="grpo", max_steps=12)
    assert ("algorithm", "token_count") not in got and got["train", "lr_schedule_steps"] == 12
    got, _ = v(num_iterations=2)  # one optimizer step per generation: nothing to split
    assert ("algorithm", "minibatch_order") not in got


@needs_trl
@pytest.mark.slow
def test_dapo_over_several_optimizer_steps_and_iterations_agrees(capsys, tmp_path):
    # TRL's dapo loss divides every optimizer step by the batch's average tokens per step
    # (algorithm.token_count = "batch_mean") and keeps one split over its iterations
    # (algorithm.minibatch_order = "once"); cosine schedule per optimizer step
    _agrees(capsys, tmp_path, "loss_type: dapo\ngradient_accumulation_steps: 2\nsteps_per_generation: 4\nper_device_train_batch_size: 8\n"
            "num_generations: 4\nmax_completion_length: 8\nnum_iterations: 2\nlr_scheduler_type: cosine\nlearning_rate: 1.0e-5\n", 8)


@needs_trl
def test_a_real_difference_is_reported_as_the_first_step_and_quantity(capsys, tmp_path, monkeypatch):
    # the import made to leave rllab's token-mean normaliser (each minibatch's own tokens) where
    # TRL's dapo loss divides by the batch's average tokens per step: the gradients differ at once
    from rllab_referee import trl

    loss = trl._loss

    def own_tokens(t, *a, **k):
        loss(t, *a, **k)
        t.values.pop(("algorithm", "token_count"), None)

    monkeypatch.setattr(trl, "_loss", own_tokens)
    src = tmp_path / "dapo.yaml"
    src.write_text("loss_type: dapo\ngradient_accumulation_steps: 2\nsteps_per_generation: 4\nper_device_train_batch_size: 8\n"
                   "num_generations: 4\nmax_completion_length: 8\nlr_scheduler_type: constant\n")
    code, out, err = run(capsys, "crosscheck", "trl", str(src), "--steps", "1")
    assert code == 1, out + err[-2000:]
    assert "DISAGREE first at optimizer step 0, loss" in out or "DISAGREE first at optimizer step 0, grad_norm" in out, out
    assert "| 0 | grad_norm |" in out and "| NO |" in out


def test_a_vllm_config_is_refused_and_forced_knobs_are_named(capsys, tmp_path, monkeypatch):
    src = tmp_path / "vllm.yaml"
    src.write_text("use_vllm: true\n")
    code, _, err = run(capsys, "crosscheck", "trl", str(src))
    assert code != 0 and "use_vllm = true" in err and "set use_vllm: false" in err
    from rllab_referee import trl_capture

    monkeypatch.setattr(trl_capture, "trl_missing", lambda: "TRL is not installed")
    src.write_text("bf16: true\nreport_to: wandb\n")
    code, _, err = run(capsys, "crosscheck", "trl", str(src))
    assert "bf16 = True → False" in err and "report_to = 'wandb' → []" in err


def test_trl_throughput_counts_a_generation_batchs_optimizer_steps_together():
    # steps_per_generation 4: the first optimizer step of each batch samples it, the other three
    # train on it; one rllab step is all four
    from rllab_referee.trl_capture import TrlRun

    run = TrlRun(generations=[], losses=[], grad_norms=[], lrs=[], weights=[], rewards=[], completions_per_step=32, wall_s=0.0,
                 step_times=[4.0, 1.0, 1.0, 1.0, 3.0, 1.0, 1.0, 1.0], steps_per_generation=4)
    assert run.generation_times == [7.0, 6.0]
    assert TrlRun(generations=[], losses=[], grad_norms=[], lrs=[], weights=[], rewards=[], completions_per_step=8, wall_s=0.0,
                  step_times=[2.0, 1.0]).generation_times == [2.0, 1.0]


@needs_trl
def test_a_kl_term_and_an_entropy_bonus_agree(capsys, tmp_path):
    # beta > 0: TRL's reference is the initial model (rllab's side gets one too); entropy_coef: TRL's
    # per-micro-batch token mean (algorithm.entropy_mean = "micro_batch"); the loss compared is the one
    # backpropagated, with both terms
    _agrees(capsys, tmp_path, "loss_type: grpo\nbeta: 0.04\nentropy_coef: 0.05\ngradient_accumulation_steps: 2\nsteps_per_generation: 4\n"
            "per_device_train_batch_size: 4\nnum_generations: 4\nmax_completion_length: 8\nlearning_rate: 1.0e-5\n", 4)


@needs_trl
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "bnpo", "dr_grpo", "cispo", "sapo", "vespo", "luspo"])
def test_every_loss_type_agrees_over_iterations_and_minibatches(capsys, tmp_path, loss_type):
    _agrees(capsys, tmp_path, f"loss_type: {loss_type}\nsteps_per_generation: 2\nnum_iterations: 2\nmax_completion_length: 8\n"
            "learning_rate: 1.0e-5\n", 8)


# --------------------------------------------------------------------------- signal


def test_group_signal_counts_groups_whose_rewards_differ():
    assert report.group_signal([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], [7, 7, 8, 8, 9, 9]) == (3, 1)
    assert report.group_signal([0.5, 0.5], [1, 1]) == (1, 0)


def test_a_step_without_signal_is_never_agreement():
    # step 0: every group's rewards equal (TRL's gradient exactly 0, rllab's 1.5e-9: a "disagreement" over noise)
    rows = report.compare({"grad_norm": [0.0, 2.0]}, {"grad_norm": [1.5e-9, 2.00001]})
    rows = report.with_signal(rows, [False, True])
    assert report.first_disagreement(rows) is None and report.status(rows) == report.NO_SIGNAL_EXIT
    assert report.verdict(rows).startswith("no signal on optimizer step(s) 0") and "the other 1 agree" in report.verdict(rows)
    assert "| 0 | grad_norm | 0 | 1.5e-09 | 1.00e+00 | no signal |" in report.table(rows)
    none = report.with_signal(rows, [False, False])
    assert report.status(none) == report.NO_SIGNAL_EXIT and report.verdict(none).startswith("no signal: in none of the 2")
    # two optimizer steps per batch: batch 1's signal covers steps 2 and 3
    rows = report.with_signal(report.compare({"lr": [1.0] * 4}, {"lr": [1.0] * 4}), [False, True], per=2)
    assert [r.signal for r in rows] == [False, False, True, True]
    assert report.status(report.with_signal(rows, [True, True], per=2)) == 0


def test_a_disagreement_with_signal_still_fails_with_status_1():
    rows = report.with_signal(report.compare({"grad_norm": [1.0, 2.0]}, {"grad_norm": [1.0, 3.0]}), [False, True])
    assert report.status(rows) == 1 and report.verdict(rows).startswith("DISAGREE first at optimizer step 1")


def test_the_grad_norm_is_measured_as_trl_measures_it():
    # the one-sided gap: torch's float32 norm of one long concatenated vector comes out low (its
    # accumulated rounding), while clip_grad_norm_'s per-tensor norms (TRL's logged value) do not
    import torch

    from rllab_referee.stepcheck import grad_norm

    x = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0)) * 1e-3
    exact = float(x.double().norm())
    assert float(x.norm()) / exact - 1 < -1e-5  # low by ≈ 2.6e-5: the size of the gap
    parts = list(x.split(65536))
    assert abs(grad_norm(parts) / exact - 1) < 1e-6
    assert grad_norm([]) == 0.0


def _fake_setup(monkeypatch, live: list[int]):
    """crosscheck's TRL/rllab runs replaced: each seed's batches have ``live[i]`` groups (of 2) with signal."""
    from rllab_referee import crosscheck, trl_capture

    monkeypatch.setattr(trl_capture, "trl_missing", lambda: None)
    from types import SimpleNamespace

    cfg = SimpleNamespace(rollout=SimpleNamespace(prompts_per_step=1))
    monkeypatch.setattr(crosscheck, "_setup", lambda raw, name, lab, steps: (None, cfg, None, None))
    monkeypatch.setattr(crosscheck, "signal_prompts", lambda *a, **k: [])
    calls = []

    def step_check(raw, cfg, task, model_dir, lab, *, steps, workdir, examples=None):
        n = live[len(calls)]
        calls.append(raw["seed"])
        summary = [{"reward": 0.0, "groups": 2, "live": n, "trl_loss": 0.0, "rllab_loss": 0.0, "trl_grad_norm": [0.0],
                    "rllab_grad_norm": [1.5e-9]}]
        rows = report.with_signal(report.compare({"grad_norm": [0.0]}, {"grad_norm": [1.5e-9 if not n else 0.0]}), [n > 0])
        return rows, None, summary

    monkeypatch.setattr(crosscheck, "step_check", step_check)
    return calls


def test_no_signal_seeks_other_seeds_then_fails(capsys, tmp_path, monkeypatch):
    calls = _fake_setup(monkeypatch, [0, 0, 0])
    src = tmp_path / "c.yaml"
    src.write_text("seed: 7\nloss_type: grpo\nbeta: 0.04\nnum_generations: 4\nper_device_train_batch_size: 8\nmax_completion_length: 8\n")
    code, out, err = run(capsys, "crosscheck", "trl", str(src), "--steps", "1")
    assert calls == [7, 8, 9] and "trying seed 8" in err and "trying seed 9" in err
    assert code == report.NO_SIGNAL_EXIT and "no signal: in none of the 1" in out and "agree:" not in out
    assert "| 0 | 0.000 | 0/2 (0%) |" in out


def test_the_first_seed_with_signal_is_compared(capsys, tmp_path, monkeypatch):
    calls = _fake_setup(monkeypatch, [0, 1, 2])
    code, out, _ = run(capsys, "crosscheck", "trl", str(EXAMPLES / "trl_grpo.yaml"), "--steps", "1", "--tries", "5")
    assert calls == [42, 43] and code == 0 and "at seed 43" in out and "| 0 | 0.000 | 1/2 (50%) |" in out
    assert "agree: 1 optimizer steps with signal" in out


@pytest.mark.parametrize("yaml, words", [
    ("num_generations: 3\n", "num_generations"),
    ("generation_batch_size: 16\nsteps_per_generation: 2\n", "generation_batch_size"),
    ("max_completion_lenght: 8\n", "did you mean 'max_completion_length'"),
])
def test_a_config_trl_refuses_gets_the_importers_message(capsys, tmp_path, monkeypatch, yaml, words):
    # the importer's checks run before anything of TRL's is built (or TRL is even looked for)
    from rllab_referee import trl_capture

    monkeypatch.setattr(trl_capture, "trl_missing", lambda: "TRL is not installed")
    src = tmp_path / "c.yaml"
    src.write_text(yaml)
    code, out, err = run(capsys, "crosscheck", "trl", str(src))
    assert code != 0 and "cannot be reproduced by rllab" in err and words in err and "Traceback" not in err + out
    assert "TRL is not installed" not in err


@needs_trl
def test_a_config_with_a_seed_runs_and_shows_its_signal(capsys, tmp_path):
    src = tmp_path / "seeded.yaml"
    src.write_text("seed: 7\nloss_type: grpo\nnum_generations: 4\nper_device_train_batch_size: 8\nmax_completion_length: 8\n")
    code, out, err = run(capsys, "crosscheck", "trl", str(src), "--steps", "1")
    assert "| batch | mean reward | groups with signal |" in out, err[-2000:]
    assert code == 0 and "at seed 7" in out and "agree: 1 optimizer steps with signal" in out, out + err[-2000:]


@needs_trl
def test_a_batch_without_signal_is_reported_with_a_kl_term(capsys, tmp_path, monkeypatch):
    # every reward 0: every advantage 0; with beta > 0 TRL's gradient is exactly 0 and rllab's rounding
    from rllab_referee import crosscheck

    setup = crosscheck._setup

    def zero_reward(*a, **k):
        data, cfg, task, model_dir = setup(*a, **k)
        monkeypatch.setattr(task, "reward", lambda example, text: 0.0)
        return data, cfg, task, model_dir

    monkeypatch.setattr(crosscheck, "_setup", zero_reward)
    src = tmp_path / "kl.yaml"
    src.write_text("loss_type: grpo\nbeta: 0.04\nnum_generations: 4\nper_device_train_batch_size: 8\nmax_completion_length: 8\n")
    code, out, err = run(capsys, "crosscheck", "trl", str(src), "--steps", "1", "--tries", "1")
    assert code == report.NO_SIGNAL_EXIT and "no signal: in none of the 1" in out and "agree:" not in out, out + err[-2000:]


@needs_trl
def test_an_optimizer_step_over_several_generation_batches_agrees(capsys, tmp_path):
    # steps_per_generation 2 < gradient_accumulation_steps 4: each optimizer step takes 2 generation
    # batches (one rllab step of both); grpo's row mean makes it exact
    _agrees(capsys, tmp_path, "loss_type: grpo\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 4\nsteps_per_generation: 2\n"
            "num_generations: 4\nmax_completion_length: 8\nlearning_rate: 1.0e-5\n", 2)


@needs_trl
def test_masked_truncated_completions_agree(capsys, tmp_path):
    # completions cut at 4 tokens are out of TRL's loss and token count; the rows stay in their groups
    _agrees(capsys, tmp_path, "loss_type: dapo\nmask_truncated_completions: true\nper_device_train_batch_size: 16\nnum_generations: 8\n"
            "max_completion_length: 4\nlearning_rate: 1.0e-5\n", 2)


@needs_trl
def test_a_check_only_trl_makes_is_reported_without_a_traceback(capsys, tmp_path):
    # the importer ignores the Hub repository (logging); TRL's GRPOConfig refuses it without log_completions
    src = tmp_path / "hub.yaml"
    src.write_text("log_completions_hub_repo: me/x\nmax_completion_length: 8\n")
    code, out, err = run(capsys, "crosscheck", "trl", str(src), "--steps", "1")
    assert code != 0 and "TRL's GRPOConfig refuses this config: log_completions_hub_repo is set" in err
    assert "Traceback" not in err
