"""Verdicts decided by code (rllab_suite.verdicts): the claim's table, the two-level bootstrap over
problems and seeds, the fixed vocabulary, and per-problem values read from a run directory."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllab_suite.records import read_run
from rllab_suite.spec import SuiteError, parse_suite
from rllab_suite.verdicts import (
    NOT_SEPARABLE, OPPOSITE, REPRODUCED, Claim, ClaimError, bootstrap_difference, claims_equivalence, decide, evaluate_claims,
    markdown_lines, parse_claims, resolution,
)

ARMS = ["grpo", "tis", "sync"]


def claim(**kw) -> Claim:
    base = dict(name="c", statement="tis ends above grpo", arm="tis", against="grpo", metric="final_accuracy", direction="higher",
                min_effect=0.03, margin=0.02)
    return Claim(**{**base, **kw})


def diff(effect, ci95, ci90) -> dict:
    return {"effect": effect, "ci95": ci95, "ci90": ci90, "problems": 1, "seeds": (5, 5), "levels": "seeds"}


# --------------------------------------------------------------------------- the vocabulary


@pytest.mark.parametrize("direction, effect, ci95, ci90, want", [
    ("higher", 0.05, (0.02, 0.08), (0.025, 0.075), REPRODUCED),
    ("higher", 0.02, (0.01, 0.03), (0.012, 0.028), NOT_SEPARABLE),  # excludes 0 but below the 3-point minimum, beyond ±2
    ("higher", -0.05, (-0.08, -0.02), (-0.075, -0.025), OPPOSITE),
    ("lower", -0.05, (-0.08, -0.02), (-0.075, -0.025), REPRODUCED),
    ("lower", 0.05, (0.02, 0.08), (0.025, 0.075), OPPOSITE),
    ("higher", 0.0, (-0.015, 0.018), (-0.012, 0.015), "equivalent within ±2 points"),
    ("higher", 0.01, (-0.03, 0.05), (-0.025, 0.045), NOT_SEPARABLE),
    ("equal", 0.0, (-0.025, 0.025), (-0.019, 0.019), "equivalent within ±2 points"),
    ("equal", 0.0, (-0.025, 0.025), (-0.021, 0.019), NOT_SEPARABLE),  # the 90% CI pokes out of ±2: TOST fails
    ("equal", -0.04, (-0.06, -0.02), (-0.055, -0.025), OPPOSITE),
    ("equal", -0.025, (-0.04, -0.01), (-0.037, -0.013), NOT_SEPARABLE),  # differs, but by less than the minimum
])
def test_decide_by_hand(direction, effect, ci95, ci90, want):
    assert decide(claim(direction=direction), diff(effect, ci95, ci90))[0] == want


def test_decide_without_an_interval_is_not_separable():
    v, why = decide(claim(), diff(0.2, (math.nan, math.nan), (math.nan, math.nan)))
    assert v == NOT_SEPARABLE and "one seed" in why


@settings(max_examples=200, deadline=None)
@given(st.floats(-0.5, 0.5), st.floats(0, 0.3), st.floats(0, 0.3), st.sampled_from(["higher", "lower", "equal"]))
def test_a_verdict_follows_its_rule(e, w95, shrink, direction):
    """Whatever the numbers: reproduced needs the CI off 0 in the direction and the minimum;
    equivalence needs the 90% CI inside the margin."""
    w90 = w95 * min(1.0, shrink)
    c = claim(direction=direction)
    v, _ = decide(c, diff(e, (e - w95, e + w95), (e - w90, e + w90)))
    if v == REPRODUCED:
        s = 1 if direction == "higher" else -1
        assert direction != "equal" and s * (e - s * w95) > 0 and s * e >= c.min_effect
    if v.startswith("equivalent"):
        assert -c.margin < e - w90 and e + w90 < c.margin
    if v == OPPOSITE:
        assert abs(e) >= c.min_effect and (e - w95 > 0 or e + w95 < 0)


# --------------------------------------------------------------------------- the intervals


def test_identical_seeds_give_a_point_interval():
    d = bootstrap_difference([0.5] * 5, [0.4] * 5, x_seeds=range(5), y_seeds=range(5))
    assert d["effect"] == pytest.approx(0.1)
    assert d["ci95"] == pytest.approx((0.1, 0.1)) and d["ci90"] == pytest.approx((0.1, 0.1))
    assert d["levels"] == "seeds" and d["problems"] == 1


def test_paired_seeds_cancel_a_shared_seed_effect():
    # each seed moves both arms alike: paired by seed, the difference is always 0.1
    x, y = [0.2, 0.5, 0.8, 0.3], [0.1, 0.4, 0.7, 0.2]
    paired = bootstrap_difference(x, y, x_seeds=[0, 1, 2, 3], y_seeds=[0, 1, 2, 3])
    assert paired["ci95"] == pytest.approx((0.1, 0.1))
    unpaired = bootstrap_difference(x, y, x_seeds=[0, 1, 2, 3], y_seeds=[4, 5, 6, 7])
    assert unpaired["ci95"][0] < 0 < unpaired["ci95"][1]


def test_problem_level_interval_by_hand():
    """One seed per arm, 4 problems: arm x solves problems 0 and 1, arm y problem 0. Resampling
    problems (paired) makes the difference Binomial(4, 1/4)/4: P(≤ 0) = 0.316 > 2.5%, and
    P(≥ 3) = 0.051 > 2.5% while P(4) = 0.004 < 2.5% — so the 95% interval is [0, 0.75]."""
    d = bootstrap_difference([[1, 1, 0, 0]], [[1, 0, 0, 0]], x_seeds=[0], y_seeds=[0])
    assert d["effect"] == pytest.approx(0.25)
    assert d["ci95"] == pytest.approx((0.0, 0.75))
    assert d["levels"] == "problems and seeds" and d["problems"] == 4
    seeds_only = bootstrap_difference([[0.5]], [[0.25]])
    assert math.isnan(seeds_only["ci95"][0])  # one seed, no problems: no interval


def test_two_levels_are_wider_than_seeds_alone():
    rng = np.random.default_rng(1)
    x = (rng.random((5, 50)) < 0.6).astype(float)
    y = (rng.random((5, 50)) < 0.5).astype(float)
    two = bootstrap_difference(x, y, x_seeds=range(5), y_seeds=range(5))
    one = bootstrap_difference(x.mean(axis=1), y.mean(axis=1), x_seeds=range(5), y_seeds=range(5))
    assert two["effect"] == pytest.approx(one["effect"])
    assert two["ci95"][1] - two["ci95"][0] > one["ci95"][1] - one["ci95"][0]


def test_arms_on_different_problems_are_refused():
    with pytest.raises(ValueError, match="different numbers of problems"):
        bootstrap_difference([[1, 0, 1]], [[1, 0]])


def test_resolution_says_what_one_problem_is_worth():
    assert resolution(50) == "one problem = 2 points (50 held-out problems)"
    assert resolution(200) == "one problem = 0.5 points (200 held-out problems)"


# --------------------------------------------------------------------------- the suite file


def test_claims_are_parsed_and_checked():
    raw = {"tis_recovers": {"statement": "TIS recovers sync", "arm": "tis", "against": "sync", "metric": "auc_accuracy",
                            "direction": "equal", "min_effect": 0.03, "margin": 0.02, "paper": "arXiv 1802.01561"}}
    (c,) = parse_claims(raw, ARMS, "s.toml")
    assert (c.name, c.arm, c.against, c.direction, c.margin, c.paper) == ("tis_recovers", "tis", "sync", "equal", 0.02, "arXiv 1802.01561")
    bad = [
        ({"direction": "bigger"}, "direction = 'bigger'"),
        ({"arm": "ppo"}, "arm = 'ppo' is not an arm"),
        ({"metric": "pass@0"}, "metric = 'pass@0'"),
        ({"margin": 2}, "margin = 2; a number in \\(0, 1\\)"),
        ({"direction": "higher"}, "claims equivalence \\('recovers'\\)"),
        ({"colour": 1}, "unknown key\\(s\\) colour"),
    ]
    for change, match in bad:
        with pytest.raises(ClaimError, match=match):
            parse_claims({"x": {**raw["tis_recovers"], **change}}, ARMS, "s.toml")
    with pytest.raises(ClaimError, match="missing margin"):
        parse_claims({"x": {k: v for k, v in raw["tis_recovers"].items() if k != "margin"}}, ARMS, "s.toml")


def test_a_suite_file_carries_its_claims_and_controls_can_be_named():
    s = parse_suite({"preset": "grpo", "variants": {"grpo": {}, "tis": {}}, "controls": ["no_rl"], "baseline": "grpo",
                     "claims": {"beats_start": {"statement": "grpo ends above the warm start", "arm": "grpo", "against": "no_rl",
                                                "metric": "final_accuracy", "direction": "higher", "min_effect": 0.05, "margin": 0.02}}})
    assert [c.name for c in s.claims] == ["beats_start"]
    with pytest.raises(SuiteError, match="claim 'x': against = 'nope'"):
        parse_suite({"preset": "grpo", "variants": {"grpo": {}}, "claims": {"x": {
            "statement": "s", "arm": "grpo", "against": "nope", "metric": "final_accuracy", "direction": "higher", "min_effect": 0.05, "margin": 0.02}}})


def test_equivalence_words_are_found():
    assert claims_equivalence("TIS recovers the on-policy run") == "recovers"
    assert claims_equivalence("at no cost in accuracy") == "no cost"
    assert claims_equivalence("GRPO ends above the warm start") is None


# --------------------------------------------------------------------------- from run directories


def _run(tmp_path, name, seed, solved_by_step, samples=None):
    d = tmp_path / name
    d.mkdir()
    (d / "config.toml").write_text(f'[task]\nname = "addition"\n[train]\nseed = {seed}\n')
    rows, probs = [], []
    for step, solved in solved_by_step.items():
        acc = sum(solved) / len(solved)
        rows.append({"step": step, "eval/accuracy": acc, "eval/reward": acc, "eval/n": float(len(solved))})
        probs.append({"step": step, "solved": solved, "reward": [float(v) for v in solved],
                      **({"sampled_correct": samples[step], "samples": 4} if samples else {})})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "eval_problems.jsonl").write_text("".join(json.dumps(p) + "\n" for p in probs))
    (d / "final.json").write_text("{}")
    return d


def test_problem_values_from_a_run_directory(tmp_path):
    d = _run(tmp_path, "a", 0, {0: [0, 0, 1, 0], 10: [1, 0, 1, 1]}, samples={0: [0, 1, 2, 4], 10: [4, 0, 2, 4]})
    r = read_run(d, variant="a")
    assert r.eval_n == 4
    assert r.problem_values("final_accuracy") == [1.0, 0.0, 1.0, 1.0]
    assert r.problem_values("auc_accuracy") == pytest.approx([0.5, 0.0, 1.0, 0.5])  # trapezoid of each problem's 0/1 path
    assert np.mean(r.problem_values("auc_accuracy")) == pytest.approx(r.metric_value("auc_accuracy"))
    assert r.problem_values("pass@2") == pytest.approx([1.0, 0.0, 1 - 1 / 6, 1.0])  # c = 2 of 4: 1 − C(2,2)/C(4,2)
    assert r.problem_values("pass@8") is None  # more than the samples drawn
    assert r.problem_values("initial_accuracy") == [0.0, 0.0, 1.0, 0.0] and r.metric_value("initial_accuracy") == 0.25  # step 0
    late = read_run(_run(tmp_path, "late", 0, {5: [0, 1], 10: [1, 1]}), variant="a")  # no evaluation before the first step
    assert late.problem_values("initial_accuracy") is None and math.isnan(late.metric_value("initial_accuracy"))


def test_claims_are_decided_from_runs_and_written_beside_their_numbers(tmp_path):
    recs = []
    for s in range(3):
        recs.append(read_run(_run(tmp_path, f"tis{s}", s, {0: [0] * 10, 10: [1] * 8 + [0] * 2}), variant="tis", seed=s))
        recs.append(read_run(_run(tmp_path, f"grpo{s}", s, {0: [0] * 10, 10: [1] * 4 + [0] * 6}), variant="grpo", seed=s))
    c = claim(min_effect=0.1)
    (e,) = evaluate_claims(recs, (c,), tasks=["addition"], n_boot=500)
    assert e["diff"]["levels"] == "problems and seeds" and e["diff"]["problems"] == 10
    assert e["diff"]["effect"] == pytest.approx(0.4) and e["verdict"] == REPRODUCED
    text = "\n".join(markdown_lines([e], eval_size=10))
    assert "one problem = 10 points (10 held-out problems)" in text and "**reproduced**" in text
    assert "+40.0 [" in text and "3/3 seeds × 10 problems" in text


def test_pass_at_k_gain_is_paired_per_problem_over_problems_and_seeds(tmp_path):
    """Two seeds alike, 2 problems, 4 samples: before 0 and 4 solved, after 2 and 4. pass@1 per
    problem goes 0 → 0.5 and 1 → 1: a gain of 0.25; resampling the 2 problems gives 0, 0.25 or 0.5
    (¼, ½, ¼), so the 95% CI is [0, 0.5] — over seeds alone it would be a point."""
    from rllab_suite.report import _pass_at

    recs = []
    for s in range(2):
        d = _run(tmp_path, f"g{s}", s, {0: [0, 1], 10: [1, 1]}, samples={0: [0, 4], 10: [2, 4]})
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        rows[0]["eval/mean@4"], rows[1]["eval/mean@4"] = 0.5, 0.75
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        recs.append(read_run(d, variant="g", seed=s))
    out = _pass_at(recs)
    assert out["gain_levels"] == "problems and seeds"
    assert out["gain"][1] == pytest.approx((0.25, 0.0, 0.5))


def test_report_intervals_resample_problems_where_runs_recorded_them(tmp_path):
    from rllab_suite.report import markdown, summarize

    recs = [read_run(_run(tmp_path, f"a{s}", s, {0: [0] * 10, 10: [1] * 8 + [0] * 2}), variant="a", seed=s) for s in range(3)]
    summary = summarize(recs)
    d = summary["rows"][0]["final_accuracy"]
    assert d["levels"] == "problems and seeds" and d["mean"] == pytest.approx(0.8)
    assert d["low"] < 0.8 < d["high"]  # every seed alike: over seeds alone this would be a point
    assert summary["eval_size"] == 10
    text = markdown(summary)
    assert "over held-out problems and seeds" in text and "one problem = 10 points" in text


def test_a_suite_can_hold_the_learning_rate_after_warm_up():
    """A claim about late training needs a rate that has not decayed to 0: the suite sets
    train.lr_schedule = "constant" (the warm-up still ramps: (step + 1)/10 over 10 steps)."""
    from rllab.training.optimizer import lr_factor
    from rllab_suite.spec import expand
    from types import SimpleNamespace

    s = parse_suite({"preset": "grpo", "steps": 100, "variants": {"constant": {"train.lr_schedule": "constant"}, "cosine": {}}})
    cells = {c.variant: c for c in expand(s)}
    train = {v: SimpleNamespace(**c.config["train"]) for v, c in cells.items()}
    assert train["constant"].lr_schedule == "constant" and train["constant"].warmup_steps == 10
    assert [lr_factor(train["constant"], k) for k in (0, 4, 9, 50, 99)] == pytest.approx([0.1, 0.5, 1.0, 1.0, 1.0])
    assert lr_factor(train["cosine"], 50) == pytest.approx(0.5)  # ½(1 + cos(π · 50/100))
    assert lr_factor(train["cosine"], 99) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.99)))


def test_the_report_writes_each_runs_per_problem_values(tmp_path):
    import csv as csv_

    from rllab_suite.report import write_all

    recs = [read_run(_run(tmp_path, f"a{s}", s, {0: [0, 0, 1], 10: [1, 0, 1]}, samples={0: [0, 1, 4], 10: [4, 0, 2]}), variant="a", seed=s)
            for s in range(2)]
    write_all(recs, tmp_path / "out", title="t", baseline=None)
    rows = {(r["seed"], r["metric"]): r["values"] for r in csv_.DictReader((tmp_path / "out" / "problems.csv").open())}
    assert rows[("0", "final_accuracy")] == "1 0 1"
    assert rows[("1", "auc_accuracy")] == "0.5 0 1"
    assert rows[("0", "pass@1")] == "1 0 0.5" and rows[("0", "pass@4")] == "1 0 1"  # last eval: 4, 0, 2 of 4 solved
    assert rows[("1", "initial_accuracy")] == "0 0 1"  # step 0: what a suite without no_rl checks learning against
    assert {m for _, m in rows} == {"final_accuracy", "auc_accuracy", "initial_accuracy", "final_reward", "auc_reward", "initial_reward",
                                    "pass@1", "pass@2", "pass@4"}


def test_a_coarse_evaluation_is_named_in_the_notes(tmp_path):
    from rllab_suite.report import notes, summarize

    recs = [read_run(_run(tmp_path, f"a{s}", s, {0: [0] * 50, 10: [1] * 50}), variant="a", seed=s) for s in range(2)]
    (note,) = [n for n in notes(summarize(recs)) if n.startswith("COARSE")]
    assert note.startswith("COARSE EVALUATION: one problem = 2 points (50 held-out problems); a difference of one problem is 2 points")
    recs = [read_run(_run(tmp_path, f"b{s}", s, {0: [0] * 200, 10: [1] * 200}), variant="b", seed=s) for s in range(2)]
    assert not [n for n in notes(summarize(recs)) if n.startswith("COARSE")]


def test_a_run_without_the_metric_drops_out_with_its_seed():
    from types import SimpleNamespace

    def rec(variant, seed, value):
        return SimpleNamespace(variant=variant, task="t", seed=seed, status="done", problem_values=lambda m: None, metric_value=lambda m: value)

    # seed 0 of "tis" lacks the metric: the pairing is over seeds 1 and 2 only, where tis − sync = 0.1 in both
    recs = [rec("tis", 0, math.nan), rec("tis", 1, 0.6), rec("tis", 2, 0.7), rec("sync", 0, 0.0), rec("sync", 1, 0.5), rec("sync", 2, 0.6)]
    (e,) = evaluate_claims(recs, (claim(against="sync"),), tasks=["t"], n_boot=200)
    assert e["diff"]["seeds"] == (2, 3) and e["diff"]["effect"] == pytest.approx(0.65 - 1.1 / 3)
