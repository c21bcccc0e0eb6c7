"""``rllab findings build [--check]``: docs/findings.md's generated blocks rebuilt from committed
results, drift refused, and prose that quotes unbacked numbers or unearned equivalence refused."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from rllab_suite.findings import FindingsError, build, lint, run

REPO = Path(__file__).resolve().parents[2]

SUITE = """preset = "grpo"
steps = 10
seeds = 3
baseline = "a"
controls = ["no_rl"]

[overrides]
"train.eval_size" = 40

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

[claims.b_equal]
statement = "b matches a"
arm = "b"
against = "a"
metric = "final_accuracy"
direction = "equal"
min_effect = 0.03
margin = 0.02
"""


def _repo(tmp_path: Path, b_finals=(0.50, 0.51, 0.52)) -> Path:
    root = tmp_path / "repo"
    res = root / "benchmarks" / "suites" / "results" / "s"
    res.mkdir(parents=True)
    (root / "benchmarks" / "suites" / "s.toml").write_text(SUITE)
    with (res / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "task", "seed", "status", "final_accuracy", "auc_accuracy", "final_reward", "auc_reward", "run_dir", "error"])
        for s, (fa, fb) in enumerate(zip((0.40, 0.41, 0.42), b_finals)):
            w.writerow(["a", "addition", s, "done", fa, fa, fa, fa, "", ""])
            w.writerow(["b", "addition", s, "done", fb, fb, fb, fb, "", ""])
    with (res / "summary.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "variant", "runs", "final_accuracy_mean", "final_accuracy_low", "final_accuracy_high",
                    "auc_accuracy_mean", "auc_accuracy_low", "auc_accuracy_high"])
        w.writerow(["addition", "a", 3, 0.41, 0.40, 0.42, 0.41, 0.40, 0.42])
        w.writerow(["addition", "b", 3, 0.51, 0.50, 0.52, 0.51, 0.50, 0.52])
    return root


DOC = """# Findings

<!-- findings: index -->
<!-- /findings -->

## 1. b against a

The prose may quote 41.0, which the arms table holds.

<!-- findings: arms s -->
<!-- /findings -->

<!-- findings: verdicts s -->
<!-- /findings -->
"""


def test_build_fills_every_block_from_committed_files(tmp_path):
    root = _repo(tmp_path)
    text = build(DOC, root)
    assert "| a | 3 | 41.0 [40.0, 42.0] | 41.0 [40.0, 42.0] |" in text
    # b − a = +10 points in every seed, paired: the interval is a point; 40 held-out problems
    assert "| b_higher | addition | b − a (higher) | final_accuracy | +10.0 [+10.0, +10.0] |" in text and "**reproduced**" in text
    assert "| b_equal | addition | b − a (equal) |" in text and "**opposite**" in text
    assert "one problem = 2.5 points (40 held-out problems)" in text
    assert "| 1 | b against a | `s` | b_higher: **reproduced**; b_equal: **opposite** |" in text
    assert build(text, root) == text  # rebuilding a built page changes nothing
    assert lint(text, root) == []


def test_check_fails_when_the_page_drifted_and_build_repairs_it(tmp_path):
    root = _repo(tmp_path)
    doc = root / "docs" / "findings.md"
    doc.parent.mkdir()
    doc.write_text(build(DOC, root))
    assert run(doc, check=True) == (0, [])
    _repo(tmp_path / "other", b_finals=(0.40, 0.41, 0.42))  # the committed results change: b now equals a
    (root / "benchmarks" / "suites" / "results" / "s" / "runs.csv").write_text(
        (tmp_path / "other" / "repo" / "benchmarks" / "suites" / "results" / "s" / "runs.csv").read_text())
    code, messages = run(doc, check=True)
    assert code == 1 and "generated blocks out of date (index, verdicts s)" in messages[0] and "rllab findings build" in messages[0]
    code, messages = run(doc, check=False)
    assert messages[0].endswith("rebuilt") and "**equivalent within ±2 points**" in doc.read_text()
    assert run(doc, check=True)[0] == 0


def test_prose_may_not_quote_a_number_no_committed_file_holds(tmp_path):
    root = _repo(tmp_path)
    text = build(DOC.replace("quote 41.0,", "quote 43.7,"), root)
    (problem,) = lint(text, root)
    assert problem.startswith("finding 1 (b against a): quotes 43.7, which none of its generated blocks or committed files (s) contains")
    assert lint(build(DOC.replace("quote 41.0,", "cite arXiv 2503.20783,"), root), root) == []  # an arXiv id is not a result


def test_equivalence_wording_needs_an_equivalence_verdict(tmp_path):
    root = _repo(tmp_path)
    text = build(DOC.replace("The prose may", "b recovers a. The prose may"), root)
    (problem,) = lint(text, root)
    assert "says 'recovers', which needs an 'equivalent within ±m' verdict" in problem


def test_unknown_blocks_and_missing_results_are_named(tmp_path):
    root = _repo(tmp_path)
    with pytest.raises(FindingsError, match="unknown block <!-- findings: table s -->"):
        build(DOC.replace("arms s", "table s"), root)
    with pytest.raises(FindingsError, match="suite 'gone': no committed results"):
        build(DOC.replace("arms s", "arms gone"), root)




def test_a_root_without_suite_results_is_named(tmp_path):
    """Unclear message: ``--root`` naming a directory without benchmarks/suites (or none at all)
    was reported as a missing result of the page's first suite."""
    doc = tmp_path / "findings.md"
    doc.write_text("# findings\n")
    for root in (tmp_path / "nowhere", tmp_path):
        with pytest.raises(FindingsError, match=r"--root .*: no benchmarks/suites there"):
            run(doc, check=True, root=root)

def test_the_shipped_findings_page_matches_the_committed_results():
    """docs/findings.md is what `rllab findings build` makes of the committed results (CI's check)."""
    out = subprocess.run([sys.executable, "-m", "rllab", "findings", "build", "--check", "--doc", str(REPO / "docs" / "findings.md")],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_committed_per_problem_values_give_two_level_verdicts(tmp_path):
    """problems.csv beside runs.csv: one seed per arm, 4 problems; b solves problems 0 and 1, a
    problem 0. Paired problem resampling: the difference is Binomial(4, ¼)/4, 95% CI [0, 75]
    points, so +25 is not separable (the CI holds 0)."""
    root = _repo(tmp_path)
    res = root / "benchmarks" / "suites" / "results" / "s"
    with (res / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "task", "seed", "status", "final_accuracy", "auc_accuracy", "final_reward", "auc_reward", "run_dir", "error"])
        w.writerow(["a", "addition", 0, "done", 0.25, 0.25, 0.25, 0.25, "", ""])
        w.writerow(["b", "addition", 0, "done", 0.5, 0.5, 0.5, 0.5, "", ""])
    (res / "problems.csv").write_text("variant,task,seed,metric,values\na,addition,0,final_accuracy,1 0 0 0\nb,addition,0,final_accuracy,1 1 0 0\n")
    text = build(DOC, root)
    assert "| b_higher | addition | b − a (higher) | final_accuracy | +25.0 [+0.0, +75.0] |" in text
    assert "1/1 seeds × 4 problems" in text and "Intervals over held-out problems and seeds" in text
    assert "b_higher: **not separable at this budget**" in text
