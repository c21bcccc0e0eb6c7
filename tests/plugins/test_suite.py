"""rllab_suite: suite files → validated cells, statistics, executors, reports, record/replay."""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tiny import TINY
import rllab
from rllab.config import load_config
from rllab_suite import replay, report, stats
from rllab_suite.spec import SuiteError, config_key, expand, parse_suite
from rllab_suite.suite import report_suite, run_suite

SMALL = {**TINY, "train.eval_every": 1}


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def suite(**over):
    data = {"name": "t", "preset": "grpo", "steps": 2, "seeds": [0, 1], "tasks": ["addition"], "overrides": dict(SMALL),
            "variants": {"grpo": {}, "rloo": {"advantage": "rloo"}}}
    data.update(over)
    return data


# --------------------------------------------------------------------------- suite files and cells


def test_cells_cross_variants_tasks_seeds_and_are_keyed_by_config(lab):
    cells = expand(parse_suite(suite(tasks=["addition", {"name": "sort", "max_length": 4}])), lab=lab)
    assert len(cells) == 2 * 2 * 2
    assert {(c.variant, c.task, c.seed) for c in cells} == {(v, t, s) for v in ("grpo", "rloo") for t in ("addition", "sort") for s in (0, 1)}
    sort = next(c for c in cells if c.task == "sort")
    assert sort.config["task"]["max_length"] == 4 and sort.config["train"]["steps"] == 2
    assert len({c.key for c in cells}) == len(cells)
    # the key is the resolved config's: the same cell again, the same key; the name does not count
    again = expand(parse_suite(suite(name="other", tasks=["addition", {"name": "sort", "max_length": 4}])), lab=lab)
    assert sorted(c.key for c in again) == sorted(c.key for c in cells)
    assert config_key({**cells[0].config, "name": "x"}) == cells[0].key


def test_axes_expand_into_a_grid_per_variant(lab):
    s = parse_suite(suite(variants={"ppo": {}}, axes={"policy_loss.clip_high": [0.2, 0.28, 0.35]}, seeds=1))
    assert s.variant_names == ["ppo/clip_high=0.2", "ppo/clip_high=0.28", "ppo/clip_high=0.35"]
    cells = expand(s, lab=lab)
    assert [c.config["policy_loss"]["clip_high"] for c in cells] == [0.2, 0.28, 0.35]
    s = parse_suite(suite(variants=None, axes={"policy_loss.clip_high": [0.2, 0.28]}, seeds=1))
    assert s.variant_names == ["clip_high=0.2", "clip_high=0.28"]


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"variants": {"grpo": {}, "typo": {"policy_loss.clip_hgh": 0.3}}}, "'typo'"),
        ({"variants": {"grpo": {}, "nope": {"advantage": "no_such_estimator"}}}, "'nope'"),
        ({"variants": {"a": {}}, "axes": {"policy_loss.nonsense": [1, 2]}}, "nonsense"),
        ({"variants": {"a": {"preset": "no_such_preset"}}}, "'a'"),
    ],
)
def test_bad_variants_knobs_and_axes_fail_before_anything_runs(lab, tmp_path, over, needle):
    with pytest.raises(SuiteError) as e:
        run_suite(suite(**over), directory=tmp_path / "s", lab=lab, progress=False)
    assert needle in str(e.value) and "nothing was run" in str(e.value)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"variantz": {}}, "variantz"),
        ({"baseline": "dapo"}, "baseline 'dapo'"),
        ({"seeds": [1, 1]}, "repeat"),
        ({"steps": 0}, "steps"),
        ({"axes": {"policy_loss.clip_high": []}}, "policy_loss.clip_high"),
        ({"variants": {"a": "rloo"}}, "variant 'a'"),
        ({"track": "rollout/response_length"}, "track must be a list"),
        ({"track": ["actor/clipfrac", "actor/clipfrac"]}, "track repeats 'actor/clipfrac'"),
        ({"track": ["eval/accuracy"]}, "eval/ metrics are evaluations"),
        # a string for the list was read letter by letter ("tasks repeat d, i with the same knobs")
        ({"tasks": "addition"}, "tasks must be a list of task names or tables (tasks = [\"addition\"]), got 'addition'"),
        ({"tasks": {"name": "sort"}}, "tasks must be a list of task names or tables"),
    ],
)
def test_malformed_suite_files_name_the_key(over, needle):
    with pytest.raises(SuiteError) as e:
        parse_suite(suite(**over))
    assert needle in str(e.value)


def test_an_empty_suite_file_is_refused_not_run_as_one_default_cell(tmp_path):
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(SuiteError, match="empty.toml: the suite file is empty; give at least its variants"):
        parse_suite(empty)


def test_two_variants_with_one_config_are_refused(lab):
    with pytest.raises(SuiteError, match="'a' and 'b' resolve to the same config"):
        expand(parse_suite(suite(variants={"a": {"advantage": "rloo"}, "b": {"advantage": "rloo"}})), lab=lab)


def test_every_variant_sees_the_same_prompts_in_the_same_order(lab):
    """For a seed, a step's prompts depend on (seed, step) alone — not on the variant, nor on
    what the policy learnt in earlier steps; another seed draws others."""
    from rllab.training.trainer import Trainer

    cells = expand(parse_suite(suite(variants={"grpo": {}, "cispo": {"advantage": "rloo", "policy_loss": "cispo", "algorithm.minibatches": 2}})), lab=lab)
    seen = {}
    for c in cells:
        tr = Trainer(load_config(c.config, lab=lab), lab=lab, run_dir=Path(os.environ["RLLAB_CACHE"]) / "runs" / c.slug, progress=False)
        prompts = []
        real = tr.rollout.sample

        def sample(step, _real=real, _out=prompts, **kw):
            scored = _real(step, **kw)
            _out.append([e.prompt for e in scored.examples])
            return scored

        tr.rollout.sample = sample
        tr.train_step()
        tr.train_step()
        tr.close()
        seen[(c.variant, c.seed)] = prompts
    for seed in (0, 1):
        assert seen[("grpo", seed)] == seen[("cispo", seed)]
        assert seen[("grpo", seed)][0] != seen[("grpo", seed)][1]
    assert seen[("grpo", 0)] != seen[("grpo", 1)]


