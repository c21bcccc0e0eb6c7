"""Careless use of ``rllab compare``, ``rllab suite``, ``rllab record`` and ``rllab replay``: each
mistake is refused with a message naming it, or does what it says — never accepted and wrong."""

from __future__ import annotations

import json
import textwrap

import pytest

from rllab.cli import main
from tests.tiny import TINY

from .test_suite import _fake_run

SMALL = {**TINY, "train.eval_every": 1}


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def _suite_file(path, **extra) -> None:
    over = "\n".join(f'"{k}" = {v}' for k, v in SMALL.items())
    more = "\n".join(f"{k} = {v}" for k, v in extra.items())
    path.write_text(textwrap.dedent('''
        name = "m"
        preset = "grpo"
        steps = 2
        seeds = 1
        tasks = ["addition"]
        {more}
        [overrides]
        {over}
        [variants]
        grpo = {{}}
    ''').format(over=over, more=more))


# --------------------------------------------------------------------------- compare


def test_compare_refuses_one_run_given_twice(tmp_path, capsys, monkeypatch):
    """Class: comparisons pool different experiments (here: one run counted as two seeds). The
    same run directory twice, or under two spellings, is refused, naming it."""
    _fake_run(tmp_path / "runs" / "a", seed=0, acc=[0.1, 0.2, 0.3])
    _fake_run(tmp_path / "runs" / "b", seed=1, acc=[0.1, 0.2, 0.4])
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "runs/a", "runs/b", "runs/a", "--out", "cmp"]) == 1
    err = capsys.readouterr().err
    assert "run directory runs/a is given twice" in err and not (tmp_path / "cmp").exists()
    assert main(["compare", "runs/a", "./runs/a/", "runs/b", "--out", "cmp"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "given twice (as runs/a and as runs/a)" not in err and "runs/a is given twice" in err
    (tmp_path / "link").symlink_to(tmp_path / "runs" / "b")
    assert main(["compare", "runs/a", "runs/b", "link", "--out", "cmp"]) == 1
    assert "given twice (as runs/b and as link)" in " ".join(capsys.readouterr().err.split())
    assert main(["compare", "runs/a", "runs/b", "--out", "cmp"]) == 0


def test_compare_refuses_two_copies_of_one_seed(tmp_path, capsys):
    """Class: comparisons pool different experiments. Two directories of the same experiment and
    seed (a copy, or a rerun) would be counted as two seeds: refused, naming both."""
    import shutil

    _fake_run(tmp_path / "a", seed=0, acc=[0.1, 0.2, 0.3])
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    _fake_run(tmp_path / "b", seed=1, acc=[0.1, 0.2, 0.4])
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "copy"), "--out", str(tmp_path / "cmp")]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"{tmp_path / 'a'} and {tmp_path / 'copy'} are the same experiment with the same seed" in err
    assert "train.seed = 0" in err


# --------------------------------------------------------------------------- suite


def test_suite_finishes_a_cell_stopped_before_final_json(tmp_path, capsys):
    """Class: a suite that cannot be resumed. A cell killed after its final checkpoint but before
    writing ``final.json`` is finished by ``rllab suite DIR`` (its summary written from the final
    evaluation the checkpoint holds), not failed with "already finished" on every rerun."""
    f, d = tmp_path / "s.toml", tmp_path / "d"
    _suite_file(f)
    flags = ["--workers", "1", "-q", "--no-identical-check"]
    assert main(["suite", str(f), "--dir", str(d), *flags]) == 0
    (cell,) = (d / "runs").iterdir()
    final = json.loads((cell / "final.json").read_text())
    rows = (cell / "metrics.jsonl").read_text()
    (cell / "final.json").unlink()  # as if killed between the last checkpoint and final.json
    capsys.readouterr()
    assert main(["suite", str(d), *flags]) == 0
    out = capsys.readouterr().out
    assert "1 to run" in out and "failed" not in out
    again = json.loads((cell / "final.json").read_text())
    assert again["final/accuracy"] == final["final/accuracy"] and again["steps"] == 2
    assert (cell / "metrics.jsonl").read_text() == rows  # nothing trained or evaluated again
    assert not (cell / "error.txt").exists()
