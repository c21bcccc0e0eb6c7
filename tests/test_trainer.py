"""The training loop end to end on a tiny model: metrics, invariants, trouble, resume."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import types

import attrs
import pytest
import torch

import rllab
from rllab.config import ConfigError, load_config, preset_names
from rllab.training.trainer import RewardError, Trainer, run_experiment

from .tiny import TINY, overrides

# A small, fast setup shared by these tests (the tiny model is built and cached once per module).
SMALL = [*overrides(TINY), "train.steps=3"]


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def small_cfg(*extra, lab=None, preset=None):
    return load_config(None, [*SMALL, *extra], lab=lab, preset=preset)


def finite_metrics(m: dict) -> None:
    bad = {k: v for k, v in m.items() if isinstance(v, float) and not math.isfinite(v)}
    assert not bad, bad


def test_step_metrics_and_first_minibatch_is_on_policy(tmp_path):
    tr = Trainer(small_cfg("algorithm.epochs=2", "algorithm.minibatches=2"), run_dir=tmp_path, progress=False)
    m = tr.train_step()
    finite_metrics(m)
    for key in ("time/rollout", "time/reward", "time/forward", "time/update", "time/sync", "perf/peak_rss_mb", "rollout/reward", "actor/clipfrac", "loss/policy"):
        assert key in m, key
    # the first minibatch of the first epoch sees exactly the rollout-time policy
    assert m["actor/first_approx_kl"] == 0.0 and m["actor/first_clipfrac"] == 0.0
    tr.close()


@pytest.mark.parametrize(
    "extra",
    [["aggregation=seq-mean-token-mean"], ["policy_loss=geo_mean"], ["aggregation=seq-mean-token-sum", "aggregation.count_empty_rows=true"]],
    ids=["seq-mean-token-mean", "geo_mean-reduces-itself", "count-empty-rows"],
)
def test_micro_batches_do_not_change_the_gradient(tmp_path, extra):
    from functools import partial

    from rllab_algorithms.rl import Prepared, _aggregate, _logprobs

    tr = Trainer(small_cfg("algorithm.entropy_coef=0.01", *extra), run_dir=tmp_path, progress=False)
    ctx = tr.context()
    batch = tr.rollout.to_batch(tr.rollout.sample(0))
    with torch.no_grad():
        old = _logprobs(ctx, tr.policy, batch)
    adv, ret = tr.components["advantage"](token_rewards=batch.token_rewards, mask=batch.response_mask, index=batch.index)
    adv = adv + 0.1 * torch.randn_like(adv)  # make every token matter
    mask = batch.response_mask
    prepared = Prepared(batch=batch, old_log_prob=old, ref_log_prob=None, values=None, advantages=adv, returns=ret, weights=torch.ones_like(adv), beta=0.0)
    counts = {"global_tokens": int(mask.sum()), "global_seqs": int(mask.any(-1).sum())}
    if "global_rows" in tr.components["aggregation"].spec.requires:
        counts["global_rows"] = mask.shape[0]
    agg = partial(_aggregate, tr.components["aggregation"], **counts)
    params = [p for p in tr.policy.parameters() if p.requires_grad]

    def grads(splits):
        tr.policy.zero_grad(set_to_none=True)
        for rows in splits:
            tr.algorithm.micro_loss(ctx, prepared, rows, agg)
        return [p.grad.clone() for p in params]

    whole = grads([torch.arange(batch.input_ids.shape[0])])
    split = grads(torch.arange(batch.input_ids.shape[0]).split(3))
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    tr.close()


def test_run_directory_contents(tmp_path):
    cfg = small_cfg("train.steps=2", "train.checkpoint_every=1", 'loggers=["jsonl", "tensorboard"]')
    summary = run_experiment(cfg, run_dir=tmp_path / "run", progress=False)
    run = tmp_path / "run"
    for name in ("config.toml", "metrics.jsonl", "final.json", "curves.png"):
        assert (run / name).is_file(), name
    assert (run / "tensorboard").is_dir()
    assert (run / "checkpoints" / "latest").read_text() == "step_000002"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # steps count completed steps: eval before training is step 0, the row of the k-th step is k,
    # and the eval and checkpoint after it carry k too
    assert rows[0]["step"] == 0 and "eval/accuracy" in rows[0]
    assert rows[-1]["step"] == 2 and "eval/accuracy" in rows[-1]
    assert [r["step"] for r in rows if "rollout/reward" in r] == [1, 2]
    assert {r["step"] for r in rows} == {0, 1, 2}
    assert 0.0 <= summary["final/accuracy"] <= 1.0
    # the resolved config reloads to the same experiment
    again = load_config(run / "config.toml")
    assert again.to_dict() == cfg.to_dict()


def _strip(rows):
    """Metrics that must be reproducible: everything but timings and memory."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