# --------------------------------------------------------------------------- statistics


def test_mean_ci_is_scipys_percentile_bootstrap():
    from scipy.stats import bootstrap

    x = [0.1, 0.4, 0.35, 0.8, 0.5]
    m, lo, hi = stats.mean_ci(x)
    ref = bootstrap((np.array(x),), np.mean, n_resamples=stats.N_RESAMPLES, method="percentile", rng=np.random.default_rng(0)).confidence_interval
    assert m == pytest.approx(0.43) and (lo, hi) == pytest.approx((ref.low, ref.high))
    assert lo < m < hi and 0.1 <= lo and hi <= 0.8
    assert stats.mean_ci([0.5]) [0] == 0.5 and math.isnan(stats.mean_ci([0.5])[1])
    assert stats.mean_ci([0.3, 0.3, 0.3]) == (pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.3))


def test_iqm_and_probability_of_improvement():
    assert stats.iqm([0, 1, 2, 3, 4, 5, 6, 100]) == pytest.approx(3.5)  # the top and bottom quarter dropped
    assert stats.iqm_ci([[0.1, 0.2, 0.3]]) is None  # fewer than MIN_IQM_RUNS runs
    v, lo, hi = stats.iqm_ci([[0.1, 0.2, 0.3], [0.5, 0.6, 0.9]])
    assert v == pytest.approx(stats.iqm([0.1, 0.2, 0.3, 0.5, 0.6, 0.9])) and lo <= v <= hi
    assert stats.prob_improvement([([0.9, 0.8, 0.7], [0.1, 0.2, 0.3])])[0] == 1.0
    assert stats.prob_improvement([([0.1, 0.2, 0.3], [0.9, 0.8, 0.7])])[0] == 0.0
    assert stats.prob_improvement([([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])]) == (0.5, 0.5, 0.5)  # ties count half
    # averaged over tasks: a win on one task and a loss on the other
    p, lo, hi = stats.prob_improvement([([0.9, 0.8, 0.7], [0.1, 0.2, 0.3]), ([0.1, 0.2, 0.3], [0.9, 0.8, 0.7])])
    assert p == 0.5 and lo <= p <= hi
    assert stats.prob_improvement([([0.9, 0.8], [0.1, 0.2])]) is None  # two seeds are not enough
    assert stats.auc([0, 10, 20], [0.0, 1.0, 1.0]) == pytest.approx(0.75)


def _fake_run(path, *, seed, acc, task="addition", reward=None, train=0.5):
    path.mkdir(parents=True)
    (path / "config.toml").write_text(f'[task]\nname = "{task}"\n[train]\nseed = {seed}\n')
    rows = [{"step": s, "eval/accuracy": a, "eval/reward": a if reward is None else reward} for s, a in zip((0, 5, 10), acc)]
    rows.insert(1, {"step": 1, "rollout/reward": train})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "final.json").write_text("{}")


def test_report_from_run_directories(tmp_path):
    recs = []
    for v, base in (("a", 0.2), ("b", 0.5)):
        for s in range(4):
            _fake_run(tmp_path / f"{v}{s}", seed=s, acc=[0.1, base, base + 0.01 * s])
            recs.append(report.read_run(tmp_path / f"{v}{s}", variant=v))
    _fake_run(tmp_path / "dead", seed=0, acc=[0.0, 0.0, 0.0], train=0.0)
    recs.append(report.read_run(tmp_path / "dead", variant="c"))
    summary = report.write_all(recs, tmp_path / "out", title="t", baseline="a")
    rows = {r["variant"]: r for r in summary["rows"]}
    assert rows["b"]["final_accuracy"]["mean"] == pytest.approx(0.515)
    assert rows["a"]["auc_accuracy"]["mean"] == pytest.approx(np.mean([stats.auc([0, 5, 10], [0.1, 0.2, 0.2 + 0.01 * s]) for s in range(4)]))
    over = {o["variant"]: o for o in summary["overall"]}
    assert over["b"]["p_improvement"]["mean"] == 1.0 and over["a"]["p_improvement"] is None
    assert over["b"]["iqm_final_accuracy"]["mean"] == pytest.approx(0.515)
    assert rows["c"]["no_signal"] == 1
    for f in ("report.md", "summary.csv", "summary.json", "runs.csv", "curves.png", "final.png"):
        assert (tmp_path / "out" / f).is_file(), f
    md = (tmp_path / "out" / "report.md").read_text()
    assert "NO SIGNAL c" in md and "51.5 [" in md
    assert report.label_runs([tmp_path / "a0", tmp_path / "a1"]) == ["run", "run"]


def _tracked_run(path, *, seed, lengths, done=True):
    """A run that logged rollout/response_length at steps 1..len(lengths), step 3 twice (a resume)."""
    path.mkdir(parents=True)
    (path / "config.toml").write_text(f'[task]\nname = "addition"\n[train]\nseed = {seed}\n')
    rows = [{"step": 0, "eval/accuracy": 0.1, "eval/reward": 0.1}]
    rows += [{"step": i + 1, "rollout/reward": 0.5, "rollout/response_length": x} for i, x in enumerate(lengths)]
    rows.insert(3, {"step": 3, "rollout/reward": 0.5, "rollout/response_length": 1000.0})  # before a resume: replaced by the step 3 that follows
    rows.append({"step": len(lengths), "eval/accuracy": 0.2, "eval/reward": 0.2})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if done:
        (path / "final.json").write_text("{}")


