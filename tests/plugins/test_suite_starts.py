"""Suites from several starting models (``starts``): cells per start, pinned and exported starts,
verdicts per start and over all starts (the three-level bootstrap), and the findings page."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import attrs
import numpy as np
import pytest

from tests.tiny import TINY
from rllab_suite.findings import CsvRun, build, read_runs_csv
from rllab_suite.spec import SuiteError, config_key, expand, parse_suite
from rllab_suite.verdicts import (
    NOT_SEPARABLE, REPRODUCED, Claim, bootstrap_difference, bootstrap_over_starts, evaluate_claims, markdown_lines, three_level_ci,
)

SHA = "04908f32b2ea414f84b9997f47b2231dcb79d3260b58b5ac0eda0b69f4e15a51"


def suite(**over):
    data = {"name": "t", "preset": "grpo", "steps": 2, "seeds": [0, 1], "tasks": ["addition"], "overrides": dict(TINY),
            "variants": {"grpo": {}}, "starts": 2}
    data.update(over)
    return data


# --------------------------------------------------------------------------- suite files and cells


def test_starts_count_list_and_pins():
    assert [(s.seed, s.sha256) for s in parse_suite(suite(starts=3)).starts] == [(0, None), (1, None), (2, None)]
    s = parse_suite(suite(starts=[{"seed": 4, "sha256": SHA.upper()}, 7]))
    assert [(x.seed, x.sha256) for x in s.starts] == [(4, SHA), (7, None)]
    assert parse_suite(suite(starts=None)).starts == ()


@pytest.mark.parametrize("starts, needle", [
    (0, "at least one start"),
    ([], "non-empty list"),
    ([1, 1], "repeat the warm-start seed(s) 1"),
    ([True], "is not a start"),
    ([{"seed": 0, "sha": SHA}], "is not a start"),
    ([{"seed": 0, "sha256": "xyz"}], "sha256 = 'xyz'"),
    ([{"seed": 0, "sha256": "0490"}], "a prefix of at least 8"),
])
def test_bad_starts_are_refused_by_name(starts, needle):
    with pytest.raises(SuiteError, match="starts") as e:
        parse_suite(suite(starts=starts))
    assert needle in str(e.value)


@pytest.mark.parametrize("key", ["model.tiny.seed", "model.warm_start.seed", "model.sha256", "model.path"])
def test_overrides_the_starts_would_replace_are_refused(key):
    with pytest.raises(SuiteError, match=f"sets {key}, which the suite sets in every cell from its 'starts'"):
        parse_suite(suite(overrides={**TINY, key: 1}))
    parse_suite(suite(starts=None, overrides={**TINY, "model.tiny.seed": 1}))  # without starts it is the config's own


def test_starts_dir_is_relative_to_the_suite_file(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('preset = "grpo"\nstarts = 2\nstarts_dir = "starts"\n')
    assert parse_suite(path).starts_dir == tmp_path.resolve() / "starts"
    path.write_text('preset = "grpo"\nstarts = 2\nstarts_dir = 3\n')
    with pytest.raises(SuiteError, match="starts_dir = 3"):
        parse_suite(path)


def test_each_start_is_a_cell_with_its_own_warm_start_seeds(lab):
    cells = expand(parse_suite(suite(starts=[{"seed": 0, "sha256": SHA}, 1])), lab=lab)
    assert [(c.start, c.seed) for c in cells] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    by = {(c.start, c.seed): c for c in cells}
    assert by[1, 0].config["model"]["tiny"]["seed"] == 1 and by[1, 0].config["model"]["warm_start"]["seed"] == 1
    assert by[0, 0].config["model"]["sha256"] == SHA and "sha256" not in by[1, 0].config["model"]
    assert "-w1-s0-" in by[1, 0].slug and by[1, 0].to_dict()["start"] == 1
    assert len({c.key for c in cells}) == 4
    # a pin checks the start, it does not change the computation: a suite pinned after it ran finds its cells
    unpinned = expand(parse_suite(suite(starts=[0, 1])), lab=lab)
    assert [c.key for c in unpinned] == [c.key for c in cells]
    assert config_key({"model": {"sha256": "a", "tiny": {}}}) == config_key({"model": {"tiny": {}}})
    # without starts the cells are as before: no start, no warm-start seeds set
    plain = expand(parse_suite(suite(starts=None)), lab=lab)
    assert all(c.start is None and "-w" not in c.slug and "seed" not in c.config["model"]["tiny"] for c in plain)


# --------------------------------------------------------------------------- the interval over starts


def test_over_starts_the_effect_is_the_mean_of_the_starts_effects():
    # start A: x − y = 0.5 over two seeds; start B: 1.0 over one seed; pooled runs would give 2/3
    d = bootstrap_over_starts([([[1.0], [0.0]], [[0.0], [0.0]], [0, 1], [0, 1]), ([[1.0]], [[0.0]], [0], [0])])
    assert d["effect"] == pytest.approx(0.75) and d["starts"] == 2 and d["seeds"] == (3, 3) and d["levels"] == "starts and seeds"


def test_over_starts_the_interval_resamples_the_starts():
    # every seed and problem of start A differs by +1 point, of start B by +3: within a start nothing
    # varies, so the resampled means are the starts drawn: (1+1)/2, (1+3)/2, (3+3)/2 with probability
    # 1/4, 1/2, 1/4, and both intervals span [1, 3] points
    a = ([[0.51, 0.51], [0.51, 0.51]], [[0.5, 0.5], [0.5, 0.5]], [0, 1], [0, 1])
    b = ([[0.53, 0.53], [0.53, 0.53]], [[0.5, 0.5], [0.5, 0.5]], [0, 1], [0, 1])
    d = bootstrap_over_starts([a, b])
    assert d["effect"] == pytest.approx(0.02) and d["levels"] == "starts, problems and seeds" and d["problems"] == 2
    assert d["ci95"] == pytest.approx((0.01, 0.03)) and d["ci90"] == pytest.approx((0.01, 0.03))
    # starts that agree give a point interval: nothing varies at any level
    same = bootstrap_over_starts([a, a, a])
    assert same["ci95"] == pytest.approx((0.01, 0.01))


def test_one_start_is_the_two_level_bootstrap():
    rng = np.random.default_rng(3)
    x, y = rng.random((4, 6)), rng.random((4, 6))
    one = bootstrap_over_starts([(x, y, range(4), range(4))])
    two = bootstrap_difference(x, y, x_seeds=range(4), y_seeds=range(4))
    assert one["ci95"] == two["ci95"] and one["effect"] == two["effect"] and one["starts"] == 1


def test_three_level_ci_of_one_arm():
    m, lo, hi = three_level_ci([[[0.2, 0.2]], [[0.4, 0.4]]])
    assert (m, lo, hi) == pytest.approx((0.3, 0.2, 0.4))


# --------------------------------------------------------------------------- verdicts per start


CLAIM = Claim(name="b_higher", statement="b ends above a", arm="b", against="a", metric="final_accuracy", direction="higher",
              min_effect=0.03, margin=0.02)


def runs(effects: dict) -> list[CsvRun]:
    """Per start, arm b's per-problem values ``effect`` above arm a's (0.4 on 4 problems), 3 seeds."""
    out = []
    for start, e in effects.items():
        for seed in range(3):
            out.append(CsvRun(variant="a", task="addition", seed=seed, status="done", values={}, problems={"final_accuracy": [0.4] * 4},
                              start=start, start_sha256=f"{start}" * 64))
            out.append(CsvRun(variant="b", task="addition", seed=seed, status="done", values={}, problems={"final_accuracy": [0.4 + e] * 4},
                              start=start, start_sha256=f"{start}" * 64))
    return out


def test_a_verdict_that_holds_from_every_start():
    (e,) = evaluate_claims(runs({0: 0.10, 1: 0.10, 2: 0.10}), (CLAIM,), tasks=["addition"])
    assert e["verdict"] == REPRODUCED and not e["differs"]
    assert [p["verdict"] for p in e["per_start"]] == [REPRODUCED] * 3
    assert e["diff"]["effect"] == pytest.approx(0.10) and e["diff"]["ci95"] == pytest.approx((0.10, 0.10))
    text = "\n".join(markdown_lines([e], eval_size=4))
    assert "| b_higher | addition | start 1 (11111111) | +10.0 [+10.0, +10.0] |" in text
    assert "3 starts, 9/9 runs × 4 problems" in text
    assert "- b_higher (addition): **reproduced** from every start (3)." in text and "DIFFERS" not in text


def test_a_verdict_that_flips_between_starts_says_so():
    # start 0: +10 points (reproduced); start 1: 0 (the point interval inside ±2: equivalent).
    # Over both: effect +5, the starts resampled give means 0, 5, 10 with probability 1/4, 1/2, 1/4:
    # the 95% CI [0, +10] does not exclude 0 and reaches beyond ±2, so not separable. The runs hold
    # no no_rl arm: start 1's equivalence stands, marked as unchecked for assay sensitivity
    (e,) = evaluate_claims(runs({0: 0.10, 1: 0.0}), (CLAIM,), tasks=["addition"])
    assert [p["verdict"] for p in e["per_start"]] == [REPRODUCED, "equivalent within ±2 points"]
    assert [p["assay_mark"] for p in e["per_start"]] == ["", "(no control to check assay sensitivity)"]
    assert e["differs"] and e["verdict"] == NOT_SEPARABLE
    assert e["diff"]["effect"] == pytest.approx(0.05) and e["diff"]["ci95"] == pytest.approx((0.0, 0.10))
    text = "\n".join(markdown_lines([e], eval_size=4))
    assert ("- **VERDICT DIFFERS BETWEEN STARTS** — b_higher (addition): start 0 (00000000) reproduced; "
            "start 1 (11111111) equivalent within ±2 points (no control to check assay sensitivity); over all starts not separable at this budget.") in text


def test_runs_of_one_start_are_decided_as_before():
    one = [attrs.evolve(r, start=None) for r in runs({0: 0.10})]
    (e,) = evaluate_claims(one, (CLAIM,), tasks=["addition"])
    assert "per_start" not in e and e["verdict"] == REPRODUCED


# --------------------------------------------------------------------------- the findings page


SUITE = """preset = "grpo"
steps = 10
seeds = 3
starts = 2

