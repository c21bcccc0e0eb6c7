"""Trying a suite small: ``rllab suite FILE --dry-run`` lists its cells without running anything,
and ``--steps N --seeds K`` run a smaller copy of it (``NAME-try``, a directory of its own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rllab.cli import main
from rllab_suite.spec import SuiteError, parse_suite
from rllab_suite.suite import shrink
from tests.tiny import TINY

SMALL = {**TINY, "train.eval_every": 1}


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def _suite_file(path: Path) -> Path:
    path.write_text('name = "tiny"\npreset = "grpo"\nsteps = 3\nseeds = [0, 1, 2]\ntasks = ["addition"]\n'
                    '[variants.grpo]\n[variants.rloo]\nadvantage = "rloo"\n[overrides]\n'
                    + "".join(f'"{k}" = {json.dumps(v)}\n' for k, v in SMALL.items()))
    return path


def test_shrink_keeps_the_first_seeds_and_sets_the_steps(tmp_path):
    suite = parse_suite(_suite_file(tmp_path / "s.toml"))
    small = shrink(suite, steps=1, seeds=2)
    assert (small.name, small.steps, small.seeds) == ("tiny-try", 1, (0, 1))
    assert shrink(suite) is suite
    assert shrink(suite, seeds=1).steps == 3
    with pytest.raises(SuiteError, match="has 3 seed"):
        shrink(suite, seeds=4)


def test_dry_run_lists_the_cells_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = _suite_file(tmp_path / "s.toml")
    assert main(["suite", str(f), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 variants × 1 tasks × 3 seeds = 6 runs" in out and "suites/tiny" in out
    assert out.count("to run") == 6 and "dry run: nothing ran; 6 of 6 runs to go" in out
    assert not (tmp_path / "suites").exists()
    assert main(["suite", str(f), "--dry-run", "--steps", "1", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 variants × 1 tasks × 1 seeds = 2 runs" in out and "suites/tiny-try" in out
    assert out.count("to run") == 2 and "--steps 1 --seeds 1" in out
    rows = [line.split() for line in out.splitlines() if "to run" in line and "addition" in line]
    assert {r[3] for r in rows} == {"1"}  # every cell trains one step


def test_a_tried_suite_runs_in_its_own_directory(tmp_path, capsys):
    f = _suite_file(tmp_path / "s.toml")
    d = tmp_path / "try"
    assert main(["suite", str(f), "--steps", "1", "--seeds", "1", "--dir", str(d), "-q", "--no-identical-check", "--workers", "1"]) == 0
    capsys.readouterr()
    finals = sorted((d / "runs").glob("*/final.json"))
    assert len(finals) == 2 and all(json.loads(p.read_text())["steps"] == 1 for p in finals)
    assert main(["suite", str(f), "--steps", "1", "--seeds", "1", "--dir", str(d), "--dry-run"]) == 0
    assert capsys.readouterr().out.count(" done ") == 2


def test_report_refuses_the_try_options(tmp_path, capsys):
    assert main(["suite", "report", str(tmp_path), "--dry-run"]) == 1
    assert "apply to running a suite" in capsys.readouterr().err
