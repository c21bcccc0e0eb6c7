"""The determinism contract: two runs of one config on one machine log the same values, value for
value (timings and memory aside), and record the same provenance.

Covered here: a synchronous run, asynchronous rollouts with k = 2 (``rollout.max_staleness``),
LoRA, an environment, and a suite cell (through ``rllab reproduce --cell``; marked slow). Covered elsewhere: a
resumed run against an uninterrupted one (tests/test_trainer.py, kill -9 and resume; with k = 2,
tests/test_async.py; with LoRA, tests/test_lora.py; with a stateful sampler, tests/test_sampling.py),
and an asynchronous run built twice in one process (tests/test_async.py).
Every run trains on ``rollout.random_reward = given`` (a reward of 1 with probability 0.5) with an
entropy bonus, so each step's update moves the weights whatever the tiny model answers.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rllab.records import machine, provenance
from rllab.config import load_config
from rllab.training.reproduce import UNCOMPARED

from .tiny import TINY, overrides

ROOT = Path(__file__).resolve().parents[1]
BASE = [*overrides(TINY), "train.steps=3", "train.eval_size=8", "rollout.random_reward=given", "algorithm.entropy_coef=0.05",
        "train.warmup_steps=0", "train.lr=3e-3"]


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


pytestmark = pytest.mark.usefixtures("fixed_checkout")


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(UNCOMPARED)} for x in (run / "metrics.jsonl").read_text().splitlines()]


def twice(tmp_path, args, plugins=()):
    from rllab import Lab
    from rllab.training.trainer import run_experiment

    out = []
    for name in ("a", "b"):
        lab = Lab(plugins=list(plugins))
        run_experiment(load_config(None, args, lab=lab), lab=lab, run_dir=tmp_path / name, progress=False)
        out.append(tmp_path / name)
    a, b = out
    assert provenance.differences(provenance.read(a), provenance.read(b)) == []
    ra, rb = rows(a), rows(b)
    assert [r["step"] for r in ra] == [0, 1, 2, 3, 3]  # the start's evaluation, three steps, the final evaluation
    assert ra == rb
    trained = [r for r in ra if "loss/policy" in r]
    assert any(r["loss/policy"] != 0 for r in trained) and all(r["actor/grad_norm"] > 0 for r in trained)  # the weights moved
    return ra


def test_a_synchronous_run_is_identical_twice(tmp_path):
    twice(tmp_path, BASE)


def test_an_asynchronous_run_with_k2_is_identical_twice(tmp_path):
    got = twice(tmp_path, [*BASE, "rollout.max_staleness=2"])
    assert any(r.get("async/staleness_max", 0) > 0 for r in got)  # batches really were sampled ahead


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="LoRA needs peft (the 'lora' extra)")
def test_a_lora_run_is_identical_twice(tmp_path):
    got = twice(tmp_path, [*BASE, "model.lora.r=4", "train.lr=1e-2"])
    counted = [r for r in got if "model/trainable_params" in r]
    assert counted and all(r["model/trainable_params"] < r["model/params"] for r in counted)  # only the adapters trained


def test_an_environment_run_is_identical_twice(tmp_path):
    got = twice(tmp_path, [*BASE, "env=retry_addition", "env.tries=2"], plugins=[str(ROOT / "examples" / "retry_env.py")])
    assert any("env/turns" in r for r in got)


@pytest.mark.slow  # about 30 s: a suite in a worker process, then the rerun
def test_a_suite_cell_reruns_identically_and_the_suite_records_its_starts(tmp_path, capsys):
    from rllab import Lab
    from rllab.cli import main
    from rllab_suite.suite import run_suite

    data = {"name": "det", "preset": "grpo", "steps": 2, "seeds": [0], "tasks": ["addition"], "overrides": dict(TINY),
            "variants": {"grpo": {"rollout.random_reward": "given"}, "rloo": {"rollout.random_reward": "given", "advantage": "rloo"}}}
    out = tmp_path / "suite"
    run_suite(data, directory=out, workers=1, lab=Lab(), progress=False, check_identical=False)
    record = provenance.read(out)
    cell = json.loads((out / "suite.json").read_text())["cells"][0]
    runs = [c["run"] for c in json.loads((out / "suite.json").read_text())["cells"]]
    start = provenance.read(out / "runs" / cell["run"])["hashes"]["start"]["sha256"]
    assert record["starts"] == {start: runs} and record["cells"][0]["start"] == start  # one start for every cell
    assert record["cells"][0]["threads"] == provenance.read(out / "runs" / cell["run"])["machine"]["torch"]["threads"]
    assert record["libraries"]["torch"] and record["machine"]["torch"]["threads"] >= 1
    # the cells ran in worker processes, which read the checkout's git state themselves: record it as this process sees it
    for name in runs:
        rec = provenance.read(out / "runs" / name)
        rec["code"]["git"] = machine.git_state()  # as patched by fixed_checkout
        provenance.write(out / "runs" / name, rec)
    capsys.readouterr()
    code = main(["reproduce", str(out), "--cell", "grpo/0", "--run-dir", str(tmp_path / "again"), "-q"])
    text = capsys.readouterr().out
    assert code == 0 and "identical" in text, text
    # every cell: identical
    assert main(["reproduce", str(out), "--run-dir", str(tmp_path / "all"), "-q"]) == 0
    assert "identical: all 2 cells" in capsys.readouterr().out
    # recorded under another torch: the cells are not called identical; the report's order is compared
    for name in runs:
        rec = provenance.read(out / "runs" / name)
        rec["libraries"]["torch"] = "0.0.1"
        provenance.write(out / "runs" / name, rec)
    code = main(["reproduce", str(out), "--run-dir", str(tmp_path / "other"), "-q"])
    text = capsys.readouterr().out
    assert code == 2, text
    assert "provenance differs (libraries.torch)" in text and "order on addition (same)" in text and "identical: all" not in text