[overrides]
"train.eval_size" = 4

[variants]
a = {}
b = { "algorithm.minibatches" = 2 }

[claims.b_higher]
statement = "b ends above a"
arm = "b"
against = "a"
metric = "final_accuracy"
direction = "higher"
min_effect = 0.03
margin = 0.02
"""

DOC = """# Findings

<!-- findings: index -->
<!-- /findings -->

## 1. b against a

<!-- findings: arms s -->
<!-- /findings -->

<!-- findings: verdicts s -->
<!-- /findings -->
"""


def test_findings_carry_the_verdicts_per_start(tmp_path):
    root = tmp_path / "repo"
    res = root / "benchmarks" / "suites" / "results" / "s"
    res.mkdir(parents=True)
    (root / "benchmarks" / "suites" / "s.toml").write_text(SUITE)
    with (res / "runs.csv").open("w", newline="") as f, (res / "problems.csv").open("w", newline="") as g:
        w, p = csv.writer(f), csv.writer(g)
        w.writerow(["variant", "task", "seed", "status", "final_accuracy", "auc_accuracy", "final_reward", "auc_reward", "run_dir", "error",
                    "start", "start_sha256"])
        p.writerow(["variant", "task", "seed", "metric", "values", "start"])
        for r in runs({0: 0.10, 1: 0.0}):
            v = r.problems["final_accuracy"][0]
            w.writerow([r.variant, r.task, r.seed, "done", v, v, v, v, "", "", r.start, r.start_sha256])
            p.writerow([r.variant, r.task, r.seed, "final_accuracy", " ".join([f"{v:.6g}"] * 4), r.start])
    with (res / "summary.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "variant", "runs", "final_accuracy_mean", "final_accuracy_low", "final_accuracy_high",
                    "auc_accuracy_mean", "auc_accuracy_low", "auc_accuracy_high"])
        w.writerow(["addition", "a", 6, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4])
        w.writerow(["addition", "b", 6, 0.45, 0.4, 0.5, 0.45, 0.4, 0.5])
    stat = {"mean": 0.5, "low": 0.5, "high": 0.5}
    (res / "summary.json").write_text(json.dumps({"starts": [
        {"start": s, "sha256": f"{s}" * 64, "rows": [{"task": "addition", "variant": "b", "runs": 3, "initial_accuracy": 0.25,
                                                      "final_accuracy": stat, "auc_accuracy": stat}]} for s in (0, 1)]}))
    read = read_runs_csv(res / "runs.csv")
    assert {(r.start, r.seed) for r in read} == {(s, k) for s in (0, 1) for k in range(3)} and read[0].problems["final_accuracy"] == [0.4] * 4
    text = build(DOC, root)
    assert "| b_higher | addition | start 0 (00000000) | +10.0 [+10.0, +10.0] |" in text
    assert "**VERDICT DIFFERS BETWEEN STARTS** — b_higher (addition)" in text
    assert ("| 1 | b against a | `s` | b_higher: **not separable at this budget** over 2 starts, differing between them "
            "(reproduced, equivalent within ±2 points (no control to check assay sensitivity)); whether each start learns is not checked: "
            "the suite has no no-learning control (no_rl) and its runs kept no step-0 evaluation per problem (initial_accuracy) |") in text
    assert "| 0 | 0000000000000000 | b | 3 | 25.0 | 50.0 [50.0, 50.0] | 50.0 [50.0, 50.0] |" in text
    assert "95% percentile-bootstrap CI over starts, held-out problems and seeds (the runs of 2 starting models pooled)" in text


# --------------------------------------------------------------------------- end to end


def test_a_two_start_suite_builds_pins_exports_and_reports_each_start(tmp_path, lab, model_cache, monkeypatch):
    """Two warm starts (seeds 0 and 1) built once each, exported by hash, recorded per cell; the
    report per start; the suite pinned to the exported starts runs from them without building."""
    from rllab_suite.suite import run_suite

    starts_dir = tmp_path / "starts"
    claim = {"statement": "grpo ends above the warm start", "arm": "grpo", "against": "no_rl", "metric": "final_accuracy",
             "direction": "higher", "min_effect": 0.03, "margin": 0.02}
    data = suite(steps=1, seeds=[0], starts=2, controls=["no_rl"], baseline="grpo", claims={"lifts": claim},
                 overrides={**TINY, "model.warm_start.steps": 20})
    data["starts_dir"] = str(starts_dir)
    out = tmp_path / "s"
    summary = run_suite(data, directory=out, workers=1, lab=lab, progress=False, check_identical=False)
    prov = json.loads((out / "provenance.json").read_text())
    hashes = {k: v[0] for k, v in prov["start_seeds"].items()}
    assert set(hashes) == {"0", "1"} and hashes["0"] != hashes["1"]  # two independently trained starts
    assert sorted(p.name for p in starts_dir.iterdir()) == sorted(f"start-{h[:16]}" for h in hashes.values())
    assert {c["start_seed"]: c["start"] for c in prov["cells"]} == {0: hashes["0"], 1: hashes["1"]}
    assert [s["start"] for s in summary["starts"]] == [0, 1] and summary["starts"][1]["sha256"] == hashes["1"]
    (v,) = summary["verdicts"]
    assert [p["start"] for p in v["per_start"]] == [0, 1] and v["diff"]["starts"] == 2
    rows = list(csv.DictReader((out / "runs.csv").open()))
    assert {(r["start"], r["start_sha256"]) for r in rows} == {("0", hashes["0"]), ("1", hashes["1"])}
    report = (out / "report.md").read_text()
    assert "## per start" in report and "Per start (each start's runs alone" in report
    # pinned to the exported starts, in a fresh model cache: the same cells (a pin is not part of a cell's key), nothing built
    pinned = {**data, "starts": [{"seed": int(k), "sha256": h} for k, h in hashes.items()]}
    assert [c.key for c in expand(parse_suite(pinned), lab=lab)] == [c.key for c in expand(parse_suite(data), lab=lab)]
    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path / "empty-cache"))
    fresh = tmp_path / "s2"
    run_suite({**pinned, "starts": pinned["starts"][1:], "controls": [], "claims": {}}, directory=fresh, workers=1, lab=lab, progress=False, check_identical=False)
    assert not (tmp_path / "empty-cache").exists() or not any(p.name.startswith("tiny-qwen2-") for p in (tmp_path / "empty-cache").iterdir())
    again = json.loads((fresh / "provenance.json").read_text())
    assert again["start_seeds"] == {"1": [hashes["1"]]}
    # a pin that does not hold is refused before any cell runs
    wrong = {**data, "seeds": [0], "starts": [{"seed": 0, "sha256": hashes["1"]}], "starts_dir": str(tmp_path / "none")}
    with pytest.raises(Exception, match="starts: seed 0, sha256"):
        run_suite(wrong, directory=tmp_path / "s3", workers=1, lab=lab, progress=False, check_identical=False)
    assert not any((tmp_path / "s3" / "runs").glob("*/final.json"))


def test_reproduce_names_a_cell_of_one_start_by_its_run_directory(tmp_path):
    from rllab import RllabError
    from rllab_suite.reproduce import resolve_cell

    cells = [{"variant": "no_rl", "task": "addition", "seed": 0, "start": s, "run": f"no_rl-addition-w{s}-s0-abc"} for s in (0, 1)]
    (tmp_path / "suite.json").write_text(json.dumps({"variants": ["no_rl"], "cells": cells}))
    with pytest.raises(RllabError, match="ran from several starts; name the cell by its run directory: no_rl-addition-w0-s0-abc, no_rl-addition-w1-s0-abc"):
        resolve_cell(tmp_path, "no_rl/0")
    assert resolve_cell(tmp_path, "no_rl-addition-w1-s0-abc") == tmp_path / "runs" / "no_rl-addition-w1-s0-abc"


def test_dry_run_lists_each_cells_start(tmp_path, capsys):
    from rllab.cli import main

    f = tmp_path / "s.toml"
    f.write_text('preset = "grpo"\nsteps = 2\nseeds = 2\nstarts = [0, 3]\n')
    assert main(["suite", str(f), "--dry-run", "--dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "1 variants × 1 tasks × 2 starts × 2 seeds = 4 runs" in out and out.count("to run") == 4
    rows = [line.split() for line in out.splitlines() if "to run" in line and "base" in line]
    assert [(r[2], r[3]) for r in rows] == [("0", "0"), ("0", "1"), ("3", "0"), ("3", "1")]
    assert not (tmp_path / "out").exists()


def test_the_pin_line_fills_in_the_hashes_built_and_keeps_the_pinned_ones():
    from rllab_suite.suite import pin_line

    s = parse_suite(suite(starts=[{"seed": 0, "sha256": "ab" * 32}, 1]))
    assert pin_line(s, {1: "cd" * 32}) == f'starts = [{{ seed = 0, sha256 = "{"ab" * 32}" }}, {{ seed = 1, sha256 = "{"cd" * 32}" }}]'
    assert pin_line(s, {}) is None  # start 1 not built here: nothing to pin it to
    assert pin_line(parse_suite(suite(starts=[{"seed": 0, "sha256": "ab" * 32}])), {}) is None  # all pinned already


def test_a_tracked_metric_over_starts_resamples_the_starts():
    from rllab_suite.records import RunRecord
    from rllab_suite.report import last_ci

    def run(start, value):
        return RunRecord(run_dir="", variant="a", task="t", seed=0, status="done", train={"m": ([1], [value])}, start=start)

    # start 0's runs end at 2 and 4 tokens, start 1's at 6: the mean of the starts' means is (3 + 6) / 2.
    # A slot of a resample is start 1 (6, probability 1/2) or start 0 with its two seeds redrawn (2, 3, 4 with
    # 1/8, 1/4, 1/8); the mean of two slots is at most 2.5 with probability 1/64 + 2 · 1/8 · 1/4 = 5/64 (> 2.5%)
    # and 2 with 1/64 (< 2.5%), and 6 with 1/4: the 95% CI is [2.5, 6]
    m, lo, hi = last_ci([run(0, 2.0), run(0, 4.0), run(1, 6.0)], "m")
    assert m == pytest.approx(4.5) and lo == pytest.approx(2.5) and hi == pytest.approx(6.0)


def test_the_index_says_when_the_starts_together_decide_what_no_start_alone_does():
    from rllab_suite.findings import _over_starts

    alone = [{"verdict": NOT_SEPARABLE}] * 3
    # every start alone not separable, the three together equivalent: "from each" would misstate the starts
    e = {"verdict": "equivalent within ±2 points", "per_start": alone, "differs": False}
    assert _over_starts(e) == " over 3 starts, not separable at this budget from each alone"
    assert _over_starts({"verdict": NOT_SEPARABLE, "per_start": alone, "differs": False}) == " from each of 3 starts"
    flip = [{"verdict": REPRODUCED}, {"verdict": NOT_SEPARABLE}]
    assert _over_starts({"verdict": REPRODUCED, "per_start": flip, "differs": True}) == (
        " over 2 starts, differing between them (reproduced, not separable at this budget)")