def test_tracked_training_metrics_last_steps_and_spans(tmp_path):
    # 20 steps: the last 10% is steps 19-20; five spans of 4 steps each
    recs = []
    for v, offset in (("a", 0.0), ("b", 10.0)):
        for s in range(3):
            lengths = [offset + i + 1 + s for i in range(20)]  # value at step k: offset + k + seed
            _tracked_run(tmp_path / f"{v}{s}", seed=s, lengths=lengths)
            recs.append(report.read_run(tmp_path / f"{v}{s}", variant=v, track=("rollout/response_length", "actor/typo")))
    assert recs[0].train["rollout/response_length"][1][2] == 3.0  # the resumed step's value wins
    assert recs[0].last("rollout/response_length") == pytest.approx(19.5)  # mean of steps 19, 20
    assert recs[0].span("rollout/response_length", 5, 8) == pytest.approx(6.5)
    assert report.spans(recs, ("rollout/response_length",)) == [(1, 4), (5, 8), (9, 12), (13, 16), (17, 20)]
    summary = report.write_all(recs, tmp_path / "out", title="t", baseline="a", track=("rollout/response_length", "actor/typo"))
    rows = {r["variant"]: r for r in summary["rows"]}
    last_b = rows["b"]["track"]["rollout/response_length"]["last"]
    assert last_b["mean"] == pytest.approx(10 + 19.5 + 1)  # seeds 0, 1, 2 add 0, 1, 2
    assert last_b["low"] == pytest.approx(stats.mean_ci([29.5, 30.5, 31.5])[1])
    first = rows["a"]["track"]["rollout/response_length"]["spans"][0]
    assert (first["first"], first["last"], first["mean"]) == (1, 4, pytest.approx(2.5 + 1))
    assert summary["track_missing"] == ["actor/typo"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## training metrics, task `addition`" in md and "| b | rollout/response_length | 30.5 [29.5, 31.5] |" in md
    assert "steps 17–20" in md and "NOT LOGGED tracked metric 'actor/typo'" in md
    assert (tmp_path / "out" / "track.png").is_file()
    assert "last rollout/response_length" in (tmp_path / "out" / "runs.csv").read_text().splitlines()[0]
    # an unfinished run counts nowhere, as for the evaluation statistics
    _tracked_run(tmp_path / "c0", seed=0, lengths=[1.0] * 20, done=False)
    assert math.isnan(report.read_run(tmp_path / "c0", track=("rollout/response_length",)).last("rollout/response_length"))


def test_a_suite_directory_reports_the_metrics_its_suite_file_tracks(tmp_path):
    out = tmp_path / "suite"
    cells = []
    for s in range(3):
        _tracked_run(out / "runs" / f"a-s{s}", seed=s, lengths=[2.0 + s] * 10)
        cells.append({"variant": "a", "task": "addition", "seed": s, "run": f"a-s{s}"})
    manifest = {"name": "t", "baseline": None, "variants": ["a"], "track": ["rollout/response_length"], "cells": cells}
    (out / "suite.json").write_text(json.dumps(manifest))
    summary = report_suite(out)
    assert summary["rows"][0]["track"]["rollout/response_length"]["last"]["mean"] == pytest.approx(3.0)
    assert (out / "track.png").is_file()
    assert parse_suite(suite(track=["rollout/response_length"])).track == ("rollout/response_length",)


# --------------------------------------------------------------------------- running a suite


def _crash_plugin(tmp_path):
    p = tmp_path / "boom.py"
    p.write_text(textwrap.dedent('''
        import rllab

        def boom(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
            raise RuntimeError("boom: this loss always fails")

        @rllab.hookimpl
        def register_policy_losses(register):
            register("boom", boom)
    '''))
    return p


def test_a_suite_runs_reports_survives_a_crash_and_runs_only_what_is_missing(tmp_path, lab):
    plugin = _crash_plugin(tmp_path)
    data = suite(seeds=[0], baseline="grpo", variants={"grpo": {}, "rloo": {"advantage": "rloo"}, "broken": {"policy_loss": "boom", "plugins": [str(plugin)]}})
    out = tmp_path / "s"
    summary = run_suite(data, directory=out, workers=1, lab=lab, progress=False)
    status = {r["variant"]: (r["runs"], r["failed"]) for r in summary["rows"]}
    assert status == {"grpo": (1, 0), "rloo": (1, 0), "broken": (0, 1)}
    assert "boom: this loss always fails" in summary["failed"][0]["error"]
    manifest = json.loads((out / "suite.json").read_text())
    done = {c["variant"]: out / "runs" / c["run"] for c in manifest["cells"]}
    assert (done["grpo"] / "final.json").is_file() and (done["broken"] / "error.txt").is_file()
    stamp = (done["grpo"] / "final.json").stat().st_mtime_ns
    # again, with one more seed: only the new cells and the failed one run
    summary = run_suite({**data, "seeds": [0, 1]}, directory=out, workers=1, lab=lab, progress=False, check_identical=False)
    assert (done["grpo"] / "final.json").stat().st_mtime_ns == stamp
    assert {r["variant"]: r["runs"] for r in summary["rows"]} == {"grpo": 2, "rloo": 2, "broken": 0}
    # the report is regenerated from disk alone
    (out / "report.md").unlink()
    again = report_suite(out)
    assert (out / "report.md").is_file() and again["rows"] == summary["rows"]


def test_cli_suite_report_and_compare(tmp_path, capsys):
    from rllab.cli import main

    out = tmp_path / "s"
    f = tmp_path / "suite.toml"
    f.write_text(textwrap.dedent(f'''
        name = "cli"
        preset = "grpo"
        steps = 1
        seeds = 1
        tasks = ["addition"]
        [overrides]
        {chr(10).join(f'"{k}" = {v}' for k, v in SMALL.items())}
        [variants]
        grpo = {{}}
        dual = {{ policy_loss = "ppo_dual_clip" }}
    '''))
    assert main(["suite", str(f), "--dir", str(out), "--workers", "1", "-q", "--no-identical-check"]) == 0
    assert "task addition" in capsys.readouterr().out
    assert main(["suite", "report", str(out)]) == 0
    runs = sorted(p for p in (out / "runs").iterdir())
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "cmp")]) == 0
    text = capsys.readouterr().out
    assert "policy_loss=ppo_dual_clip" in text and (tmp_path / "cmp" / "summary.csv").is_file()
    assert main(["suite", "report", str(tmp_path)]) == 1
    assert "not a suite directory" in capsys.readouterr().err


@pytest.mark.slow
def test_local_process_pool(tmp_path, lab):
    summary = run_suite(suite(), directory=tmp_path / "s", workers=2, lab=lab, progress=False, check_identical=False)
    assert all(r["runs"] == 2 for r in summary["rows"])