def test_kill_9_then_resume_matches_uninterrupted_run(tmp_path, capsys):
    from rllab.cli import main

    # the uninterrupted run and the resume in this process (rllab.cli.main); the run killed is a process
    # of its own. One thread in both (OMP_NUM_THREADS=1 is the child's): the same arithmetic.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = [*SMALL, "train.steps=8", "train.checkpoint_every=2", "train.seed=3"]
    cmd = [sys.executable, "-m", "rllab.cli", "run", *args, "-q"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _kill_9_then_resume(tmp_path, args, cmd, env, capsys, main)
    finally:
        torch.set_num_threads(threads)


def _kill_9_then_resume(tmp_path, args, cmd, env, capsys, main):
    assert main(["run", *args, "-q", "--run-dir", str(tmp_path / "full")]) == 0, capsys.readouterr().err

    run = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--run-dir", str(run)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run / "checkpoints" / "step_000004" / "state.pt").exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run / "final.json").exists(), "the run finished before the kill"

    assert main(["run", "--resume", str(run), "-q"]) == 0, capsys.readouterr().err
    a = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == [r["step"] for r in a]
    assert _strip(b) == _strip(a)


# --------------------------------------------------------------------------- trouble


@attrs.frozen
class OneTaskConfig:
    mode: str = rllab.knob("nan", help="nan, raise, const")


class ToyTask:
    """'1+1=' style prompts; the reward misbehaves on demand."""

    def __init__(self, mode):
        self.mode = mode

    def train_examples(self, n, rng):
        a = torch.randint(0, 10, (n,), generator=rng).tolist()
        return [rllab.Example(prompt=f"{x}+1=", answer=str(x + 1)) for x in a]

    def eval_examples(self):
        return [rllab.Example(prompt=f"{x}+1=", answer=str(x + 1)) for x in range(10)]

    def demonstration(self, ex):
        return ex.answer

    def reward(self, ex, completion):
        if self.mode == "const":
            return 0.5
        if completion.startswith("1") or len(completion) % 2 == 0:
            if self.mode == "raise":
                raise ZeroDivisionError("bad reward")
            return float("nan")
        return 1.0 if completion == ex.answer else 0.0


class EmptyBackend:
    """Wraps the real backend and empties every third completion, as an aborted request would."""

    def __init__(self, inner):
        self.inner = inner

    def generate(self, prompts, params):
        out = self.inner.generate(prompts, params)
        return [attrs.evolve(c, token_ids=(), log_probs=(), finish_reason="abort") if i % 3 == 0 else c for i, c in enumerate(out)]

    def last_metrics(self):
        return self.inner.last_metrics()

    def update_weights(self, model):
        return self.inner.update_weights(model)

    def close(self):
        self.inner.close()


def trouble_plugin():
    mod = types.ModuleType("trouble_plugin")

    @rllab.hookimpl
    def register_tasks(register):
        register("toy_trouble", lambda *, config: ToyTask(config.mode), config=OneTaskConfig)

    @rllab.hookimpl
    def register_rollout_backends(register):
        def factory(*, config):
            return EmptyBackend(rllab.Lab().get("rollout_backend", "hf")())

        register("empty_sometimes", factory)

    mod.register_tasks = register_tasks
    mod.register_rollout_backends = register_rollout_backends
    return mod


@pytest.fixture(scope="module")
def trouble_lab():
    return rllab.Lab([trouble_plugin()])


def test_nan_reward_raises_naming_prompt_and_completion(tmp_path, trouble_lab):
    cfg = small_cfg("task=toy_trouble", "model.warm_start.steps=0", lab=trouble_lab)
    tr = Trainer(cfg, lab=trouble_lab, run_dir=tmp_path, progress=False)
    with pytest.raises(RewardError) as e:
        for _ in range(3):
            tr.train_step()
    msg = str(e.value)
    assert "toy_trouble" in msg and "on prompt '" in msg and "with completion '" in msg and "reward_errors" in msg
    tr.close()


@pytest.mark.parametrize("policy", ["zero", "skip"])
def test_bad_rewards_can_be_zeroed_or_skipped(tmp_path, trouble_lab, policy):
    cfg = small_cfg("task=toy_trouble", "task.mode=raise", "model.warm_start.steps=0", f"rollout.reward_errors={policy}", lab=trouble_lab)
    tr = Trainer(cfg, lab=trouble_lab, run_dir=tmp_path, progress=False)
    ms = [tr.train_step() for _ in range(3)]
    for m in ms:
        finite_metrics(m)
    assert sum(m["rollout/reward_errors"] for m in ms) > 0
    if policy == "skip":
        assert min(m["rollout/kept_frac"] for m in ms) < 1.0
    tr.close()


def test_all_filtered_batch_is_skipped_and_reported(tmp_path, trouble_lab):
    cfg = small_cfg("task=toy_trouble", "task.mode=const", "model.warm_start.steps=0", "rollout.dynamic_sampling=true", lab=trouble_lab)
    tr = Trainer(cfg, lab=trouble_lab, run_dir=tmp_path, progress=False)
    before = [p.clone() for p in tr.policy.parameters()]
    m = tr.train_step()
    assert m["train/skipped"] == 1.0 and m["rollout/kept_frac"] == 0.0
    finite_metrics(m)
    assert all(torch.equal(a, b) for a, b in zip(before, tr.policy.parameters()))
    tr.close()


def test_empty_completions_train_without_nan(tmp_path, trouble_lab):
    cfg = small_cfg("backend=empty_sometimes", lab=trouble_lab)
    tr = Trainer(cfg, lab=trouble_lab, run_dir=tmp_path, progress=False)
    m = tr.train_step()
    finite_metrics(m)
    assert m["rollout/empty_frac"] > 0
    assert all(torch.isfinite(p).all() for p in tr.policy.parameters())
    tr.close()


def test_bad_config_fails_before_any_model_loads(tmp_path, monkeypatch, capsys):
    from rllab.cli import main

    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path / "cache"))
    for bad in (["advantage=nope"], ["policy_loss.clip_c=0.5"], ["model.tiny.hidden_size=2"], ["train.lr=-1"]):
        code = main(["run", *bad, "--run-dir", str(tmp_path / "r"), "-q"])
        err = capsys.readouterr().err
        assert code == 1, (bad, err)
        assert "error:" in err
        assert not (tmp_path / "cache").exists() and not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- swapping


