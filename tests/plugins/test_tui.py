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

from tests.tiny import TINY
from rllab_suite.spec import expand, parse_suite  # noqa: E402
from rllab_tui import state  # noqa: E402
from rllab_tui.app import SuiteApp  # noqa: E402
from rllab.records.tomlio import dump_toml  # noqa: E402

SMALL = {**TINY, "train.eval_every": 1}


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


def test_a_grid_on_an_environment_validates_its_axes_on_the_environment(lab):
    """A grid whose task is an environment's name checks its axes with ``env = NAME`` (as the
    suite runs it), and the environment's knobs as ``env.KNOB``."""
    g = state.Grid(overrides=dict(SMALL), steps=2, tasks=[{"name": "guess", "high": 8}])
    assert ("env", "guess") in g.base_pairs({"guess"}) and ("env.high", 8) in g.base_pairs({"guess"})
    assert state.check_axis(lab, g, "advantage", ["grpo", "rloo"]) == []
    assert state.check_axis(lab, state.Grid(overrides=dict(SMALL), steps=2, tasks=[{"name": "guess", "hgh": 8}]),
                            "advantage", ["grpo"])


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


def table_rows(app, selector: str) -> list[list[str]]:
    from textual.widgets import DataTable

    table = app.query_one(selector, DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def wait_for(pilot, predicate, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("timed out; the screen shows:\n" + screen_text(pilot.app))
        await pilot.pause(0.1)


def test_live_view_shows_each_cell_and_the_selected_cells_metrics_and_log(suite_dir, lab):
    app = SuiteApp(lab=lab, target=suite_dir, poll=0.2)

    async def body(pilot):
        text = screen_text(app)
        assert "done 4/6" in text and "failed 1" in text and "stopped" in text
        for state_name in ("done", "failed", "stopped"):
            assert state_name in text
        rows = table_rows(app, "#live-cells")
        assert [r[0] for r in rows] == ["done", "done", "stopped", "done", "done", "failed"]
        assert rows[0][1:5] == ["grpo", "addition", "0", "4/4"] and rows[0][6] == "50.0" and rows[0][7]
        assert "rollout/reward" in text and "training grpo-addition-s0" in text  # the first cell's metrics and log
        await pilot.press(*["down"] * 5)  # the failed cell: its error, and its traceback as the log
        await pilot.pause()
        text = screen_text(app)
        assert "rloo · addition · s2" in text and "ValueError: boom in rloo" in text and "Traceback" in text

    run_app(app, body)


def _trace(step: int, group: int, prompt: str, answer: str, reward: float) -> dict:
    toks = list(answer) + ["<eos>"]
    n = len(toks)
    return {"step": step, "group": group, "prompt": prompt, "texts": [answer], "tokens": toks, "model": [True] * n, "turn": [1] * n,
            "reward": reward, "components": {}, "turns": 1, "length": n, "finish_reason": "stop", "staleness": None,
            "token_versions": None, "advantages": [0.5] * n, "sampler_logprobs": [-0.1] * n, "trainer_logprobs": [-0.1] * n,
            "mismatch": [0.0]}


def test_the_traces_view_shows_the_selected_cells_samples(suite_dir, lab):
    first = sorted((suite_dir / "runs").iterdir())[0]
    recs = [_trace(3, 0, "12+30=", "42", 1.0), _trace(4, 0, "77+11=", "88", 1.0), _trace(4, 1, "25+25=", "49", 0.0)]
    (first / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    app = SuiteApp(lab=lab, target=suite_dir, poll=0.2)

    async def body(pilot):
        await pilot.press("3")  # the live tab
        await pilot.pause()
        await pilot.press("v")
        await pilot.pause()
        text = screen_text(app)
        assert "77+11=" in text and "25+25=" in text and "12+30=" not in text  # the last traced step's samples
        assert "step 4 · group 1 · reward 0" in text
        await pilot.press("down")  # a cell without traces says how to get them
        await pilot.pause()
        assert "no traces for" in screen_text(app) and "traces" in screen_text(app)
        await pilot.press("v")  # back to the cell's log
        await pilot.pause()
        assert "no traces for" not in screen_text(app)

    run_app(app, body, size=(120, 40))


def test_results_are_rllab_suites_statistics_sortable_and_exported(suite_dir, lab):
    app = SuiteApp(lab=lab, target=suite_dir, poll=0.2)

    async def body(pilot):
        await pilot.press("4")
        await wait_for(pilot, lambda: "over tasks" in screen_text(app))
        rows = table_rows(app, "#res-table")
        assert [r[1] for r in rows] == ["grpo", "rloo"]
        assert rows[1][2] == "2 (1 failed)" and rows[1][4] == "75.0 [70.0, 80.0]"
        assert rows[0][2] == "2 (1 pending)" and rows[0][4] == "55.0 [50.0, 60.0]"
        text = screen_text(app)
        assert "FAILED rloo on addition seed 2" in text and "baseline" in text
        # the table follows the suite: the interrupted cell ends, and its row is recomputed
        run = next(c.run_dir for c in app.suite.cells if c.status == "stopped")
        fake_run_rest = {"step": 4, "eval/accuracy": 0.9, "eval/reward": 0.9}
        with (run / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(fake_run_rest) + "\n")
        (run / "final.json").write_text("{}")
        await wait_for(pilot, lambda: table_rows(app, "#res-table")[0][2] == "3")
        assert table_rows(app, "#res-table")[0][4].startswith("66.7 [")
        for _ in range(4):  # task, variant, runs, initial, final
            await pilot.press("o")
        await pilot.press("O")
        await pilot.pause()
        assert "sorted by final acc % [95% CI] ↓" in screen_text(app)
        assert [r[1] for r in table_rows(app, "#res-table")] == ["rloo", "grpo"]
        await pilot.press("e")
        await wait_for(pilot, lambda: (suite_dir / "final.png").is_file(), timeout=60)
        await pilot.pause(0.5)

    run_app(app, body)
    for name in ("report.md", "summary.csv", "summary.json", "runs.csv", "curves.png", "final.png"):
        assert (suite_dir / name).is_file(), name
    assert "| rloo | 2 (1 failed) |" in (suite_dir / "report.md").read_text()


def test_registry_browses_components_runs_the_contract_and_sees_a_new_plugin(tmp_path, lab, monkeypatch):
    import importlib.metadata

    app = SuiteApp(lab=lab, poll=0.2)

    async def body(pilot):
        assert app.query_one("#tabs").active == "registry"
        assert "advantage_estimator" in screen_text(app)
        for _ in range(200):  # the keyboard alone: down until the PPO clip loss is highlighted
            node = app.query_one("#reg-tree").cursor_node
            if node is not None and node.data is not None and node.data.name == "ppo_clip":
                break
            await pilot.press("down")
        await pilot.pause()
        text = screen_text(app)
        assert "ppo_clip" in text and "clip_high" in text and "provider: rllab_policy_losses" in text
        await pilot.press("c")
        await wait_for(pilot, lambda: any(r[1] == "pass" for r in table_rows(app, "#reg-contract")))
        rows = table_rows(app, "#reg-contract")
        assert rows[0] == ["builds with its default config", "pass", ""] and all(r[1] in ("pass", "skip") for r in rows)
        assert "pass" in screen_text(app)
        await pilot.press("a")  # the component as a grid axis
        await pilot.pause()
        assert app.query_one("#tabs").active == "grid" and app.query_one("#f-axis").value == "policy_loss = ppo_clip"
        await pilot.press("f2")  # "1" would be typed into the field
        await pilot.pause()
        # a plugin installed while the TUI is open appears on r
        (tmp_path / "tui_fresh_plugin.py").write_text(
            "import rllab\n"
            "@rllab.hookimpl\n"
            "def register_kl_penalties(register):\n"
            "    register('fresh_kl', lambda *, log_prob, ref_log_prob, config: log_prob * 0, summary='Freshly installed.')\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        real = importlib.metadata.entry_points
        fresh = importlib.metadata.EntryPoint("tui_fresh", "tui_fresh_plugin", "rllab")
        monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [*real(**kw), fresh] if kw.get("group") == "rllab" else real(**kw))
        assert "fresh_kl" not in [s.name for s in app.lab.specs()]
        await pilot.press("1", "r")
        await pilot.pause()
        assert "fresh_kl" in [s.name for s in app.lab.specs()]
        tree = app.query_one("#reg-tree")
        assert any(str(n.label) == "fresh_kl" for n in tree.root.children[2].children)  # kl_penalty

    run_app(app, body)
    sys.modules.pop("tui_fresh_plugin", None)


def test_grid_validates_axes_as_typed_shows_cells_and_saves_a_suite(tmp_path, lab, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = SuiteApp(lab=lab, poll=0.2)

    async def body(pilot):
        await pilot.press("2")
        await pilot.pause()
        assert app.focused.id == "grid-axes"
        app.query_one("#f-name").focus()
        await pilot.press("end")
        assert app.focused.id == "f-name"
        await pilot.press("ctrl+u", *"tiny")
        await pilot.press("tab", "tab", "ctrl+u", *"2")  # steps
        await pilot.press("tab", "ctrl+u", *"0, 1")  # seeds
        await pilot.press("tab", "tab", "tab", *"rollout.prompts_per_step=4")  # overrides
        await pilot.press("tab", *"advantage = grpo, rlooo")
        await wait_for(pilot, lambda: "rlooo" in screen_text(app) and "Did you mean" in screen_text(app))
        await pilot.press("backspace")
        await wait_for(pilot, lambda: "Did you mean" not in screen_text(app))
        await pilot.press("enter")
        await pilot.press(*"policy_loss.clip_hgh = 0.2", "enter")
        await wait_for(pilot, lambda: "clip_hgh" in screen_text(app))
        await pilot.press("ctrl+u", *"policy_loss.clip_high = 0.2, 0.28", "enter")
        await wait_for(pilot, lambda: "8 cells" in screen_text(app))
        text = screen_text(app)
        assert "4 variants × 1 tasks × 2 seeds" in text and "advantage=rloo,clip_high=0.28" in text and "s/step" in text
        assert [r[0] for r in table_rows(app, "#grid-axes")] == ["advantage", "policy_loss.clip_high"]
        await pilot.press("ctrl+s")
        await pilot.pause()

    run_app(app, body)
    suite = parse_suite(tmp_path / "suites" / "tiny.toml")
    assert suite.name == "tiny" and suite.seeds == (0, 1) and suite.steps == 2
    assert len(expand(suite, lab=lab)) == 8
    assert dict(suite.overrides)["rollout.prompts_per_step"] == 4


def test_start_stop_add_seed_and_reopen(suite_dir, lab, monkeypatch):
    monkeypatch.setattr(state.Runner, "command", lambda self: [sys.executable, "-c", "import time; time.sleep(60)"])
    app = SuiteApp(lab=lab, target=suite_dir / "suite.toml", directory=str(suite_dir), poll=0.2)

    async def body(pilot):
        assert app.focused.id == "live-cells"
        await pilot.press("s")
        await wait_for(pilot, lambda: app.runner.running and "ETA" in screen_text(app))
        assert [r[0] for r in table_rows(app, "#live-cells")].count("running") == 1  # the interrupted cell
        await pilot.press("plus")
        await wait_for(pilot, lambda: len(table_rows(app, "#live-cells")) == 8)
        assert [r[0] for r in table_rows(app, "#live-cells")].count("queued") == 2
        assert app.restart_pending  # the new seed runs when this pass ends
        proc = app.runner.proc
        await pilot.press("x")
        await wait_for(pilot, lambda: not app.runner.running)
        assert proc.poll() is not None and "stopped" in screen_text(app)
        await pilot.press("r")  # retry the failed cell: the suite starts again
        await wait_for(pilot, lambda: app.runner.running)
        proc = app.runner.proc
        await pilot.press("q")
        await pilot.pause()
        assert proc.poll() is not None  # quitting stops the suite; rllab suite resumes it

    run_app(app, body)
    assert parse_suite(suite_dir / "suite.toml").seeds == (0, 1, 2, 3)
    reopened = state.SuiteDir(lab, directory=suite_dir)
    assert len(reopened.cells) == 8 and reopened.counts()["done"] == 4


def test_help_theme_and_tabs_from_the_keyboard(suite_dir, lab):
    app = SuiteApp(lab=lab, target=suite_dir, poll=0.2, theme_name="light")

    async def body(pilot):
        assert app.theme == "textual-light"
        await pilot.press("question_mark")
        await pilot.pause()
        text = screen_text(app)
        assert "c contract suite" in text and "r retry failed cells" in text
        await pilot.press("escape")
        await pilot.press("t")
        assert app.theme == "textual-dark"
        for key, tab in (("1", "registry"), ("2", "grid"), ("f4", "live"), ("f5", "results"), ("f2", "registry")):
            await pilot.press(key)
            await pilot.pause()
            assert app.query_one("#tabs").active == tab
        await pilot.press("f3", "f1")  # F1 opens the help from a text field too
        await pilot.pause()
        assert "ctrl+s save" in screen_text(app)

    run_app(app, body)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_in_a_real_terminal_under_tmux(suite_dir, tmp_path):
    session = f"rllab-tui-{os.getpid()}"
    rllab = Path(sys.executable).with_name("rllab")
    cmd = f"cd {tmp_path} && {rllab if rllab.is_file() else sys.executable + ' -m rllab.cli'} tui {suite_dir}; sleep 5"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", cmd], check=True)

    def capture() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout

    def wait(needle: str, timeout: float = 90) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            text = capture()
            if needle in text:
                return text
            time.sleep(0.3)
        raise AssertionError(f"{needle!r} not on the screen:\n{capture()}")

    try:
        text = wait("done 4/6")
        assert "failed" in text and "rloo" in text
        assert max(len(line) for line in text.splitlines()) <= 80 and len(text.splitlines()) <= 24
        subprocess.run(["tmux", "send-keys", "-t", session, "?"], check=True)
        wait("r retry failed cells")
        subprocess.run(["tmux", "send-keys", "-t", session, "Escape"], check=True)
        time.sleep(1.0)  # a lone Escape is told from an escape sequence by the pause after it
        subprocess.run(["tmux", "send-keys", "-t", session, "4"], check=True)
        wait("over tasks")
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        end = time.monotonic() + 20
        while "over tasks" in capture() and time.monotonic() < end:
            time.sleep(0.3)
        assert "over tasks" not in capture()  # the app has exited
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


@pytest.mark.slow
def test_runs_a_suite_of_short_runs_live(tmp_path, lab, monkeypatch):
    """A real suite (2 variants × 1 seed × 2 steps) started from the live view, to the results."""
    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path / "cache"))
    file = tmp_path / "live.toml"
    file.write_text(dump_toml(suite_data(name="live", steps=2, seeds=1, baseline=None)))
    app = SuiteApp(lab=lab, target=file, directory=str(tmp_path / "out"), workers=1, identical_check=False, poll=0.5)

    async def body(pilot):
        assert "0/2" in screen_text(app)
        await pilot.press("s")
        await wait_for(pilot, lambda: not app.runner.running and app.suite.counts()["done"] == 2, timeout=400)
        await pilot.press("4")
        await wait_for(pilot, lambda: len(table_rows(app, "#res-table")) == 2 and table_rows(app, "#res-table")[0][2] == "1")

    run_app(app, body)
    assert app.runner.returncode == 0


def test_grid_run_saves_opens_and_starts_and_open_reads_a_directory(suite_dir, tmp_path, lab, monkeypatch):
    monkeypatch.setattr(state.Runner, "command", lambda self: [sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.chdir(tmp_path)
    app = SuiteApp(lab=lab, poll=0.2)

    async def body(pilot):
        await pilot.press("2")
        await pilot.pause()
        app.query_one("#f-name").focus()
        await pilot.press("end", "ctrl+u", *"quick", "tab", "tab", "ctrl+u", "2", "tab", "ctrl+u", "1")  # name, steps, seeds
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.runner is not None and app.runner.running)
        assert app.query_one("#tabs").active == "live" and app.suite.file == Path("suites/quick.toml")
        assert len(table_rows(app, "#live-cells")) == 1 and app.suite.directory == Path("suites/quick")
        await pilot.press("x")
        await wait_for(pilot, lambda: not app.runner.running)
        await pilot.press("f3")
        await pilot.pause()
        assert app.focused.id == "grid-axes"
        app.query_one("#f-file").focus()
        await pilot.press("end")
        assert app.focused.id == "f-file"
        await pilot.press("ctrl+u", *str(suite_dir), "ctrl+o")
        await wait_for(pilot, lambda: app.suite.directory == suite_dir and "done 4/6" in screen_text(app))

    run_app(app, body)


def test_a_cells_step_column_widens_as_its_count_grows(suite_dir, lab):
    """Class: a display that is silently wrong. A cell updated in place from "2/12" to "12/12" kept
    the column's first width, so a finished cell read "12/1" (seen as "20/2" for 20 steps)."""
    app = SuiteApp(lab=lab, target=suite_dir, poll=0.2)

    async def body(pilot):
        c = app.suite.cells[0]
        c.total, c.step = 12, 2
        await wait_for(pilot, lambda: "2/12" in screen_text(app))
        c.step = 12
        table = app.query_one("#live-cells")
        await wait_for(pilot, lambda: table.get_cell(str(c.run_dir), "step") == "12/12")
        # the table recomputes its column widths on its next refresh, not when the cell changes:
        # wait for it (a width that never grows times out and fails, showing the screen)
        await wait_for(pilot, lambda: table.columns["step"].content_width >= len("12/12"))

    run_app(app, body, size=(120, 24))


def test_a_digit_after_opening_the_grid_switches_tabs_instead_of_renaming_the_suite(tmp_path, lab, monkeypatch):
    """Class: input silently taken as something else. Opening the grid focused its name field, so
    the next tab key (`3`) was typed into the suite's name instead of switching to the live tab."""
    monkeypatch.chdir(tmp_path)
    app = SuiteApp(lab=lab, poll=0.2)

    async def body(pilot):
        await pilot.press("2")
        await pilot.pause()
        name = app.query_one("#f-name").value
        await pilot.press("3")
        await pilot.pause()
        assert app.query_one("#tabs").active == "live" and app.query_one("#f-name").value == name

    run_app(app, body)
