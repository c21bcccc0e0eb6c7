"""A step's named ``time/…`` phases and ``time/other`` add up to ``time/step``, synchronous and
asynchronous (rllab.training.trainer.STEP_PHASES / ASYNC_STEP_PHASES), and what no phase covers
stays small against the step."""

from __future__ import annotations

import json

import pytest

from rllab.config import load_config
from rllab.training.trainer import ASYNC_STEP_PHASES, STEP_PHASES, run_experiment

from .tiny import TINY, overrides


@pytest.mark.parametrize("phases, extra", [(STEP_PHASES, []), (ASYNC_STEP_PHASES, ["rollout.max_staleness=1"])], ids=["sync", "async"])
def test_the_phases_add_up_to_the_step(model_cache, tmp_path, phases, extra):
    run_dir = tmp_path / "run"
    run_experiment(load_config(None, [*overrides(TINY), "train.steps=3", *extra]), run_dir=run_dir, progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r]
    assert len(steps) == 3
    for r in steps:
        named = sum(r.get(f"time/{p}", 0.0) for p in phases)
        assert {"time/update", "time/batch", "time/other"} <= set(r)
        assert named + r["time/other"] == pytest.approx(r["time/step"], abs=1e-9)
        assert r["time/other"] < 0.5 * r["time/step"]  # the named phases hold most of the step