def test_schedule_and_python_swap(tmp_path):
    lab = rllab.Lab()
    cfg = load_config({"schedule": [{"step": 1, "set": {"policy_loss": "cispo", "algorithm.entropy_coef": 0.01}}]}, SMALL, lab=lab)
    tr = Trainer(cfg, lab=lab, run_dir=tmp_path, progress=False)
    tr.train_step()
    assert tr.components["policy_loss"].name == "ppo_clip"
    m = tr.train_step()
    assert tr.components["policy_loss"].name == "cispo" and tr.algorithm.config.entropy_coef == 0.01 and m["schedule/changed"] == 1.0
    assert "loss/entropy" in m
    tr.swap("policy_loss", "ppo_dual_clip", clip_c=4.0)
    tr.swap("advantage", "rloo")
    tr.train_step()
    assert tr.components["policy_loss"].config.clip_c == 4.0 and tr.components["advantage"].name == "rloo"
    with pytest.raises(ConfigError):
        tr.swap("policy_loss", "ppo_dual_clip", clip_c=0.5)
    tr.close()


PRESET_EXTRAS = {"dpo": ["algorithm.pairs=16", "algorithm.batch_size=8"]}


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_trains_two_steps(tmp_path, preset):
    cfg = small_cfg("train.steps=2", *PRESET_EXTRAS.get(preset, []), preset=preset)
    tr = Trainer(cfg, run_dir=tmp_path, progress=False)
    for _ in range(2):
        m = tr.train_step()
        finite_metrics(m)
    if preset == "ppo":
        assert tr.critic is not None and "loss/value" in m
    tr.close()


