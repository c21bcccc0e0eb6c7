"""Claims pooled over several suites' committed runs (rllab_suite.pooled, ``<!-- findings: pooled NAME -->``):
the same job found across suites, a run listed twice counted once, reruns of a seed averaged into it,
seeds and problems resampled with one draw shared by the comparisons, all against hand-computed values."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from rllab_suite import pooled
from rllab_suite.findings import FindingsError, build, lint
from rllab_suite.verdicts import Claim

HEAD = ["variant", "task", "seed", "status", "final_accuracy", "auc_accuracy", "final_reward", "auc_reward", "run_dir", "error"]


def _suite(root: Path, name: str, staleness: int, arms: dict, *, rows: dict, configs: dict | None = None, lr_constant=False, start="ab" * 32):
    """A committed suite: ``arms`` name -> overrides (TOML), ``rows`` (arm, seed) -> per-problem final accuracies,
    ``configs`` (arm, seed) -> the config hash its provenance.json records."""
    sd = root / "benchmarks" / "suites"
    res = sd / "results" / name
    res.mkdir(parents=True)
    extra = '"train.lr_schedule" = "constant"\n' if lr_constant else ""
    variants = "\n".join(f"{a} = {body}" for a, body in arms.items())
    (sd / f"{name}.toml").write_text(f'preset = "grpo"\nsteps = 10\nseeds = 3\nbaseline = "{next(iter(arms))}"\n\n'
                                     f'[overrides]\n"train.eval_size" = 4\n"rollout.max_staleness" = {staleness}\n{extra}\n[variants]\n{variants}\n')
    with (res / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEAD)
        for (a, s), vals in rows.items():
            m = sum(vals) / len(vals)
            w.writerow([a, "addition", s, "done", m, m, m, m, "", ""])
    with (res / "problems.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "task", "seed", "metric", "values"])
        for (a, s), vals in rows.items():
            w.writerow([a, "addition", s, "final_accuracy", " ".join(str(v) for v in vals)])
    cells = [{"variant": a, "task": "addition", "seed": s, "start": start, "config": (configs or {}).get((a, s), f"{name}-{a}-{s}")}
             for a, s in rows]
    (res / "provenance.json").write_text(json.dumps({"cells": cells}))
    (res / "summary.csv").write_text("task,variant,runs\n")


SYNC, TIS = '{ "rollout.max_staleness" = 0 }', '{ correction = "tis" }'
CLAIMS = """
[claims.tis_equal]
statement = "TIS recovers the synchronous run"
arm = "tis"
against = "sync"
metric = "final_accuracy"
direction = "equal"
min_effect = 0.03
margin = 0.02
"""


def _pool(root: Path, suites: list[str], claims: str = CLAIMS):
    d = root / "benchmarks" / "suites" / "pooled"
    d.mkdir(parents=True, exist_ok=True)
    (d / "p.toml").write_text(f"suites = {json.dumps(suites)}\n{claims}")


def _decide(root: Path, suites: list[str], n_boot: int = 400) -> dict:
    _pool(root, suites)
    known = {p.stem: [ln.split(" = ")[0] for ln in p.read_text().split("[variants]\n")[1].splitlines() if " = " in ln]
             for p in (root / "benchmarks" / "suites").glob("*.toml")}
    pool = pooled.read_pool(root / "benchmarks" / "suites" / "pooled" / "p.toml", known)
    folded, idle = pooled.gather(root, pool, {"tis", "sync"})
    return {**pooled.decide_pool(folded, pool.claims[0], n_boot=n_boot), "idle": idle}


def test_a_run_listed_by_two_suites_counts_once_and_a_rerun_seed_is_averaged(tmp_path):
    """staleness 4: sync 0.5 in seeds 0 and 1; tis 0.4 in seeds 0 and 1. A bounds suite lists tis's
    seed 0 again (the same recorded config: counted once), reruns seed 1 with other values (0.2:
    averaged into seed 1, 0.3) and adds seed 2 (0.0). staleness 2 shares the sync runs (the same
    job: max_staleness 0 either way) and has tis 0.5. By hand: staleness 4: (0.4 + 0.3 + 0.0)/3 − 0.5
    = −0.2667; staleness 2: 0.5 − 0.5 = 0; pooled: the mean of the two, −0.1333."""
    root = tmp_path / "repo"
    q = [0.5] * 4
    _suite(root, "k4", 4, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): q, ("sync", 1): q, ("tis", 0): [0.4] * 4, ("tis", 1): [0.4] * 4},
           configs={("sync", 0): "S0", ("sync", 1): "S1", ("tis", 0): "T0", ("tis", 1): "T1"})
    _suite(root, "bounds", 4, {"tis": TIS, "mis": '{ correction = "mis" }'},
           rows={("tis", 0): [0.4] * 4, ("tis", 1): [0.2] * 4, ("tis", 2): [0.0] * 4}, configs={("tis", 0): "T0", ("tis", 1): "T1-rerun"})
    _suite(root, "k2", 2, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): q, ("sync", 1): q, ("tis", 0): q, ("tis", 1): q},
           configs={("sync", 0): "S0", ("sync", 1): "S1"})
    _suite(root, "other", 4, {"mis": '{ correction = "mis" }'}, rows={("mis", 0): q})
    e = _decide(root, ["k4", "bounds", "k2", "other"])
    assert e["idle"] == ["other"]
    by = {g["arm_job"][3]: g for g in e["strata"]}
    assert len(e["strata"]) == 2
    k4 = next(g for g in e["strata"] if ("rollout.max_staleness", "4") in g["arm_job"][3])
    k2 = next(g for g in e["strata"] if ("rollout.max_staleness", "2") in g["arm_job"][3])
    assert k4["against_job"] == k2["against_job"]  # one sync job, shared
    assert k4["x_counts"] == {"listed": 5, "distinct": 4, "replicated": 1} and k4["x"] == {0: [0.4] * 4, 1: [pytest.approx(0.3)] * 4, 2: [0.0] * 4}
    assert k4["y_counts"] == {"listed": 4, "distinct": 2, "replicated": 0}  # k4's and k2's sync: the same runs
    assert k4["diff"]["effect"] == pytest.approx(-0.8 / 3)
    assert k2["diff"]["effect"] == pytest.approx(0.0) and k2["verdict"] == "equivalent within ±2 points"
    assert e["diff"]["effect"] == pytest.approx(-0.4 / 3)
    assert e["diff"]["seeds"] == (5, 2)  # tis: 3 seeds at staleness 4 and 2 at staleness 2; sync: one job, 2 seeds
    assert e["differs"] is True and len(by) == 2


def test_one_problem_draw_is_shared_by_the_comparisons(tmp_path):
    """One seed per arm, 2 problems: at staleness 4 tis solves problem 0, at staleness 2 problem 1,
    sync neither. A problem draw shared by both comparisons gives (w0 + w1)/2 = 0.5 in every
    resample: the pooled interval is the point [50, 50]; each comparison alone spans [0, 100]."""
    root = tmp_path / "repo"
    _suite(root, "k4", 4, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0, 0], ("tis", 0): [1, 0]}, configs={("sync", 0): "S"})
    _suite(root, "k2", 2, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0, 0], ("tis", 0): [0, 1]}, configs={("sync", 0): "S"})
    e = _decide(root, ["k4", "k2"])
    assert e["diff"]["effect"] == pytest.approx(0.5)
    assert e["diff"]["ci95"] == pytest.approx((0.5, 0.5)) and e["diff"]["ci90"] == pytest.approx((0.5, 0.5))
    assert [g["diff"]["ci95"] for g in e["strata"]] == [pytest.approx((0.0, 1.0))] * 2
    assert e["verdict"] == "opposite"  # +50 points, CI excluding 0


def test_one_seed_draw_is_shared_by_the_comparisons_of_a_start(tmp_path):
    """Run means only (no problems.csv values differ by problem): at staleness 4 tis scores 0 in
    seed 0 and 1 in seed 1, at staleness 2 the reverse, sync 0 throughout. One seed draw for both
    comparisons: every resample's pooled difference is (mean of the drawn a + mean of 1 − a)/2 = 0.5."""
    root = tmp_path / "repo"
    _suite(root, "k4", 4, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0], ("sync", 1): [0], ("tis", 0): [0], ("tis", 1): [1]},
           configs={("sync", 0): "S0", ("sync", 1): "S1"})
    _suite(root, "k2", 2, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0], ("sync", 1): [0], ("tis", 0): [1], ("tis", 1): [0]},
           configs={("sync", 0): "S0", ("sync", 1): "S1"})
    e = _decide(root, ["k4", "k2"])
    assert e["diff"]["ci95"] == pytest.approx((0.5, 0.5))
    assert e["strata"][0]["diff"]["ci95"] == pytest.approx((0.0, 1.0))  # alone, the draw of 2 seeds from {0, 1}


