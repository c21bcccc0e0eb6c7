"""rllab_tui: the Textual front end of rllab suite, driven headless with Pilot and in tmux."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("textual")

from rllab_suite.spec import expand, parse_suite  # noqa: E402
from rllab_tui import state  # noqa: E402
from rllab_tui.app import SuiteApp  # noqa: E402
from rllab_tui.kernel import dump_toml  # noqa: E402

SMALL = {
    "model.tiny.hidden_size": 64,
    "model.tiny.intermediate_size": 128,
    "model.warm_start.steps": 60,
    "model.warm_start.eval_limit": 0,
    "rollout.prompts_per_step": 4,
    "rollout.group_size": 4,
    "rollout.max_new_tokens": 6,
    "train.eval_size": 16,
    "train.checkpoint_every": 0,
    "train.eval_every": 1,
}


def suite_data(**over) -> dict:
    data = {"name": "t", "preset": "grpo", "steps": 4, "seeds": 3, "tasks": ["addition"], "baseline": "grpo", "overrides": dict(SMALL),
            "variants": {"grpo": {}, "rloo": {"advantage": "rloo"}}}
    data.update(over)
    return data


def fake_run(run_dir: Path, *, steps: int, done: int, accuracy: list[float], failed: str = "", finished: bool = True) -> None:
    """A run directory as the trainer leaves it: metrics.jsonl, and final.json or error.txt."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(f"[train]\nsteps = {steps}\nseed = 0\n\n[task]\nname = \"addition\"\n")
    rows = []
    for step in range(done + 1):
        if step:
            rows.append({"step": step, "rollout/reward": accuracy[step] * 0.9, "loss/policy": 0.01 * step, "time/step": 0.5})
        rows.append({"step": step, "eval/accuracy": accuracy[step], "eval/reward": accuracy[step], "time/eval": 0.1})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "log.txt").write_text(f"training {run_dir.name}\nstep {done}\n")
    if failed:
        (run_dir / "error.txt").write_text(f"Traceback (most recent call last):\nValueError: {failed}\n")
    elif finished:
        (run_dir / "final.json").write_text(json.dumps({"final/accuracy": accuracy[done], "steps": steps}))


@pytest.fixture
def suite_dir(tmp_path, lab):
    """A suite directory with 6 cells: 4 done, 1 failed, 1 interrupted halfway."""
    file = tmp_path / "t.toml"
    file.write_text(dump_toml(suite_data()))
    out = tmp_path / "out"
    cells = expand(parse_suite(file), lab=lab)
    (out / "runs").mkdir(parents=True)
    shutil.copyfile(file, out / "suite.toml")
    manifest = {"name": "t", "baseline": "grpo", "variants": ["grpo", "rloo"], "cells": [c.to_dict() for c in cells]}
    (out / "suite.json").write_text(json.dumps(manifest))
    for c in cells:
        run = out / "runs" / c.slug
        base = 0.3 + 0.1 * c.seed + (0.2 if c.variant == "rloo" else 0.0)
        acc = [min(1.0, base + 0.05 * s) for s in range(5)]
        if c.variant == "rloo" and c.seed == 2:
            fake_run(run, steps=4, done=2, accuracy=acc, failed="boom in rloo")
        elif c.variant == "grpo" and c.seed == 2:
            fake_run(run, steps=4, done=2, accuracy=acc, finished=False)
        else:
            fake_run(run, steps=4, done=4, accuracy=acc)
    return out


