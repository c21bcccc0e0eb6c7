"""The traces logger (rllab_loggers.traces) and `rllab traces` (rllab_loggers.traces_view)."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from rllab.config import load_config
from rllab.errors import ConfigError
from rllab_loggers import traces_view
from rllab_loggers.traces import pick_rows, read_traces

from ..tiny import TINY, overrides

TRACES = 'loggers=["jsonl", {name="traces", per_step=3}]'


def test_picks_go_round_robin_over_groups_and_positions_by_hand():
    groups = [[0, 1], [2, 3], [4, 5]]
    # step 1 takes picks k = 0, 1: groups 0, 1 at position 0; step 2 k = 2, 3: group 2 at 0, group 0 at 1
    assert pick_rows(groups, 2, step=1) == [0, 2]
    assert pick_rows(groups, 2, step=2) == [4, 1]
    assert pick_rows(groups, 2, step=3) == [3, 5]
    assert pick_rows(groups, 2, step=4) == [0, 2]  # every row seen once over 3 steps, then again
    assert sorted(pick_rows([[0], [1]], 5, step=1)) == [0, 1]  # never more than the batch
    assert pick_rows([], 3, step=1) == []


@pytest.mark.parametrize("bad", ["0", "-2", '"four"'])
def test_bad_per_step_is_refused_naming_the_logger(bad):
    with pytest.raises(ConfigError, match="traces|per_step"):
        load_config(None, [f'loggers=["jsonl", {{name="traces", per_step={bad}}}]'])


@pytest.fixture(scope="module")
def traced_run(model_cache, tmp_path_factory):
    from rllab.training.trainer import run_experiment

    base = tmp_path_factory.mktemp("traces")
    args = [*overrides(TINY), "train.steps=3", "task.digits=1"]
    run_experiment(load_config(None, [*args, TRACES]), run_dir=base / "traced", progress=False)
    run_experiment(load_config(None, args), run_dir=base / "plain", progress=False)
    return base


def test_a_run_writes_its_samples_with_both_log_probs_and_the_mismatch(traced_run):
    recs = [r for r in read_traces(traced_run / "traced" / "traces.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert sorted({r["group"] for r in recs}) == [0, 1, 2, 3]  # 4 groups, 9 picks: every group seen
    for r in recs:
        n = len(r["tokens"])
        assert len(r["model"]) == len(r["sampler_logprobs"]) == len(r["trainer_logprobs"]) == len(r["advantages"]) == n
        assert r["length"] == sum(r["model"]) and r["turns"] == 1 and r["finish_reason"] in ("stop", "length")
        # the mismatch of the one turn, by hand from the two lists
        want = sum(s - t for s, t, m in zip(r["sampler_logprobs"], r["trainer_logprobs"], r["model"]) if m)
        assert r["mismatch"] == [pytest.approx(want, abs=1e-5)]
        assert abs(r["mismatch"][0]) < 1e-3  # sampler and trainer are the same weights in a synchronous run
        plain = "".join(t for t in r["tokens"] if not (t.startswith("<") and t.endswith(">")))  # special tokens dropped
        assert r["prompt"].endswith("=") and "".join(r["texts"]) in plain
        assert len({a for a, m in zip(r["advantages"], r["model"]) if m}) <= 1  # GRPO: one advantage per sample
        assert math.isfinite(r["reward"])


def test_each_evaluation_writes_a_slice_of_its_greedy_answers(traced_run):
    evals = [r for r in read_traces(traced_run / "traced" / "traces.jsonl") if r["kind"] == "eval"]
    # evaluations at steps 0 and 3 of 16 held-out problems, 8 each: the slices start at 0 and 3·8 mod 16 = 8
    assert [(r["step"], r["group"]) for r in evals] == [(0, k) for k in range(8)] + [(3, 8 + k) for k in range(8)]
    assert all(r["trainer_logprobs"] is None and set(r["advantages"]) <= {0.0} for r in evals)
    _, recs = traces_view.load(traced_run / "traced")
    assert {r["kind"] for r in traces_view.select(recs, kind="eval", all_steps=True)} == {"eval"}
    assert {r["step"] for r in traces_view.select(recs, kind="eval")} == {3}


def test_tracing_changes_nothing_the_run_learns(traced_run):
    def rows(name):
        out = []
        for ln in (traced_run / name / "metrics.jsonl").read_text().splitlines():
            d = json.loads(ln)
            out.append({k: v for k, v in d.items() if not k.startswith(("time/", "perf/", "memory/"))})
        return out

    assert rows("traced") == rows("plain")


def test_a_resumed_run_drops_the_samples_after_its_checkpoint(model_cache, tmp_path):
    from rllab.training.runs import resume_run
    from rllab.training.trainer import run_experiment

    args = [*overrides(TINY), "train.steps=4", "train.checkpoint_every=2", "task.digits=1", TRACES]
    run_experiment(load_config(None, args), run_dir=tmp_path / "full", progress=False)
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    shutil.rmtree(cut / "checkpoints" / "step_000004")
    (cut / "final.json").unlink()
    resume_run(cut, progress=False)
    assert [r["step"] for r in read_traces(cut / "traces.jsonl")] == [r["step"] for r in read_traces(tmp_path / "full" / "traces.jsonl")]


def test_filters_and_their_errors(traced_run):
    _, recs = traces_view.load(traced_run / "traced")
    assert {r["step"] for r in traces_view.select(recs)} == {3}  # the last step by default
    assert len(traces_view.select(recs, all_steps=True)) == 9
    assert all(r["reward"] >= 1 for r in traces_view.select(recs, min_reward=1, all_steps=True))
    assert len(traces_view.select(recs, step=1, limit=2)) == 2
    prompt = recs[0]["prompt"]
    assert all(prompt in r["prompt"] for r in traces_view.select(recs, grep=prompt, all_steps=True))
    with pytest.raises(traces_view.TracesError, match="no samples of step 7; traced steps: 1, 2, 3"):
        traces_view.select(recs, step=7)
    with pytest.raises(traces_view.TracesError, match="--finish 'nope' matches no sample; finish reasons traced"):
        traces_view.select(recs, finish="nope")
    with pytest.raises(traces_view.TracesError, match="has no traces \\(its config.toml names no traces logger\\); run with the traces logger"):
        traces_view.load(traced_run / "plain")
    with pytest.raises(traces_view.TracesError, match="does not exist"):
        traces_view.load(traced_run / "missing")
    with pytest.raises(traces_view.TracesError, match="is not a traces file \\(record 1 lacks prompt"):
        traces_view.load(traced_run / "plain" / "metrics.jsonl")


def test_the_command_prints_panels_and_writes_a_self_contained_page(traced_run, capsys, tmp_path):
    from rllab.cli import main

    assert main(["traces", str(traced_run / "traced"), "--step", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("step 2 · group") == 3 and "reward" in out
    assert main(["traces", str(traced_run / "traced"), "--step", "9"]) == 2
    assert "traced steps: 1, 2, 3" in capsys.readouterr().err
    page = tmp_path / "t.html"
    assert main(["traces", str(traced_run / "traced"), "--html", str(page)]) == 0
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # nothing fetched from the network
    data = json.loads(text.split('<script id="data" type="application/json">')[1].split("</script>")[0])
    assert len(data) == 9 + 16 and "<polyline" in text  # the samples, the greedy answers and the run's curves


def _browser():
    shutil_which = shutil.which
    path = shutil_which("chromium") or shutil_which("chromium-browser")
    if path is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium) for the browser test")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; it drives the system Chromium)")
    return path, sync_playwright


def test_the_page_opens_in_a_headless_browser_and_filters(traced_run, tmp_path):
    path, sync_playwright = _browser()
    page_file = tmp_path / "t.html"
    traces_view.write_html(page_file, read_traces(traced_run / "traced" / "traces.jsonl"), title="t", metrics=[])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(page_file.as_uri())
        assert page.locator(".sample").count() == 25  # 9 training samples, 16 greedy answers
        assert page.inner_text("#count") == "25 of 25 samples"
        page.select_option("#step", "2")
        assert page.locator(".sample").count() == 3
        assert page.inner_text("#count") == "3 of 25 samples"
        page.select_option("#step", "")
        page.select_option("#kind", "eval")
        assert page.locator(".sample").count() == 16
        page.fill("#minr", "1")
        assert page.locator(".sample").count() == sum(1 for r in read_traces(traced_run / "traced" / "traces.jsonl")
                                                      if r["kind"] == "eval" and r["reward"] >= 1)
        browser.close()


def test_an_online_dpo_run_writes_traces_and_tells_rollout_listeners(model_cache, tmp_path):
    """Class: rollout events fired by one algorithm only — an online_dpo run with the traces logger
    wrote no training samples, and its rollouts never reached on_rollout_end listeners."""
    from rllab.hookspecs import hookimpl
    from rllab.lab import Lab
    from rllab.training.trainer import run_experiment

    ended = []

    class Listener:
        @hookimpl
        def on_rollout_end(self, step, batch, metrics):
            ended.append((step, int(batch.input_ids.shape[0])))

    lab = Lab()
    lab.pm.register(Listener(), name="test-rollout-listener")
    args = [*overrides(TINY), "train.steps=2", "task.digits=1", "task.format_weight=0.5", "algorithm=online_dpo",
            "train.eval_every=0", TRACES]
    run_experiment(load_config(None, args, lab=lab), lab=lab, run_dir=tmp_path / "dpo", progress=False)
    recs = [r for r in read_traces(tmp_path / "dpo" / "traces.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 1, 1, 2, 2, 2]
    assert ended == [(1, 16), (2, 16)]  # 4 prompts × 4 samples, every one kept
    for r in recs:
        n = len(r["tokens"])
        assert len(r["sampler_logprobs"]) == len(r["advantages"]) == n
        # no advantages and no trainer log-probs of the sampled rows: DPO's forwards are of its pairs alone
        assert set(r["advantages"]) <= {0.0} and r["trainer_logprobs"] is None and r["mismatch"] is None


def test_an_algorithm_that_never_announces_its_rollouts_still_reaches_the_listeners(model_cache, tmp_path):
    """The kernel fires the rollout events, not the algorithm: a third-party algorithm whose step
    calls ctx.rollout.sample and ctx.rollout.to_batch alone (no rllab.algorithm helper) has its
    batches announced (on_rollout_end) and its samples traced after its step (no advantages)."""
    import attrs

    import rllab
    from rllab.hookspecs import hookimpl
    from rllab.lab import Lab
    from rllab.training.trainer import run_experiment

    @attrs.frozen
    class PlainConfig:
        pass

    class Plain:
        def needs(self, ctx):
            return set()

        def step(self, ctx):
            rollouts = ctx.rollout.sample(ctx.step)
            batch = ctx.rollout.to_batch(rollouts)
            return {"plain/rows": float(batch.input_ids.shape[0])}
            yield  # a generator that asks for no optimizer step

    class Plugin:
        @rllab.hookimpl
        def register_algorithms(self, register):
            register("plain", lambda *, config: Plain(), config=PlainConfig, uses={"task", "backend", "sampler"})

    ended = []

    class Listener:
        @hookimpl
        def on_rollout_end(self, step, batch, metrics):
            ended.append((step, int(batch.input_ids.shape[0])))

    lab = Lab([Plugin()])
    lab.pm.register(Listener(), name="test-rollout-listener")
    args = [*overrides(TINY), "train.steps=2", "task.digits=1", "algorithm=plain", "train.eval_every=0", TRACES]
    run_experiment(load_config(None, args, lab=lab), lab=lab, run_dir=tmp_path / "plain", progress=False)
    assert ended == [(1, 16), (2, 16)]  # 4 prompts × 4 samples, every one kept, each step's batch once
    recs = [r for r in read_traces(tmp_path / "plain" / "traces.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 1, 1, 2, 2, 2]  # per_step = 3 of each step's 16
    assert all(set(r["advantages"]) <= {0.0} and r["trainer_logprobs"] is None for r in recs)
    rows = [json.loads(line) for line in (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()]
    assert [r["plain/rows"] for r in rows if "plain/rows" in r] == [16.0, 16.0]