def test_the_constant_rate_suite_is_its_own_comparison(tmp_path):
    """A suite with another learning-rate schedule runs other jobs: its sync is not folded into the cosine one."""
    root = tmp_path / "repo"
    _suite(root, "k4", 4, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [1, 1], ("tis", 0): [1, 1]}, configs={("sync", 0): "S"})
    _suite(root, "k4c", 4, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [1, 1], ("tis", 0): [0, 0]}, lr_constant=True)
    e = _decide(root, ["k4", "k4c"])
    assert len(e["strata"]) == 2 and e["strata"][0]["against_job"] != e["strata"][1]["against_job"]
    assert pooled.comparison_labels(e["strata"]) == ["the arms' shared overrides", "train.lr_schedule = 'constant'"]
    assert e["diff"]["effect"] == pytest.approx(-0.5) and e["diff"]["seeds"] == (2, 2)


def test_runs_from_another_start_are_another_comparison_and_the_starts_are_resampled(tmp_path):
    """The same suite file's runs from two starting models: two comparisons, one per start. tis −
    sync is 0 from the first and +1 from the second, constant over problems and seeds; resampling
    the two starts gives 0, 0.5, 0.5 or 1 (each start drawn twice or once): the 95% CI is [0, 100]."""
    root = tmp_path / "repo"
    _suite(root, "k4", 4, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0, 0], ("tis", 0): [0, 0]}, start="aa" * 32)
    _suite(root, "k4_other_start", 4, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0, 0], ("tis", 0): [1, 1]}, start="bb" * 32)
    e = _decide(root, ["k4", "k4_other_start"])
    assert [g["start"][:2] for g in e["strata"]] == ["aa", "bb"] and e["strata"][0]["arm_job"] == e["strata"][1]["arm_job"]
    assert e["diff"]["effect"] == pytest.approx(0.5) and e["diff"]["starts"] == 2 and e["diff"]["ci95"] == pytest.approx((0.0, 1.0))
    assert pooled.comparison_labels(e["strata"]) == ["the arms' shared overrides, start aaaaaaaa", "the arms' shared overrides, start bbbbbbbb"]