@pytest.mark.slow
def test_ray_executor(tmp_path, lab):
    pytest.importorskip("ray")
    summary = run_suite(suite(seeds=[0]), directory=tmp_path / "s", executor_name="ray", workers=2, lab=lab, progress=False, check_identical=False)
    assert all(r["runs"] == 1 for r in summary["rows"])


def test_plan_workers_shares_the_cores():
    from rllab_suite import executor

    n, threads = executor.plan_workers(None, 100)
    assert n == executor.cores() and threads == 1
    assert executor.plan_workers(None, 1) == (1, executor.cores())
    assert executor.plan_workers(3, 2)[0] == 2


# --------------------------------------------------------------------------- record / replay


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    lab = rllab.Lab()
    path = tmp_path_factory.mktemp("rec") / "rec.pt"
    data = replay.record(None, steps=1, out=path, overrides=[f"{k}={v}" for k, v in SMALL.items()] + ["rollout.prompts_per_step=6"], lab=lab)
    # give the recorded groups a signal (the tiny warm start rarely solves addition): rewards 0/1
    b = data["batches"][0]["batch"]
    b["rewards"] = (torch.arange(b["rewards"].numel()) % 3 == 0).float()
    torch.save(data, path)
    return path


def _configs(data, lab, *variants):
    return [(v, load_config(dict(data["config"]), [p for p in v.split(",") if p], lab=lab).to_dict()) for v in variants]


def test_replay_finds_identical_losses_on_an_on_policy_step(recording, lab):
    data = replay.load_record(recording)
    assert data["batches"][0]["old_log_prob"].shape == data["batches"][0]["batch"]["response_mask"].shape
    results = replay.replay_configs(data, _configs(data, lab, "policy_loss=ppo_clip", "policy_loss=ppo_dual_clip", "policy_loss.clip_high=0.28", "advantage=rloo", "policy_loss=vanilla_pg,aggregation=seq-mean-token-sum"), lab=lab)
    pairs = {(p["a"], p["b"]): p for p in replay.compare(results)}
    # on one on-policy minibatch the ratio is 1: clipping never acts
    assert pairs[("policy_loss=ppo_clip", "policy_loss=ppo_dual_clip")]["identical"]
    assert pairs[("policy_loss=ppo_clip", "policy_loss.clip_high=0.28")]["identical"]
    # other advantages or aggregations are other gradients
    p = pairs[("policy_loss=ppo_clip", "advantage=rloo")]
    assert not p["identical"] and p["max_rel_diff"] > 1e-2
    assert not pairs[("policy_loss=ppo_clip", "policy_loss=vanilla_pg,aggregation=seq-mean-token-sum")]["identical"]
    for r in results:
        assert r.metrics["replay/first_grad_norm"] > 0 and r.metrics["actor/clipfrac"] == 0.0
    msgs = replay.identical_messages(list(pairs.values()))
    assert any("ppo_dual_clip" in m["message"] and "one computation" in m["message"] for m in msgs)


def test_the_same_update_with_a_different_reward_is_not_called_identical():
    # the replay scores nothing: two arms that differ in the reward (the rollout section) update alike on
    # the recorded batch, yet their runs see other batches, so they are not one computation
    same = {"a": "grpo", "b": "random_reward", "cosine": 1.0, "max_rel_diff": 0.0, "inconclusive": False}
    pairs = [{**same, "identical": True, "same_update": True, "differs_outside_replay": []},
             {**same, "b": "noclip_random", "identical": False, "same_update": True, "differs_outside_replay": ["rollout"]},
             {**same, "b": "other", "identical": False, "same_update": False, "differs_outside_replay": []},
             # a pair saved before same_update was recorded reads alike
             {**same, "b": "saved", "identical": True, "differs_outside_replay": ["rollout"]}]
    g = [[torch.tensor([1.0, -2.0])]]
    a = replay.ReplayResult(name="grpo", config={"rollout": {"random_reward": False}, "policy_loss": {"clip": 0.2}}, metrics={}, grads=g)
    b = replay.ReplayResult(name="noclip_random", config={"rollout": {"random_reward": True}, "policy_loss": {"clip": 1e9}}, metrics={}, grads=g)
    c = replay.ReplayResult(name="noclip", config={"rollout": {"random_reward": False}, "policy_loss": {"clip": 1e9}}, metrics={}, grads=g)
    ab, ac, _ = replay.compare([a, b, c])
    assert ab["same_update"] and not ab["identical"] and ab["differs_outside_replay"] == ["rollout"]
    assert ac["same_update"] and ac["identical"] and ac["differs_outside_replay"] == []
    msgs = [m["message"] for m in replay.identical_messages(pairs, step=0)]
    assert len(msgs) == 3
    assert msgs[0].startswith("IDENTICAL grpo ≡ random_reward:") and "one computation" in msgs[0]
    for m in msgs[1:]:
        assert m.startswith("SAME UPDATE ON THE RECORDED BATCH grpo, ") and "not one computation" in m and "[rollout]" in m
        assert "IDENTICAL" not in m


def test_replay_with_minibatches_runs_the_whole_update(recording, lab):
    data = replay.load_record(recording)
    # a large learning rate, so that the later minibatches are off-policy enough for clipping to act
    results = replay.replay_configs(data, _configs(data, lab, "algorithm.minibatches=3,train.lr=0.02", "algorithm.minibatches=3,policy_loss=cispo,train.lr=0.02"), lab=lab)
    assert [r.metrics["replay/optimizer_steps"] for r in results] == [3.0, 3.0]
    (p,) = replay.compare(results)
    # the first minibatch is on-policy for both; later ones are not, and the two losses part
    assert p["cosine"] > 0.99 and not p["identical"]