def screen_text(app) -> str:
    """What the terminal shows, as plain text (the screen's rendered lines)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def run_app(app, body, size=(80, 24)):
    async def go():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await body(pilot)

    asyncio.run(go())


# --------------------------------------------------------------------------- state, without a screen


def test_grid_writes_a_suite_file_that_rllab_suite_reads(tmp_path, lab):
    g = state.Grid(name="g", preset="grpo", steps=3, seeds=[0, 1], tasks=["addition", {"name": "sort", "max_length": 4}],
                   overrides=dict(SMALL), axes={"advantage": ["grpo", "rloo"], "policy_loss.clip_high": [0.2, 0.28]})
    path = tmp_path / "g.toml"
    path.write_text(g.to_toml())
    suite = parse_suite(path)
    assert suite.variant_names == [f"advantage={a},clip_high={c}" for a in ("grpo", "rloo") for c in (0.2, 0.28)]
    cells = expand(suite, lab=lab)
    assert len(cells) == 4 * 2 * 2
    assert {c.config["task"].get("max_length") for c in cells if c.task == "sort"} == {4}
    again = state.Grid.from_file(path)
    assert again.to_dict() == g.to_dict()


def test_axis_values_are_validated_against_the_base_config(lab):
    g = state.Grid(overrides=dict(SMALL), steps=2)
    assert state.parse_axis("policy_loss.clip_high = 0.2, 0.28") == ("policy_loss.clip_high", [0.2, 0.28])
    assert state.parse_axis("advantage=[\"grpo\", \"rloo\"]") == ("advantage", ["grpo", "rloo"])
    assert state.check_axis(lab, g, "advantage", ["grpo", "rloo"]) == []
    problems = state.check_axis(lab, g, "advantage", ["grpo", "rlooo"])
    assert len(problems) == 1 and "rlooo" in problems[0] and "rloo" in problems[0]
    assert state.check_axis(lab, g, "policy_loss.clip_hgh", [0.2])
    with pytest.raises(ValueError):
        state.parse_axis("advantage")


def test_step_time_estimate_comes_from_measured_runs(suite_dir):
    per_step, n = state.step_seconds(suite_dir)
    assert n == 6 and per_step == pytest.approx(0.5 + 0.1 * 5 / 4, rel=0.3)
    assert state.step_seconds(suite_dir / "nothing") == (state.DEFAULT_STEP_SECONDS, 0)
    assert state.estimate_seconds(6, 100, 0.5, 2) == 3 * 100 * 0.5
    assert state.fmt_seconds(125) == "2m05s"


def test_cells_read_from_a_suite_directory(suite_dir, lab):
    s = state.SuiteDir(lab, directory=suite_dir)
    assert s.file == suite_dir / "suite.toml" and len(s.cells) == 6
    assert s.counts() == {"queued": 0, "running": 0, "stopped": 1, "done": 4, "failed": 1}
    failed = next(c for c in s.cells if c.status == "failed")
    assert failed.error == "ValueError: boom in rloo" and failed.step == 2
    done = next(c for c in s.cells if c.status == "done")
    assert done.step == 4 and len(done.accuracies) == 5 and done.total == 4
    frac, left = s.progress(2)
    assert 0.8 < frac < 1.0 and left > 0
    # a line still being written is read once it is complete
    stopped = next(c for c in s.cells if c.status == "stopped")
    with (stopped.run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rollout/rew')
    s.refresh(True)
    assert stopped.step == 2 and stopped.status == "running"
    with (stopped.run_dir / "metrics.jsonl").open("a") as f:
        f.write('ard": 0.5, "time/step": 0.5}\n')
    s.refresh(True)
    assert stopped.step == 3 and stopped.reward == 0.5
    # adding a seed rewrites the suite file: two new queued cells
    assert s.add_seeds(1) == [0, 1, 2, 3]
    assert len(s.cells) == 8 and s.counts()["queued"] == 2
    assert parse_suite(s.file).seeds == (0, 1, 2, 3)


# --------------------------------------------------------------------------- the app, headless


def test_smoke(suite_dir, lab):
    app = SuiteApp(lab=lab, target=suite_dir, poll=0.2)

    async def body(pilot):
        await pilot.pause(0.5)
        print(screen_text(app))
        await pilot.press("4")
        await pilot.pause(1.5)
        print(screen_text(app))
        await pilot.press("1")
        await pilot.pause(0.3)
        print(screen_text(app))
        await pilot.press("2")
        await pilot.pause(1)
        print(screen_text(app))
        await pilot.press("question_mark")
        await pilot.pause(0.3)
        print(screen_text(app))

    run_app(app, body)