DOC = """# Findings

<!-- findings: index -->
<!-- /findings -->

## 1. TIS under staleness

<!-- findings: pooled p -->
<!-- /findings -->
"""


def test_the_findings_page_builds_a_pooled_block(tmp_path):
    root = tmp_path / "repo"
    _suite(root, "k4", 4, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0, 0], ("tis", 0): [1, 0]}, configs={("sync", 0): "S"})
    _suite(root, "k2", 2, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0, 0], ("tis", 0): [0, 1]}, configs={("sync", 0): "S"})
    _pool(root, ["k4", "k2"])
    text = build(DOC, root)
    assert "**Over every committed run of the job** (2 comparisons from 2 suites): TIS recovers the synchronous run — **opposite**" in text
    assert "| tis_equal | tis − sync (equal) | final_accuracy | +50.0 [+50.0, +50.0] |" in text
    assert "2 comparisons (fixed), 2/1 runs × 2 problems" in text
    assert "| 1 | TIS under staleness | `k4`, `k2` | pooled/tis_equal: **opposite** over 2 comparisons, the same in each |" in text
    assert build(text, root) == text and lint(text, root) == []
    with pytest.raises(FindingsError, match="pooled gone: no pool file"):
        build(DOC.replace("pooled p", "pooled gone"), root)
    with pytest.raises(FindingsError, match="not among the pool's claims"):
        build(DOC.replace("pooled p", "pooled p nope"), root)


def test_runs_without_the_same_problems_are_compared_on_their_means_and_say_so(tmp_path):
    """One comparison recorded 2 problems, the other 4: both on run means (tis 0.5 and 0.25 above sync 0)."""
    root = tmp_path / "repo"
    _suite(root, "k4", 4, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0, 0], ("tis", 0): [1, 0]}, configs={("sync", 0): "S"})
    _suite(root, "k2", 2, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0, 0], ("tis", 0): [1, 0, 0, 0]}, configs={("sync", 0): "S"})
    e = _decide(root, ["k4", "k2"])
    assert e["diff"]["effect"] == pytest.approx(0.375) and e["diff"]["problems"] == 1 and "compared on run means" in e["why"]


def test_a_pool_naming_what_no_suite_holds_is_refused(tmp_path):
    root = tmp_path / "repo"
    _suite(root, "k4", 4, {"sync": SYNC, "tis": TIS}, rows={("sync", 0): [0, 0], ("tis", 0): [1, 0]})
    with pytest.raises(pooled.PoolError, match="suite.*missing have no committed suite file"):
        _decide(root, ["k4", "missing"])
    (root / "benchmarks" / "suites" / "pooled" / "p.toml").write_text('weights = 1\nsuites = ["k4"]\n' + CLAIMS)
    with pytest.raises(pooled.PoolError, match=r"unknown key\(s\) weights"):
        pooled.read_pool(root / "benchmarks" / "suites" / "pooled" / "p.toml", {"k4": ["sync", "tis"]})
    # arms no suite ran side by side: no comparison, nothing decided
    e = pooled.decide_pool([], Claim(name="c", statement="s", arm="tis", against="sync", metric="final_accuracy", direction="equal",
                                     min_effect=0.03, margin=0.02))
    assert e["verdict"] == "not separable at this budget" and "side by side" in e["why"]
