"""The entropy–performance law on held-out accuracy, checked by prediction (rllab_suite.entropy_law.heldout_check),
against hand-computed values; and the findings page's law block reading it from summary.json."""

from __future__ import annotations

import json
import math

import pytest

from rllab_suite import entropy_law, report
from rllab_suite.findings import Findings
from rllab_suite.records import RunRecord

EVALS = [0, 10, 20, 30, 40]


def _run(seed, x, *, variant="grpo", a=0.5, b=1.2, acc=None):
    """Held-out accuracy −a·x + b at eval steps 0…40 (x = exp(H) there), the entropy logged at every
    training step 1…40 as log x of the evaluation whose bin (the 5 steps up to it) holds it (step 1: step 0's)."""
    H = {t: math.log(x[0]) for t in range(1, 6)}
    for s, xs in zip(EVALS[1:], x[1:]):
        H.update({t: math.log(xs) for t in range(s - 4, s + 1)})
    H[1] = math.log(x[0])
    steps = sorted(H)
    acc = acc if acc is not None else [-a * v + b for v in x]
    return RunRecord(run_dir=f"/x/{variant}{seed}", variant=variant, task="addition", seed=seed, status="done", steps=list(EVALS),
                     accuracy=acc, reward=acc, train={entropy_law.ENTROPY: (steps, [H[t] for t in steps]),
                                                     entropy_law.REWARD: (steps, [0.1] * len(steps))})


def test_the_entropy_at_an_evaluation_is_the_mean_of_exp_h_over_the_steps_up_to_it():
    """H_t = log t at steps 1…10, evaluations at 0, 5 and 10: step 0 takes step 1's (log 1 = 0),
    step 5 log mean(1…5) = log 3, step 10 log mean(6…10) = log 8."""
    steps = list(range(1, 11))
    r = RunRecord(run_dir="/x", variant="grpo", task="addition", seed=0, status="done", steps=[0, 5, 10], accuracy=[0.1, 0.2, math.nan],
                  reward=[0.1, 0.2, 0.3], train={entropy_law.ENTROPY: (steps, [math.log(t) for t in steps])})
    p = entropy_law.eval_points(r)
    assert p["steps"] == [0, 5] and p["accuracy"] == [0.1, 0.2]  # step 10's accuracy is not finite: left out
    assert p["entropy"] == pytest.approx([0.0, math.log(3.0)])
    r10 = RunRecord(run_dir="/x", variant="grpo", task="addition", seed=0, status="done", steps=[10], accuracy=[0.3], reward=[0.3],
                    train={entropy_law.ENTROPY: (steps, [math.log(t) for t in steps])})
    assert entropy_law.eval_points(r10)["entropy"] == pytest.approx([math.log(8.0)])


def test_a_law_that_holds_predicts_exactly_and_beats_the_last_value():
    """Two runs on R = −0.5·exp(H) + 1.2, exp(H) = 2.0, 1.8, 1.6, 1.4, 1.2 and 2.0, 1.7, 1.5, 1.3, 1.0:
    R = 0.2, 0.3, 0.4, 0.5, 0.6 and 0.2, 0.35, 0.45, 0.55, 0.7. The cutoff is 20 (half of 40): the
    early fit (6 points) recovers a = 0.5, b = 1.2 and predicts steps 30 and 40 without error, while
    each run's last early accuracy (0.4, 0.45) misses by 0.1, 0.2 and 0.1, 0.25: mean 0.1625."""
    runs = [_run(0, [2.0, 1.8, 1.6, 1.4, 1.2]), _run(1, [2.0, 1.7, 1.5, 1.3, 1.0])]
    d = entropy_law.heldout_check([entropy_law.eval_points(r) for r in runs], n_boot=50)
    assert d["cutoff"] == 20 and d["early"]["points"] == 6 and d["points"] == 10 and d["predicted"] == 4
    assert (d["a"], d["b"], d["r2"]) == pytest.approx((0.5, 1.2, 1.0))
    assert (d["early"]["a"], d["early"]["b"]) == pytest.approx((0.5, 1.2))
    assert d["mae_law"] == pytest.approx(0.0, abs=1e-9) and d["mae_last"] == pytest.approx(0.1625) and d["mae_diff"] == pytest.approx(-0.1625)
    assert d["mae_diff_ci"]["high"] < 0 and entropy_law.prediction_reading(d) == "better than the last value"
    assert entropy_law._pts(d, "mae_last") == "16.3 [15.0, 17.5]"  # resamples of the two runs: 0.15, 0.1625, 0.175