def _nan_gradient_lab():
    """A Lab with ``nan_grad``: a policy loss whose value is 0 and whose gradient is NaN (√|x| at 0)."""
    import types

    mod = types.ModuleType("nan_grad_plugin")

    def nan_grad(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
        """A finite loss with a non-finite gradient."""
        return aggregate((log_prob - log_prob.detach()).abs().sqrt(), mask), {}

    @rllab.hookimpl
    def register_policy_losses(register):
        register("nan_grad", nan_grad)

    mod.register_policy_losses = register_policy_losses
    return rllab.Lab([mod])


def test_replay_takes_the_trainers_optimizer_step_a_non_finite_gradient_stops_it(recording, monkeypatch):
    lab = _nan_gradient_lab()
    data = replay.load_record(recording)
    with pytest.raises(rllab.NonFiniteError, match="the policy's gradient is non-finite"):
        replay.replay_configs(data, _configs(data, lab, "policy_loss=nan_grad"), lab=lab)
    # train.nonfinite = "skip" drops the update, as in a run
    (r,) = replay.replay_configs(data, _configs(data, lab, "policy_loss=nan_grad,train.nonfinite=skip"), lab=lab)
    assert r.metrics["train/nonfinite"] == 1.0 and r.metrics["train/skipped"] == 1.0
    # every optimizer step goes through rllab.Optimizers.apply, the trainer's own
    calls = []
    real = rllab.Optimizers.apply
    monkeypatch.setattr(rllab.Optimizers, "apply", lambda self, request, *, step: calls.append(step) or real(self, request, step=step))
    (r,) = replay.replay_configs(data, _configs(data, lab, "algorithm.minibatches=2"), lab=lab)
    assert len(calls) == 2 == r.metrics["replay/optimizer_steps"]


def test_replay_builds_its_parts_as_the_trainer_does(recording, lab, monkeypatch):
    """Replay builds the algorithm, components, context and optimizers with rllab.training.parts, the
    trainer's own construction: a critic's optimizer carries train.weight_decay, as in a run."""
    from rllab.training import parts

    calls, real_parts, real_opts = [], parts.build_parts, parts.build_optimizers
    monkeypatch.setattr(parts, "build_parts", lambda cfg, lab: calls.append("parts") or real_parts(cfg, lab))
    monkeypatch.setattr(parts, "build_optimizers", lambda cfg, policy, critic=None, **kw: calls.append(real_opts(cfg, policy, critic, **kw)) or calls[-1])
    data = replay.load_record(recording)
    (r,) = replay.replay_configs(data, _configs(data, lab, "advantage=gae,train.weight_decay=0.05"), lab=lab)
    assert "parts" in calls and math.isfinite(r.metrics["loss/policy"])
    opt, critic_opt = next(c for c in calls if c != "parts")
    assert critic_opt is not None and [g["weight_decay"] for g in critic_opt.param_groups] == [0.05]


def test_record_and_replay_commands(recording, tmp_path, capsys):
    from rllab.cli import main

    assert main(["replay", str(recording), "policy_loss=ppo_clip", "policy_loss=ppo_dual_clip"]) == 0
    out = capsys.readouterr().out
    assert "IDENTICAL policy_loss=ppo_clip ≡ policy_loss=ppo_dual_clip" in out
    assert main(["replay", str(recording), "policy_loss.clip_hgh=0.3"]) == 1
    assert "clip_hgh" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.pt")]) == 1
    assert "no recording" in capsys.readouterr().err


# --------------------------------------------------------------------------- no learning signal


def test_a_run_with_zero_reward_everywhere_warns_loudly(tmp_path, lab, capsys):
    from rllab_suite import NoLearningSignalWarning

    from rllab.training.trainer import run_experiment

    # the task's answers cannot be produced in one token: every reward is 0
    cfg = load_config(None, [f"{k}={v}" for k, v in SMALL.items()] + ["rollout.max_new_tokens=1", "train.steps=5", "train.eval_every=0"], lab=lab)
    with pytest.warns(NoLearningSignalWarning, match="scored 0"):
        run_experiment(cfg, lab=lab, run_dir=tmp_path / "run", progress=False)
    assert "nothing to learn from" in capsys.readouterr().err


def test_the_no_learning_warning_names_the_steps_since_a_resume():
    """Unclear: a resumed run that ran step 4 alone was warned about "the first 1 steps"."""
    from rllab_suite import _nothing

    base = {"zero": 1, "steps": 1, "error_frac": 0.0, "overflow_frac": 0.0, "stopped": 0.0, "max_new_tokens": 6, "empty": 0,
            "kind": "task", "task": "addition", "budget": None, "policy": "raise"}
    assert _nothing({**base, "start": 0}, "task 'addition'").startswith("every rollout of the first step scored 0")
    assert _nothing({**base, "start": 3}, "task 'addition'").startswith(
        "every rollout of step 4 (the first since the resume) scored 0")
    assert _nothing({**base, "zero": 3, "steps": 3, "start": 3}, "task 'addition'").startswith(
        "every rollout of steps 4–6 (since the resume) scored 0")


# --------------------------------------------------------------------------- careless use of the commands


def test_replay_of_a_file_that_is_not_a_recording_says_what_it_is(recording, tmp_path, capsys):
    """Mistake: `rllab replay FILE` on a config, a run directory, an empty or truncated file, a
    checkpoint, or a missing file (a config used to end in a raw UnpicklingError traceback)."""
    from rllab.cli import main

    def err(path):
        assert main(["replay", str(path), "policy_loss=cispo"]) == 1
        return " ".join(capsys.readouterr().err.split())  # unwrapped

    toml = tmp_path / "a.toml"
    toml.write_text("[train]\nsteps = 2\n")
    assert "a TOML file (an experiment config?), not a recording" in err(toml) and f"rllab record {toml} --steps 1" in err(toml)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("")
    assert "is a run directory" in err(run) and f"rllab record {run} --steps 1" in err(run)
    (tmp_path / "empty.pt").write_bytes(b"")
    assert "is empty" in err(tmp_path / "empty.pt")
    blob = recording.read_bytes()
    (tmp_path / "cut.pt").write_bytes(blob[: len(blob) // 2])
    assert "truncated or corrupt" in err(tmp_path / "cut.pt")
    state = run / "checkpoints" / "step_000003" / "state.pt"
    state.parent.mkdir(parents=True)
    torch.save({"step": 3, "policy": {}, "optimizer": {}, "config": {}}, state)
    text = err(state)
    assert "training checkpoint" in text and "after step 3" in text and f"rllab record {run}" in text
    torch.save({"format": "rllab-record/0", "batches": []}, tmp_path / "old.pt")
    assert "'rllab-record/0'" in err(tmp_path / "old.pt")
    assert "no recording at" in err(tmp_path / "missing.pt")


def test_replay_refuses_overrides_it_cannot_honour(recording, capsys):
    """Mistake: a replay variant that changes the model, task, rollout or anything else a replay
    does not rerun (it used to print a row as if it were a variant), or another algorithm."""
    from rllab.cli import main

    for variant, named in (("model.path=/nonexistent", "model.path"), ("task=sort", "task"),
                           ("policy_loss=cispo,rollout.temperature=0.5,train.steps=9", "rollout.temperature, train.steps"),
                           ("backend=sglang", "backend"), ("train.lr_schedule=constant", "train.lr_schedule")):
        assert main(["replay", str(recording), "policy_loss=ppo_clip", variant]) == 1
        text = capsys.readouterr().err
        assert f"rllab replay cannot vary {named}:" in text and "policy_loss" in text and "train.lr" in text, text
    assert main(["replay", str(recording), "algorithm=dpo"]) == 1
    assert "supports only the algorithms that declare the trait replayable ('rl'" in " ".join(capsys.readouterr().err.split())
    from rllab_suite.checks import check_replay_overrides

    check_replay_overrides("ok", [("algorithm", "rl"), ("algorithm.minibatches", 2), ("advantage", "rloo"), ("train.lr", 0.1),
                                  ("train.seed", 3), ("kl.coef", 0.1), ("model.logprob_chunk", 64)])


def test_suite_workers_must_be_at_least_one(tmp_path, lab, capsys):
    """Mistake: `rllab suite S.toml --workers 0` (or negative) used to run on one worker per core
    without a word; --address without the Ray executor was ignored."""
    from rllab.cli import main

    for n, words in (("0", "0: the number must be at least 1"), ("-2", "-2: the number must be at least 1"), ("two", "'two' is not a whole number")):
        with pytest.raises(SystemExit) as e:
            main(["suite", "s.toml", "--workers", n])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "--workers" in err and words in err
    with pytest.raises(rllab.RllabError, match="workers must be a whole number of at least 1"):
        run_suite(suite(), directory=tmp_path / "s", workers=0, lab=lab, progress=False)
    with pytest.raises(rllab.RllabError, match="needs --executor ray"):
        run_suite(suite(), directory=tmp_path / "s", address="auto", lab=lab, progress=False)
    assert not (tmp_path / "s").exists()


def test_record_options_that_would_be_ignored_or_destroy_something(tmp_path, capsys):
    """Mistake: `rllab record` with --out a directory or an existing config (it would be replaced),
    --preset with a run directory (ignored), a run directory without a checkpoint (the batches
    would come from the warm start, not the run), an override of what the run fixes (`task=sort`:
    reported only after the model was built, as "[task] cannot change during a run"), --steps 0."""
    from rllab.cli import main

    cfg = tmp_path / "a.toml"
    cfg.write_text("[train]\nsteps = 2\n")
    assert main(["record", str(cfg), "--out", str(cfg)]) == 1
    assert "is not a recording (a config?)" in capsys.readouterr().err and cfg.read_text() == "[train]\nsteps = 2\n"
    assert main(["record", "--out", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text("")
    assert main(["record", str(tmp_path / "run"), "--preset", "grpo", "--out", str(tmp_path / "r.pt")]) == 1
    assert "--preset grpo does not apply to a run directory" in capsys.readouterr().err
    assert main(["record", str(tmp_path / "run"), "--out", str(tmp_path / "r.pt")]) == 1
    assert "has no checkpoint" in capsys.readouterr().err
    # what the run fixes cannot be overridden: said at once, with the command that records it from the config
    assert main(["record", str(tmp_path / "run"), "task=sort", "algorithm.minibatches=2", "--out", str(tmp_path / "r.pt")]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "task=sort cannot apply" in err and "algorithm.minibatches" not in err.split("cannot apply")[0]
    assert f"rllab record {tmp_path / 'run' / 'config.toml'} task=sort" in err
    assert main(["record", str(tmp_path / "run"), "algorithm.minibatches=2", "--out", str(tmp_path / "r.pt")]) == 1
    assert "has no checkpoint" in capsys.readouterr().err  # a knob of the algorithm may change
    with pytest.raises(SystemExit):
        main(["record", "--steps", "0", "--out", str(tmp_path / "r.pt")])


def test_compare_of_a_suite_directory_points_at_suite_report(tmp_path, capsys):
    """Mistake: `rllab compare SUITE_DIR` (a suite directory instead of its runs)."""
    from rllab.cli import main

    (tmp_path / "suite.json").write_text("{}")
    assert main(["compare", str(tmp_path)]) == 1
    assert "is a suite directory: its report comes from rllab suite report DIR" in " ".join(capsys.readouterr().err.split())


def test_a_suite_cell_resumes_in_its_own_directory_and_never_restarts_over_a_finished_one(tmp_path, lab):
    """Mistake guarded: the run-directory check must not stop a suite from continuing its own
    interrupted cells; a finished cell is never silently rerun into the same directory."""
    from rllab_suite.executor import run_cell

    cfg = load_config(None, [f"{k}={v}" for k, v in SMALL.items()] + ["train.steps=2"], lab=lab).to_dict()
    job = {"key": "k", "config": cfg, "run_dir": str(tmp_path / "cell"), "threads": 1}
    assert run_cell(job)["status"] == "done"
    # interrupted before its checkpoint and final.json: the suite continues it (from the start)
    import shutil

    shutil.rmtree(tmp_path / "cell" / "checkpoints")
    (tmp_path / "cell" / "final.json").unlink()
    assert run_cell(job)["status"] == "done"
    rows = [json.loads(x) for x in (tmp_path / "cell" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if "rollout/reward" in x] == [1, 2]
    r = run_cell(job)  # finished: run_cell would have to start afresh over it, and is refused
    assert r["status"] == "failed" and "already holds a run" in r["error"]


# --------------------------------------------------------------------------- suites that are not what they claim


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"tasks": ["addition", "addition"]}, "tasks repeat addition"),
        ({"tasks": [{"name": "sort", "max_length": 4}, {"max_length": 4, "name": "sort"}]}, "tasks repeat sort"),
        ({"axes": {"policy_loss.clip_high": [0.2, 0.28, 0.2]}}, "axis 'policy_loss.clip_high' repeats 0.2"),
        ({"tasks": []}, "no cells"),
    ],
)
def test_repeated_cells_and_empty_suites_are_refused(over, needle):
    """Class: a suite whose cells are not what it claims — two cells with one slug (a repeated task
    or axis value) used to run at once into one run directory and report "2 runs" from one seed;
    `tasks = []` ran "0 cells" with exit 0."""
    with pytest.raises(SuiteError, match=re.escape(needle)):
        parse_suite(suite(**over))


def test_the_tui_grid_refuses_a_repeated_axis_value(lab):
    """Class: two cells with one slug — the TUI's grid builder accepted `clip_high = [0.2, 0.2]`."""
    from rllab_tui import state

    g = state.Grid(name="g", preset="grpo", steps=2, seeds=[0], overrides=dict(SMALL), axes={"policy_loss.clip_high": [0.2, 0.2]})
    with pytest.raises(SuiteError, match="repeats 0.2"):
        state.expand_grid(lab, g)


def test_tasks_that_resolve_to_one_config_are_refused(lab):
    """Class: two cells with one slug — a task table that only restates the defaults is the same
    task as its bare name."""
    with pytest.raises(SuiteError, match=r"tasks 'addition' and 'addition\[digits=2\]' resolve to the same config"):
        expand(parse_suite(suite(tasks=["addition", {"name": "addition", "digits": 2}])), lab=lab)


def test_environments_are_suite_tasks_by_name_or_through_the_overrides(lab):
    """A ``tasks`` entry naming an environment selects ``env`` (its knobs as ``env.KNOB``) and
    drops the base's task; ``env`` in ``[overrides]`` does the same for every cell."""
    cells = expand(parse_suite(suite(tasks=["addition", "guess", {"name": "guess", "high": 8}], seeds=[0])), lab=lab)
    by_task = {c.task: c.config for c in cells if c.variant == "grpo"}
    assert set(by_task) == {"addition", "guess", "guess[high=8]"}
    assert by_task["addition"]["task"]["name"] == "addition" and by_task["addition"].get("env") is None
    assert by_task["guess"]["env"] == {**by_task["guess"]["env"], "name": "guess", "high": 16} and by_task["guess"].get("task") is None
    assert by_task["guess[high=8]"]["env"]["high"] == 8
    data = suite(overrides={**SMALL, "env": "guess", "env.max_turns": 3}, seeds=[0])
    del data["tasks"]  # the base config's: here the environment set in [overrides]
    over = expand(parse_suite(data), lab=lab)
    assert {(c.task, c.config["env"]["name"], c.config["env"]["max_turns"], c.config.get("task")) for c in over} == {("guess", "guess", 3, None)}
    with pytest.raises(SuiteError, match=r"variant 'grpo'.*hgh"):
        expand(parse_suite(suite(tasks=[{"name": "guess", "hgh": 8}], seeds=[0])), lab=lab)


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"variants": {"a": {"train.steps": 5}}}, "variant 'a' sets train.steps"),
        ({"variants": {"a": {"train": {"seed": 7}}}}, "variant 'a' sets train.seed"),
        ({"overrides": {**SMALL, "train.seed": 3}}, "[overrides] sets train.seed"),
        ({"overrides": [f"{k}={v}" for k, v in SMALL.items()] + ["train.steps=9"]}, "[overrides] sets train.steps"),
    ],
)
def test_overrides_the_suite_would_replace_are_refused(over, needle):
    """Class: settings silently replaced — a variant or [overrides] setting train.steps or
    train.seed was overwritten by the suite's steps / seeds without a word."""
    with pytest.raises(SuiteError) as e:
        parse_suite(suite(**over))
    assert needle in str(e.value) and "use the suite's" in str(e.value)
    parse_suite(suite(steps=None, variants={"a": {"train.steps": 5}}))  # no suite budget: the variant's is used