def test_online_dpo_skips_groups_with_failed_rewards(tmp_path, trouble_lab):
    cfg = small_cfg("task=toy_trouble", "task.mode=raise", "model.warm_start.steps=0", "rollout.reward_errors=skip", lab=trouble_lab, preset="online_dpo")
    tr = Trainer(cfg, lab=trouble_lab, run_dir=tmp_path, progress=False)
    seen = []
    sample, pair = tr.rollout.sample, tr.algorithm.pairs_from

    def spy_sample(step, **kw):
        out = sample(step, **kw)
        failed = {c.prompt_index for c, e in zip(out.completions, [e.reward for e in out.episodes]) if not e and c.prompt_index not in ()}
        seen.append({"failed": {c.prompt_index for c, k in zip(out.completions, out.keep.tolist()) if not k}, "all": failed})
        return out

    def spy_pair(ctx, scored):
        out = pair(ctx, scored)
        seen[-1]["paired_from"] = {g for g, _ in out[0]}
        return out

    tr.rollout.sample, tr.algorithm.pairs_from = spy_sample, spy_pair
    ms = [tr.train_step() for _ in range(3)]
    for m in ms:
        finite_metrics(m)
    assert sum(m["rollout/reward_errors"] for m in ms) > 0, "the toy reward never failed; the test checks nothing"
    for s in seen:  # a group with a failed sample contributes no pair
        assert not (s["failed"] & s.get("paired_from", set())), s
    tr.close()


@pytest.mark.parametrize(
    "loss",
    [
        ["preference_loss=mpo", "preference_loss.ld_alpha=0.5", "preference_loss.use_weighting=true"],
        ["preference_loss=bco_pair", "preference_loss.running_mean=true"],
    ],
    ids=["mpo-ld-wpo", "bco-running-mean"],
)
def test_preference_losses_with_token_level_inputs_train(tmp_path, loss):
    """The dpo algorithm passes the optional inputs a loss requires (token log-probs, WPO's
    log Σπ², bco's running mean) and carries bco's state across steps and checkpoints."""
    cfg = small_cfg("train.steps=2", *PRESET_EXTRAS["dpo"], *loss, preset="dpo")
    tr = Trainer(cfg, run_dir=tmp_path, progress=False)
    ms = [tr.train_step() for _ in range(2)]
    for m in ms:
        finite_metrics(m)
    if "bco_pair" in loss[0]:
        assert ms[1]["bco/reward_count"] > ms[0]["bco/reward_count"] > 0
        path = tr.save_checkpoint()
        tr2 = Trainer(cfg, run_dir=tmp_path / "again", progress=False)
        tr2.load_checkpoint(path)
        assert float(tr2.algorithm.bco["bco_reward_count"]) == ms[1]["bco/reward_count"]
        tr2.close()
    tr.close()


@pytest.mark.parametrize(
    "extra",
    [
        ["policy_loss=bypass_mode"],
        ["policy_loss=ppo_clip", "policy_loss.off_policy_mask_threshold=0.5"],
        ["correction=rejection", "correction.criterion=token_k1", "correction.upper=2.0"],
    ],
    ids=["bypass", "off-policy-mask", "rejection"],
)
def test_variant_components_train(tmp_path, extra):
    """Components that need more than the defaults from the step (the rollout log-probs as the
    old policy, the rollout log-probs beside it) get it."""
    tr = Trainer(small_cfg(*extra), run_dir=tmp_path, progress=False)
    for _ in range(2):
        finite_metrics(tr.train_step())
    tr.close()


def test_bypass_with_a_correction_is_refused(tmp_path):
    with pytest.raises(rllab.RllabError, match="bypass mode.*set correction = \"none\""):
        Trainer(small_cfg("policy_loss=bypass_mode", "correction=token_truncate"), run_dir=tmp_path, progress=False)


