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


def test_compare_out_must_be_a_directory_of_its_own(tmp_path, capsys):
    """Class: a command that destroys what it was not asked to touch. ``--out`` naming a run
    directory replaced the run's ``curves.png`` with the comparison's; a suite directory would lose
    its report; a file ended in a traceback. Each is refused, naming it."""
    _fake_run(tmp_path / "a", seed=0, acc=[0.1, 0.2, 0.3])
    _fake_run(tmp_path / "b", seed=1, acc=[0.1, 0.2, 0.4])
    (tmp_path / "a" / "curves.png").write_bytes(b"the run's own plot")
    suite_dir = tmp_path / "s"
    suite_dir.mkdir()
    (suite_dir / "suite.json").write_text("{}")
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    for out, said in ((tmp_path / "a", "is a run directory"), (suite_dir, "is a suite directory"), (tmp_path / "a" / "config.toml", "is a file")):
        assert main(["compare", *runs, "--out", str(out)]) == 1
        err = " ".join(capsys.readouterr().err.split())
        assert f"--out {out} {said}" in err and "choose another --out" in err
    assert (tmp_path / "a" / "curves.png").read_bytes() == b"the run's own plot" and not (tmp_path / "a" / "report.md").exists()
    assert main(["compare", *runs, "--out", str(tmp_path / "cmp")]) == 0


def test_suite_dir_that_is_a_run_or_a_file_is_refused(tmp_path, capsys):
    """Class: suites run or pool things that are not what they claim. ``--dir`` naming a run
    directory ran the suite into it (its runs, suite.json and report beside the run's files); a
    file ended in a traceback."""
    f = tmp_path / "s.toml"
    _suite_file(f)
    _fake_run(tmp_path / "run", seed=0, acc=[0.1, 0.2, 0.3])
    for d, said in ((tmp_path / "run", "is a run directory"), (f, "is a file")):
        assert main(["suite", str(f), "--dir", str(d), "--workers", "1", "-q"]) == 1
        assert said in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "run" / "suite.json").exists() and not (tmp_path / "run" / "runs").exists()


def test_suite_report_refuses_options_it_would_ignore(tmp_path, capsys):
    """Class: options accepted and ignored. ``rllab suite report DIR`` runs nothing: ``--workers``,
    ``--executor``, ``--address``, ``--replace``, ``--no-identical-check`` and a second directory
    (``--dir``) were silently ignored."""
    d = tmp_path / "s"
    d.mkdir()
    for extra, said in ((["--workers", "2"], "--workers"), (["--replace", "--no-identical-check"], "--replace, --no-identical-check"),
                        (["--executor", "ray"], "--executor"), (["--dir", str(tmp_path / "other")], "takes one suite directory")):
        assert main(["suite", "report", str(d), *extra]) == 1
        assert said in " ".join(capsys.readouterr().err.split()), extra
    assert main(["suite", "report", str(d), "--dir", str(d)]) == 1  # the same directory twice is fine: then no manifest
    assert "not a suite directory" in capsys.readouterr().err


# --------------------------------------------------------------------------- record / replay


def test_record_out_never_replaces_a_checkpoint(tmp_path, capsys):
    """Class: a command that destroys what it was not asked to touch. ``--out`` naming a run's
    checkpoint (a torch file, like a recording) replaced the checkpoint with the recording."""
    import torch

    ckpt = tmp_path / "state.pt"
    torch.save({"policy": {}, "optimizer": {}, "step": 2}, ckpt)
    before = ckpt.read_bytes()
    assert main(["record", "--out", str(ckpt), "-q", *(f"{k}={v}" for k, v in SMALL.items())]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"--out {ckpt} exists and is not a recording" in err and ckpt.read_bytes() == before


def test_replay_refuses_a_repeated_variant_or_key(tmp_path, capsys):
    """Class: comparisons that compare nothing. The same variant twice was replayed and reported
    as its own twin; one variant setting a key twice (``policy_loss=cispo,policy_loss.name=gspo``)
    kept the last silently while its label named both."""
    rec = str(tmp_path / "rec.pt")  # refused before the recording is read
    assert main(["replay", rec, "policy_loss=cispo", "policy_loss=cispo"]) == 1
    assert "variant 'policy_loss=cispo' is given twice" in capsys.readouterr().err
    assert main(["replay", rec, "policy_loss=cispo,policy_loss.name=gspo"]) == 1
    assert "sets policy_loss twice" in " ".join(capsys.readouterr().err.split())
    assert main(["replay", rec, "algorithm.minibatches=2,algorithm.minibatches=4"]) == 1
    assert "sets algorithm.minibatches twice" in " ".join(capsys.readouterr().err.split())


def test_a_dry_run_into_a_directory_holding_another_suite_is_refused_as_the_run_would_be(tmp_path, capsys):
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "benchmarks" / "suites" / "controls.toml"
    (tmp_path / "suite.json").write_text(json.dumps({"name": "other"}))
    assert main(["suite", str(shipped), "--dir", str(tmp_path), "--dry-run"]) == 1
    assert f"{tmp_path} holds suite 'other', not 'controls'" in capsys.readouterr().err
    assert main(["suite", str(shipped), "--dir", str(tmp_path), "--dry-run", "--replace"]) == 0  # listed; nothing forgotten yet
    assert (tmp_path / "suite.json").is_file() and json.loads((tmp_path / "suite.json").read_text()) == {"name": "other"}