def test_accuracy_that_does_not_follow_the_entropy_is_predicted_worse_than_the_last_value():
    """Accuracy flat at 0.3 after step 10 while the entropy keeps falling: the early fit
    (0.2 → 0.3 over exp(H) 2.0 → 1.8, then 0.3 at 1.6) extrapolates a rise the runs never make."""
    flat = [0.2, 0.3, 0.3, 0.3, 0.3]
    runs = [_run(s, [2.0, 1.8, 1.6, 1.4, 1.2], acc=flat) for s in range(3)]
    d = entropy_law.heldout_check([entropy_law.eval_points(r) for r in runs], n_boot=50)
    # by hand: the least-squares line through the early points (2.0, 0.2), (1.8, 0.3), (1.6, 0.3), each thrice
    x, y = [2.0, 1.8, 1.6], [0.2, 0.3, 0.3]
    mx, my = sum(x) / 3, sum(y) / 3
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
    pred = [my + slope * (v - mx) for v in (1.4, 1.2)]
    assert d["mae_law"] == pytest.approx((abs(pred[0] - 0.3) + abs(pred[1] - 0.3)) / 2) and d["mae_last"] == pytest.approx(0.0)
    assert entropy_law.prediction_reading(d) == "worse than the last value"


def test_what_cannot_be_checked_says_why():
    one = entropy_law.heldout_check([entropy_law.eval_points(_run(0, [2.0, 1.8, 1.6, 1.4, 1.2]))], n_boot=10)
    assert one["prediction_status"] == "ok" and "mae_diff_ci" not in one and entropy_law.prediction_reading(one) == "no interval (one run)"
    short = RunRecord(run_dir="/x", variant="grpo", task="addition", seed=0, status="done", steps=[0, 10], accuracy=[0.2, 0.3], reward=[0.2, 0.3],
                      train={entropy_law.ENTROPY: (list(range(1, 11)), [0.5] * 10)})
    d = entropy_law.heldout_check([entropy_law.eval_points(short)] * 2, n_boot=10)
    assert d["prediction_status"].startswith("the early fit is not a result: too few points")


def test_the_report_keeps_each_runs_series_and_shows_the_check(tmp_path):
    runs = [_run(0, [2.0, 1.8, 1.6, 1.4, 1.2]), _run(1, [2.0, 1.7, 1.5, 1.3, 1.0])]
    s = report.summarize(runs, baseline="grpo", track=(entropy_law.ENTROPY, entropy_law.REWARD))
    law = s["entropy_law"]
    assert law["series"]["addition"]["grpo"][1]["accuracy"] == pytest.approx([0.2, 0.35, 0.45, 0.55, 0.7])
    assert law["series"]["addition"]["grpo"][1]["entropy"] == pytest.approx([math.log(v) for v in (2.0, 1.7, 1.5, 1.3, 1.0)])
    lines = "\n".join(entropy_law.markdown_lines(law, "addition"))
    assert "### the law on held-out accuracy, checked by prediction" in lines
    assert "| grpo | 0.5" in lines and "| 4 | 0.0 [0.0, 0.0] | 16.3 [15.0, 17.5] |" in lines and "better than the last value |" in lines

    root = tmp_path / "repo"
    res = root / "benchmarks" / "suites" / "results" / "e"
    res.mkdir(parents=True)
    (res / "runs.csv").write_text("variant,task,seed,status\n")
    (res / "summary.json").write_text(json.dumps({"entropy_law": json.loads(json.dumps(law, default=float))}))
    block = Findings(root).law("e")
    assert "R = −a·exp(H) + b on *held-out* accuracy" in block and "better than the last value" in block
    assert "The same law fitted to *training* accuracy" in block
    del law["heldout"]
    (res / "summary.json").write_text(json.dumps({"entropy_law": json.loads(json.dumps(law, default=float))}))
    assert "holds no held-out series" in Findings(root).law("e")


def test_runs_from_several_starts_are_also_checked_per_start():
    """Start 0's runs follow R = −0.5·exp(H) + 1.2, start 1's R = −0.5·exp(H) + 1.0 (20 points lower):
    each start alone is fitted exactly (b = 1.2 and 1.0, no prediction error); pooled, neither."""
    import attrs

    runs = [_run(0, [2.0, 1.8, 1.6, 1.4, 1.2]), _run(1, [2.0, 1.7, 1.5, 1.3, 1.0])]
    runs += [attrs.evolve(_run(s, x, b=1.0), start=1) for s, x in ((0, [2.0, 1.9, 1.6, 1.4, 1.1]), (1, [2.0, 1.6, 1.5, 1.2, 1.0]))]
    runs = [attrs.evolve(r, start=0) if r.start is None else r for r in runs]
    law = entropy_law.fit_all(runs, tasks=["addition"], arms=["grpo"], n_boot=20)
    per = law["heldout_per_start"]["addition"]
    assert [p["start"] for p in per] == [0, 1]
    assert [p["arms"]["grpo"]["b"] for p in per] == [pytest.approx(1.2), pytest.approx(1.0)]
    assert [p["arms"]["grpo"]["mae_law"] for p in per] == [pytest.approx(0.0, abs=1e-9)] * 2
    assert law["heldout"]["addition"]["grpo"]["r2"] < 1 and law["heldout"]["addition"]["grpo"]["mae_law"] > 0
    md = "\n".join(entropy_law.heldout_lines(law, "addition"))
    assert "each start's runs alone" in md and "| 1 | grpo | 0.5 | 1 | 1.00 | 10 | 0.0 [0.0, 0.0] |" in md