def test_kl_options_reach_the_step_and_the_controller(tmp_path):
    tr = Trainer(
        small_cfg("algorithm.kl_in=reward", "algorithm.kl_measure=penalty_row_mean", "kl_controller=adaptive", "kl=k3"),
        run_dir=tmp_path, progress=False,
    )  # fmt: skip
    beta0 = tr.kl_controller.value
    m = tr.train_step()
    assert "kl/current" in m and m["kl/coef"] == beta0 and tr.kl_controller.value != beta0
    tr.close()
    tr = Trainer(small_cfg("algorithm.kl_in=loss", "algorithm.kl_importance_ratio=sequence", "kl_controller.kl_coef=0.1"), run_dir=tmp_path / "b", progress=False)
    finite_metrics(tr.train_step())
    tr.close()


def test_remax_step_samples_a_greedy_baseline_per_prompt(tmp_path):
    tr = Trainer(small_cfg("advantage=remax"), run_dir=tmp_path, progress=False)
    seen = {}
    greedy = tr.rollout.greedy_rewards

    def spy(examples):
        out = greedy(examples)
        seen["baselines"] = out
        return out

    tr.rollout.greedy_rewards = spy
    m = tr.train_step()
    finite_metrics(m)
    assert seen["baselines"].shape == (4,) and m["rollout/greedy_reward"] == pytest.approx(seen["baselines"].mean().item())
    tr.close()


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_optimal_token_baselines_get_the_rollout_time_policy(tmp_path, estimator):
    """They need old log-probs and Σπ² before the update: the step runs the old forward for them."""
    tr = Trainer(small_cfg(f"advantage={estimator}"), run_dir=tmp_path, progress=False)
    assert not tr.algorithm.on_policy(tr.context())
    for _ in range(2):
        finite_metrics(tr.train_step())
    tr.close()


def test_rejection_narrows_the_step_mask_and_its_global_counts(tmp_path, monkeypatch):
    """Rejected tokens leave the mask the update trains on and the aggregation's global counts
    (verl's modified response mask); ``narrow_mask = "off"`` keeps them in the normaliser."""
    for narrow in ("after_advantage", "off"):
        tr = Trainer(
            small_cfg("correction=rejection", "correction.criterion=token_k1", "correction.upper=1.5",
                      f"correction.narrow_mask={narrow}", "algorithm.micro_batch_size=5"),
            run_dir=tmp_path / narrow, progress=False,
        )  # fmt: skip
        to_batch = tr.rollout.to_batch

        def perturbed(scored):  # every other token looks far likelier to the sampler: rejected
            b = to_batch(scored)
            shift = torch.zeros_like(b.rollout_log_prob)
            shift[:, ::2] = 1.0
            return attrs.evolve(b, rollout_log_prob=torch.where(b.response_mask, b.rollout_log_prob + shift, 0.0))

        monkeypatch.setattr(tr.rollout, "to_batch", perturbed)
        seen = []
        micro_loss = tr.algorithm.micro_loss
        monkeypatch.setattr(
            tr.algorithm, "micro_loss", lambda ctx, p, rows, agg: seen.append((p, dict(agg.keywords))) or micro_loss(ctx, p, rows, agg)
        )
        m = tr.train_step()
        finite_metrics(m)
        p, counts = seen[0]
        sampled = p.batch.response_mask
        assert len(seen) > 1  # micro-batched: the counts are the minibatch's
        if narrow == "off":
            assert torch.equal(p.mask, sampled) and counts["global_tokens"] == int(sampled.sum())
            assert m["tis/rs_masked_frac"] > 0
        else:
            assert p.old_log_prob is not None, "a narrowing correction runs the old-log-prob forward"
            corr = tr.components["correction"]
            keep = corr.trait("keep_mask")(old_log_prob=p.old_log_prob, rollout_log_prob=p.batch.rollout_log_prob,
                                           mask=sampled, config=corr.config)
            assert torch.equal(p.mask, sampled & keep)
            assert counts["global_tokens"] == int(p.mask.sum()) < int(sampled.sum())
            assert counts["global_seqs"] == int(p.mask.any(-1).sum())
            assert 0 < m["train/kept_token_frac"] < 1
        tr.close()


