"""``rllab reproduce``: a faithful rerun is identical; an altered recorded value is named with its
step and metric; a differing provenance is listed, never called identical; ``--start`` reruns
from an exported start; ``--cell`` finds a suite cell."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rllab.records import machine, provenance
from rllab.cli import main
from rllab.config import load_config
from rllab.training.reproduce import Difference, first_difference

from .tiny import TINY, overrides


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


pytestmark = pytest.mark.usefixtures("fixed_checkout")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, model_cache):
    from _pytest.monkeypatch import MonkeyPatch

    from rllab.training.trainer import run_experiment

    mp = MonkeyPatch()
    mp.setattr(machine, "git_state", lambda where=None: {"commit": "c0ffee", "diff_sha256": "0" * 64, "dirty": False})
    run = tmp_path_factory.mktemp("recorded") / "run"
    run_experiment(load_config(None, [*overrides(TINY), "task.digits=1", "rollout.random_reward=given", "train.steps=2", "train.eval_size=8"]), run_dir=run, progress=False)
    mp.undo()
    return run


def _copy(run, tmp_path, name="copy"):
    dest = tmp_path / name
    shutil.copytree(run, dest)
    return dest


def test_first_difference_names_the_first_step_and_metric():
    a = {0: {"eval/accuracy": 0.5, "time/eval": 1.0}, 1: {"loss": 0.25, "kl": 0.0, "perf/peak_rss_mb": 3.0}, 2: {"loss": 0.5}}
    same = {0: {"eval/accuracy": 0.5, "time/eval": 9.0}, 1: {"loss": 0.25, "kl": 0.0, "perf/peak_rss_mb": 4.0}, 2: {"loss": 0.5}}
    assert first_difference(a, same) == (None, 4)  # timings and memory are not compared
    b = {0: dict(a[0]), 1: {"loss": 0.25, "kl": 1e-12}, 2: {"loss": 0.75}}
    assert first_difference(a, b) == (Difference(1, "kl", 0.0, 1e-12), 2)
    c = {0: dict(a[0]), 1: {"loss": 0.25, "kl": 0.0, "extra": 1.0}, 2: {"loss": 0.5}}
    assert first_difference(a, c)[0] == Difference(1, "extra", None, 1.0)
    assert first_difference(a, {0: a[0], 1: a[1]})[0] == Difference(2, "(the whole step)", "logged", None)
    assert first_difference({0: {"x": float("nan")}}, {0: {"x": float("nan")}}) == (None, 1)
    assert first_difference(a, b, steps=[0]) == (None, 1)


def test_a_faithful_rerun_is_identical(recorded, tmp_path, capsys):
    code = main(["reproduce", str(recorded), "--run-dir", str(tmp_path / "again"), "-q"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "identical" in out
    assert json.loads((tmp_path / "again" / "provenance.json").read_text())["hashes"]["start"] == json.loads(
        (recorded / "provenance.json").read_text())["hashes"]["start"]


def test_an_altered_recorded_value_is_named_by_step_and_metric(recorded, tmp_path, capsys):
    run = _copy(recorded, tmp_path)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["step"] == 2 and "actor/entropy" in r)
    row["actor/entropy"] += 1e-9
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["reproduce", str(run), "--run-dir", str(tmp_path / "again"), "-q"])
    out = capsys.readouterr().out
    assert code == 1
    assert "different" in out and "step 2, actor/entropy" in out and repr(row["actor/entropy"]) in out
    assert "identical" not in out


def test_a_differing_provenance_is_listed_and_only_the_start_evaluation_compared(recorded, tmp_path, capsys):
    run = _copy(recorded, tmp_path)
    rec = json.loads((run / "provenance.json").read_text())
    rec["libraries"]["torch"] = "0.0.1"  # as if recorded with another torch
    (run / "provenance.json").write_text(json.dumps(rec))
    code = main(["reproduce", str(run), "--run-dir", str(tmp_path / "again"), "-q"])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "libraries.torch: 0.0.1" in out and "a library version" in out
    assert "start's evaluation (step 0) still matches" in out
    assert "identical:" not in out and "identity is not claimed" in out


def test_a_run_resumed_under_another_provenance_is_not_called_identical(recorded, tmp_path, capsys):
    run = _copy(recorded, tmp_path)
    rec = json.loads((run / "provenance.json").read_text())
    rec["resumes"] = [{"step": 1, "recorded_at": "t", "differences": {"machine.torch.threads": [2, 1]}}]
    (run / "provenance.json").write_text(json.dumps(rec))
    code = main(["reproduce", str(run), "--run-dir", str(tmp_path / "again"), "-q"])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "resumed at step 1: machine.torch.threads: 2 → 1" in out and "thread count" in out


def test_compare_says_how_the_runs_provenance_differs(recorded, tmp_path):
    from rllab_suite.reproduce import compare_notes

    other = _copy(recorded, tmp_path)
    assert compare_notes([recorded, other]) == [
        "every run's provenance matches outside its config and seed (code, libraries, machine, threads, data, start)"]
    rec = json.loads((other / "provenance.json").read_text())
    rec["machine"]["cpu"]["isa"] = ["avx2"]
    rec["hashes"]["config"] = "another config"  # a compared run has its own config: not a note
    (other / "provenance.json").write_text(json.dumps(rec))
    bare = _copy(recorded, tmp_path, "bare")
    (bare / "provenance.json").unlink()
    notes = compare_notes([recorded, other, bare])
    assert notes[0] == f"{bare}: no provenance.json (recorded before runs wrote one)"
    assert notes[1].startswith(f"{other} ran differently from {recorded}: machine.cpu.isa: ") and "→ [\"avx2\"]" in notes[1]
    assert len(notes) == 2


def test_a_rerun_from_an_exported_start_builds_no_warm_start(recorded, tmp_path, capsys, monkeypatch):
    assert main(["provenance", str(recorded), "--export-start", str(tmp_path / "starts")]) == 0
    sha = json.loads((recorded / "provenance.json").read_text())["hashes"]["start"]["sha256"]
    exported = tmp_path / "starts" / f"start-{sha[:16]}"
    assert provenance.model_sha256(exported) == sha
    capsys.readouterr()
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    monkeypatch.setenv("RLLAB_CACHE", str(empty))  # another machine: no cached warm start
    code = main(["reproduce", str(recorded), "--start", str(exported), "--run-dir", str(tmp_path / "again"), "-q"])
    out = capsys.readouterr().out
    assert code == 0 and "identical" in out, out
    assert os.listdir(empty) == []  # nothing was warm-started here
    (exported / "model.safetensors").write_bytes(b"not the weights")
    with pytest.raises(Exception, match=f"not {sha}"):
        from rllab.training.reproduce import reproduce_run

        reproduce_run(recorded, start=exported, run_dir=tmp_path / "refused")


def test_provenance_of_two_runs_lists_their_differences(recorded, tmp_path, capsys):
    run = _copy(recorded, tmp_path)
    rec = json.loads((run / "provenance.json").read_text())
    rec["machine"]["torch"]["threads"] = 64
    rec["machine"]["host"] = "elsewhere"
    (run / "provenance.json").write_text(json.dumps(rec))
    assert main(["provenance", str(recorded), str(recorded)]) == 0
    assert "the provenance is the same" in capsys.readouterr().out
    assert main(["provenance", str(recorded), str(run)]) == 1
    out = capsys.readouterr().out
    assert "1 provenance field" in out and "machine.torch.threads" in out and "host" not in out
    assert main(["provenance", str(recorded)]) == 0
    out = capsys.readouterr().out
    assert "machine.torch.threads" in out and "hashes.start (warm_start)" in out and "libraries.torch" in out


def test_a_suite_cell_is_found_by_variant_and_seed(tmp_path):
    from rllab.errors import RllabError
    from rllab_suite.reproduce import resolve_cell

    cells = [{"variant": v, "task": "add", "seed": s, "run": f"{v}-add-s{s}-k"} for v in ("grpo", "no_rl") for s in (1, 0)]
    (tmp_path / "suite.json").write_text(json.dumps({"name": "x", "variants": ["grpo", "no_rl"], "cells": cells}))
    assert resolve_cell(tmp_path, "no_rl") == tmp_path / "runs" / "no_rl-add-s0-k"  # the lowest seed
    assert resolve_cell(tmp_path, "grpo/1") == tmp_path / "runs" / "grpo-add-s1-k"
    assert resolve_cell(tmp_path, "grpo-add-s1-k") == tmp_path / "runs" / "grpo-add-s1-k"
    with pytest.raises(RllabError, match="no variant 'ppo'.*grpo, no_rl"):
        resolve_cell(tmp_path, "ppo")
    with pytest.raises(RllabError, match="no seed 7 in .*; its seeds: 0, 1"):  # the seeds it has, listed
        resolve_cell(tmp_path, "grpo/7")
    report = tmp_path / "report"  # a committed result: the report and its provenance, no runs
    report.mkdir()
    provenance.write(report, {"cells": [], "starts": {"ab" * 32: ["grpo-add-s0-k"]}})
    with pytest.raises(RllabError, match=f"report without its run directories.*{'ab' * 32}.*RLLAB_STARTS"):
        resolve_cell(report, "grpo")


def test_the_controls_suites_no_rl_cell_from_its_shipped_start_evaluates_to_the_committed_number(tmp_path, monkeypatch):
    """benchmarks/suites/starts holds every start the committed controls result recorded; pinned by
    its hash, each start's untrained cell builds no warm start (an empty cache stays empty) and
    scores what the committed result says for that start — the check to run on another machine."""
    from rllab import Lab
    from rllab.training.trainer import run_experiment
    from rllab_suite.spec import expand, parse_suite

    root = Path(__file__).resolve().parents[1]
    recorded = json.loads((root / "benchmarks/suites/results/controls/provenance.json").read_text())
    by_seed = {int(seed): hashes for seed, hashes in recorded["start_seeds"].items()}
    assert len(by_seed) == 3 and all(len(h) == 1 for h in by_seed.values())  # three starts, each one hash
    summary = json.loads((root / "benchmarks/suites/results/controls/summary.json").read_text())
    committed = {s["start"]: next(r for r in s["rows"] if r["variant"] == "no_rl")["initial_accuracy"] for s in summary["starts"]}
    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv(provenance.STARTS_ENV, str(root / "benchmarks/suites/starts"))
    lab = Lab()
    cells = expand(parse_suite(root / "benchmarks/suites/controls.toml"), lab=lab)
    for seed, (sha,) in by_seed.items():
        cell = next(c for c in cells if c.variant == "no_rl" and c.seed == 0 and c.start == seed)
        assert cell.config["model"]["sha256"] == sha  # the suite file pins the start the result recorded
        run_experiment(load_config(cell.config, lab=lab), lab=lab, run_dir=tmp_path / f"no_rl-{seed}", progress=False)
        assert provenance.read(tmp_path / f"no_rl-{seed}")["hashes"]["start"]["sha256"] == sha
        first = json.loads((tmp_path / f"no_rl-{seed}" / "metrics.jsonl").read_text().splitlines()[0])
        assert first["step"] == 0 and first["eval/accuracy"] == committed[seed]
    assert not (tmp_path / "empty-cache").exists() or not any((tmp_path / "empty-cache").iterdir())


def test_every_committed_result_ships_the_starts_it_recorded():
    """Each start a committed suite result names in its provenance.json (hash → cells) is in
    benchmarks/suites/starts, its files hashing to that hash: a rerun anywhere can pin it."""
    root = Path(__file__).resolve().parents[1]
    recorded: dict[str, list[str]] = {}
    for record in sorted((root / "benchmarks/suites/results").glob("*/provenance.json")):
        for sha in json.loads(record.read_text()).get("starts", {}):
            recorded.setdefault(sha, []).append(record.parent.name)
    assert {"controls", "length_bias", "episodes"} <= {r for results in recorded.values() for r in results}
    missing = {sha: results for sha, results in recorded.items()
               if provenance.find_start(sha, [root / "benchmarks/suites/starts"]) is None}
    assert not missing, f"starts recorded by committed results but not shipped in benchmarks/suites/starts: {missing}"


def test_an_exported_start_is_found_by_its_hash_and_a_tampered_one_is_not(tmp_path):
    d = tmp_path / "starts" / "start-0000000000000000"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"w")
    sha = provenance.model_sha256(d)
    named = d.with_name(f"start-{sha[:16]}")
    d.rename(named)
    assert provenance.find_start(sha, [tmp_path / "starts"]) == named
    assert provenance.find_start(sha[:10].upper(), [tmp_path / "starts"]) == named
    assert provenance.find_start("ab" * 32, [tmp_path / "starts"]) is None
    (named / "model.safetensors").write_bytes(b"changed")
    assert provenance.find_start(sha, [tmp_path / "starts"]) is None


def test_the_exit_code_says_what_held():
    from rllab.training.reproduce import DIFFERENT, IDENTICAL, PROVENANCE_DIFFERS, Outcome

    assert Outcome(IDENTICAL, Path(".")).exit_code == 0
    assert Outcome(DIFFERENT, Path(".")).exit_code == 1
    assert Outcome(PROVENANCE_DIFFERS, Path("."), start_eval=True).exit_code == 2
    assert Outcome(PROVENANCE_DIFFERS, Path("."), start_eval=False).exit_code == 1
    assert Outcome(PROVENANCE_DIFFERS, Path("."), start_eval=None).exit_code == 1  # nothing comparable: not reproduced


def test_a_start_that_is_not_there_is_named_not_hashed_as_empty(tmp_path, monkeypatch):
    """Silently wrong: ``--start /nowhere`` said the start "in /nowhere hashes to e3b0c442…" (the
    hash of nothing); a mismatch did not say that ``$RLLAB_STARTS`` named a directory that does
    not exist."""
    from rllab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--start: the starting model '.*nowhere' does not exist"):
        provenance.check_start(tmp_path / "nowhere", "ab" * 32, setting="--start")
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"w")
    monkeypatch.setenv(provenance.STARTS_ENV, str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match=r"\$RLLAB_STARTS \(now '.*gone' does not exist\)"):
        provenance.check_start(model, "ab" * 32)
    monkeypatch.delenv(provenance.STARTS_ENV)
    with pytest.raises(ConfigError, match=r"\$RLLAB_STARTS \(unset\)"):
        provenance.check_start(model, "ab" * 32)


def test_provenance_of_what_is_not_a_record_says_what_to_give(recorded, tmp_path, capsys):
    """Unclear message: a path that does not exist "has no provenance.json"; a run's config.toml
    "is not valid JSON". A file where --export-start wants a directory crashed (FileExistsError)."""
    from rllab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"nowhere does not exist: give a run directory"):
        provenance.read(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"config.toml is not a provenance record: not valid JSON.*give a run directory"):
        provenance.read(recorded / "config.toml")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ConfigError, match=r"holds a JSON list, not an object"):
        provenance.read(tmp_path / "list.json")
    (tmp_path / "afile").write_text("x")
    assert main(["provenance", str(recorded), "--export-start", str(tmp_path / "afile")]) == 1
    assert "--export-start" in capsys.readouterr().err and (tmp_path / "afile").read_text() == "x"


def test_export_start_of_a_suite_result_names_a_cell_for_each_start(tmp_path, capsys):
    """Unclear message: ``rllab provenance SUITE --export-start DIR`` said "its provenance names no
    starting model", though the suite records each start's hash and the cells that ran from it."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "provenance.json").write_text(json.dumps({"starts": {"ab" * 32: ["grpo-addition-s0-1", "rloo-addition-s0-2"], "cd" * 32: ["grpo-addition-w1-s0-3"]}}))
    assert main(["provenance", str(suite), "--export-start", str(tmp_path / "out")]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "is a suite result of 2 start(s); export each from one of its cells" in err
    assert f"abababababababab…: rllab provenance {suite / 'runs' / 'grpo-addition-s0-1'} --export-start" in err
    assert "grpo-addition-w1-s0-3" in err and not (tmp_path / "out").exists()