def test_one_task_name_in_two_configs_is_reported_as_two_tasks(lab, tmp_path, monkeypatch):
    """Class: reports that pool different experiments — `tasks = ["addition", {name = "addition",
    digits = 1}]` was reported as one task "addition" (one CI over two tasks), and the
    identical-variant check replayed both tasks' cells together (`grpo ≡ grpo`)."""
    from rllab_suite import suite as suite_mod

    cells = expand(parse_suite(suite(tasks=["addition", {"name": "addition", "digits": 1}])), lab=lab)
    assert sorted({c.task for c in cells}) == ["addition", "addition[digits=1]"]
    assert {c.config["task"]["digits"] for c in cells if c.task == "addition[digits=1]"} == {1}
    groups = []
    monkeypatch.setattr(replay, "record", lambda config, **kw: {"step": 0, "config": config})
    monkeypatch.setattr(replay, "replay_configs", lambda data, configs, **kw: groups.append([n for n, _ in configs]) or [])
    (tmp_path / "replay").mkdir()
    suite_mod.identical_variants(cells, lab=lab, out_dir=tmp_path)
    assert groups == [["grpo", "rloo"], ["grpo", "rloo"]]


def test_a_changed_suite_records_its_identical_variant_batch_afresh(lab, tmp_path, monkeypatch):
    """Class: stale results reused — a suite directory copied and run with changed tasks replayed
    the old config's `replay/TASK.pt` recording."""
    from rllab_suite import suite as suite_mod

    recorded = []

    def fake_record(config, *, out, **kw):
        recorded.append(config["task"]["digits"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("x")
        return {"step": 0}

    monkeypatch.setattr(replay, "record", fake_record)
    monkeypatch.setattr(replay, "load_record", lambda path: {"step": 0})
    monkeypatch.setattr(replay, "replay_configs", lambda data, configs, **kw: [])
    for digits in (2, 2, 1):
        cells = expand(parse_suite(suite(tasks=[{"name": "addition", "digits": digits}])), lab=lab)
        suite_mod.identical_variants(cells, lab=lab, out_dir=tmp_path)
    assert recorded == [2, 1]


def test_rerunning_a_finished_suite_does_not_replay_its_identical_variant_check_again(lab, tmp_path, monkeypatch):
    """Class: work done twice — rerunning a finished suite replayed the identical-variant check
    (~7 s) although neither the recording nor the variants had changed; a new variant replays."""
    from rllab_suite import suite as suite_mod

    replayed = []

    def fake_record(config, *, out, **kw):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("x")
        return {"step": 0}

    monkeypatch.setattr(replay, "record", fake_record)
    monkeypatch.setattr(replay, "load_record", lambda path: {"step": 0})
    monkeypatch.setattr(replay, "replay_configs", lambda data, configs, **kw: replayed.append([n for n, _ in configs]) or [])
    for variants in (["grpo", "rloo"], ["grpo", "rloo"], ["grpo", "rloo", "clip"]):
        every = {"grpo": {}, "rloo": {"advantage": "rloo"}, "clip": {"policy_loss.clip_high": 0.28}}
        cells = expand(parse_suite(suite(variants={k: every[k] for k in variants})), lab=lab)
        suite_mod.identical_variants(cells, lab=lab, out_dir=tmp_path)
    assert replayed == [["grpo", "rloo"], ["grpo", "rloo", "clip"]]


def _suite_file(path: Path, name: str, config: str | None = None) -> Path:
    base = f'config = "{config}"' if config else 'preset = "grpo"'
    path.write_text(f'name = "{name}"\n{base}\nsteps = 1\nseeds = 1\ntasks = ["addition"]\n[overrides]\n'
                    + "".join(f'"{k}" = {json.dumps(v)}\n' for k, v in SMALL.items()))
    return path


def test_a_suite_directory_is_resumed_as_given_and_never_taken_over(tmp_path, capsys):
    """Class: one suite overwriting another, and unclear messages — `rllab suite other.toml --dir D`
    overwrote D's suite.json, suite.toml and report; the kept `D/suite.toml` failed on its relative
    `config = "base.toml"`; `rllab suite D` said "suite file not found"; `rllab suite report S.toml`
    suggested `--dir S.toml`."""
    from rllab.cli import main

    src = tmp_path / "src"
    src.mkdir()
    (src / "base.toml").write_text('preset = "grpo"\n')
    f = _suite_file(src / "a.toml", "a", config="base.toml")
    d = tmp_path / "D"
    flags = ["-q", "--no-identical-check", "--workers", "1"]
    assert main(["suite", str(f), "--dir", str(d), *flags]) == 0
    manifest = (d / "suite.json").read_text()
    # the kept copy resumes, from the copy or from the directory, with its config found where it was
    assert main(["suite", str(d / "suite.toml"), *flags]) == 0
    assert "1 already done" in capsys.readouterr().out
    assert main(["suite", str(d), *flags]) == 0
    assert "1 already done" in capsys.readouterr().out
    # another suite into D is refused, naming both, and D is untouched
    other = _suite_file(tmp_path / "b.toml", "b")
    assert main(["suite", str(other), "--dir", str(d), *flags]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "holds suite 'a', not 'b'" in err and "--replace" in err
    assert (d / "suite.json").read_text() == manifest and 'name = "a"' in (d / "suite.toml").read_text()
    # a directory without a suite, and a suite file given to `suite report`, say what is wanted
    assert main(["suite", str(src), *flags]) == 1
    assert "without a suite.toml" in capsys.readouterr().err
    assert main(["suite", "report", str(f)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "takes a suite directory" in err and "rllab suite report suites/a" in err and "--dir" not in err.split("unless")[0]
    # --replace: b takes D over, without a's notes
    (d / "identical.json").write_text("[]")
    assert main(["suite", str(other), "--dir", str(d), "--replace", *flags]) == 0
    assert json.loads((d / "suite.json").read_text())["name"] == "b" and not (d / "identical.json").exists()


def test_compare_never_pools_runs_of_different_task_settings(tmp_path):
    """Class: comparisons pool different experiments. Two runs of `addition` that differ in
    `task.digits` are different tasks; `rllab compare` must not report them as one group."""
    for name, digits in (("a", 1), ("b", 3)):
        path = tmp_path / name
        _fake_run(path, seed=0, acc=[0.1, 0.2, 0.3])
        (path / "config.toml").write_text(f'[task]\nname = "addition"\ndigits = {digits}\n[train]\nseed = 0\n')
    from rllab_suite.suite import compare_runs

    summary = compare_runs([tmp_path / "a", tmp_path / "b"], out=tmp_path / "cmp")
    assert summary["tasks"] == ["addition[digits=1]", "addition[digits=3]"]
    assert [r["runs"] for r in summary["rows"]] == [1, 1]
    assert report.task_labels([tmp_path / "a", tmp_path / "a"]) == ["addition", "addition"]


def test_replay_weights_gdpo_components_as_the_recorded_task_does(tmp_path, lab):
    """Class: a knob that does nothing. A replayed gdpo step weights the components with the
    recorded task's reward_weights (1, format_weight), as the training step does."""
    path = tmp_path / "rec.pt"
    over = [f"{k}={v}" for k, v in SMALL.items()] + ["task.format_weight=0.1", "advantage=gdpo"]
    data = replay.record(None, steps=1, out=path, overrides=over, lab=lab)
    b = data["batches"][0]["batch"]
    n = b["rewards"].numel()
    b["reward_components"] = torch.stack([(torch.arange(n) % 3 == 0).float(), (torch.arange(n) % 2 == 0).float()], 1)
    torch.save(data, path)
    data = replay.load_record(path)
    names = ["advantage.epsilon=1e-6", "advantage.reward_weights=[1.0, 0.1]", "advantage.reward_weights=[1.0, 1.0]"]
    configs = [(v, load_config(dict(data["config"]), [v], lab=lab).to_dict()) for v in names]
    pairs = {(p["a"], p["b"]): p for p in replay.compare(replay.replay_configs(data, configs, lab=lab))}
    assert pairs[(names[0], names[1])]["identical"] and not pairs[(names[0], names[2])]["identical"]