def test_a_multi_component_task_batch_carries_its_components(tmp_path):
    tr = Trainer(small_cfg("task.format_weight=0.25"), run_dir=tmp_path, progress=False)
    scored = tr.rollout.sample(0)
    batch = tr.rollout.to_batch(scored)
    kept = [c for c, k in zip(scored.completions, scored.keep.tolist()) if k]
    expected = [tr.rollout.task.reward(scored.examples[c.prompt_index], tr.rollout.decode(c)) for c in kept]
    assert batch.reward_component_names == ("correct", "format")
    assert batch.reward_components.shape == (len(kept), 2) and batch.reward_components.dtype == torch.float32
    assert batch.reward_components.tolist() == [[e["correct"], e["format"]] for e in expected]
    torch.testing.assert_close(batch.rewards, batch.reward_components @ torch.tensor([1.0, 0.25]))
    assert scored.metrics["reward/correct"] == pytest.approx(sum(e.score[0] for e in scored.episodes) / len(scored.episodes))
    assert "reward/format" in scored.metrics
    sub = batch.select(torch.tensor([2, 0]))
    assert torch.equal(sub.reward_components, batch.reward_components[[2, 0]])
    tr.close()


def test_gdpo_trains_on_a_multi_component_task(tmp_path, monkeypatch):
    tr = Trainer(small_cfg("advantage=gdpo", "task.format_weight=0.1", "advantage.reward_weights=[1.0, 0.5]"),
                 run_dir=tmp_path, progress=False)
    seen = {}
    est = tr.components["advantage"]
    call = type(est).__call__
    monkeypatch.setattr(type(est), "__call__", lambda self, **kw: seen.update(kw) or call(self, **kw))
    for _ in range(2):
        m = tr.train_step()
        finite_metrics(m)
    assert seen["reward_components"].shape[1] == 2
    assert {"reward/correct", "reward/format", "loss/policy"} <= set(m)
    tr.close()


@pytest.mark.parametrize("explicit", [None, (1.0, 1.0)])
def test_gdpo_weights_components_as_the_task_scores_them(tmp_path, monkeypatch, explicit):
    """Class: a knob that does nothing. `advantage=gdpo task.format_weight=0.1` must weight the
    normalised components (1, 0.1) — the task's scalar reward — unless `advantage.reward_weights`
    is given; before, format_weight changed nothing under gdpo."""
    extra = [f"advantage.reward_weights=[{explicit[0]}, {explicit[1]}]"] if explicit else []
    tr = Trainer(small_cfg("advantage=gdpo", "task.format_weight=0.1", *extra), run_dir=tmp_path, progress=False)
    seen = []
    est = tr.components["advantage"]
    call = type(est).__call__
    monkeypatch.setattr(type(est), "__call__", lambda self, **kw: (self is est or self.name == "gdpo") and seen.append(self.config.reward_weights) or call(self, **kw))
    tr.train_step()
    assert seen == [explicit or (1.0, 0.1)]
    tr.close()


def test_component_estimators_refuse_what_they_cannot_use():
    with pytest.raises(ConfigError, match=r"'gdpo'.*task 'addition' has one reward.*batch whitening"):
        small_cfg("advantage=gdpo")
    with pytest.raises(ConfigError, match=r"reward_weights.*'normalize_then_sum'.*3 weights for the 2 reward components"):
        small_cfg("advantage=normalize_then_sum", "task.format_weight=0.1", "advantage.reward_weights=[1.0, 1.0, 2.0]")
    with pytest.raises(ConfigError, match=r"overlong_buffer"):
        small_cfg("advantage=gdpo", "task.format_weight=0.1", "rollout.overlong_buffer=2")


def test_a_malformed_component_reward_is_a_reward_error(tmp_path):
    tr = Trainer(small_cfg("task.format_weight=0.1"), run_dir=tmp_path, progress=False)
    tr.rollout.task.reward = lambda example, completion: {"correct": 1.0}
    with pytest.raises(RewardError, match=r"missing \['format'\]"):
        tr.rollout.sample(0)
    tr.close()


def test_gdpo_refuses_a_batch_without_components(tmp_path):
    """A task whose factory declares nothing is checked on its first batch instead of at load."""
    tr = Trainer(small_cfg("advantage=gdpo", "task.format_weight=0.1"), run_dir=tmp_path, progress=False)
    task = tr.rollout.task
    reward = task.reward
    task.reward_components, task.reward_weights = (), None
    task.reward = lambda example, completion: reward(example, completion)["correct"]
    with pytest.raises(rllab.RllabError, match=r"advantage 'gdpo' normalises each reward component.*declares no reward_components"):
        tr.train_step()
    tr.close()
