"""The entropy–performance law R = −a·exp(H) + b of a suite's report (rllab_suite.entropy_law)."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from rllab_suite import entropy_law, report
from rllab_suite.records import RunRecord


def _run(variant, seed, H, R, *, task="addition"):
    steps = list(range(1, len(H) + 1))
    return RunRecord(run_dir=f"/x/{variant}{seed}", variant=variant, task=task, seed=seed, status="done", steps=[0, len(H)],
                     accuracy=[0.2, 0.3], reward=[0.2, 0.3], cost={"tokens": {s: 100.0 for s in steps}, "seconds": {}},
                     train={entropy_law.ENTROPY: (steps, list(map(float, H))), entropy_law.REWARD: (steps, list(map(float, R)))})


def test_the_law_by_hand():
    assert entropy_law.law(0.0, 2.0, 3.0) == pytest.approx(1.0)  # −2·e⁰ + 3
    assert entropy_law.law(math.log(2.0), 1.0, 5.0) == pytest.approx(3.0)  # −1·2 + 5


def test_a_noiseless_series_recovers_a_and_b_exactly():
    H = np.linspace(1.2, 0.1, 30)
    f = entropy_law.fit_law(H, entropy_law.law(H, 0.35, 1.1))
    assert f.ok and f.a == pytest.approx(0.35, abs=1e-10) and f.b == pytest.approx(1.1, abs=1e-10)
    assert f.r2 == pytest.approx(1.0) and f.n == 30


def test_a_noisy_fit_by_hand():
    # x = exp(H) = 1, 2, 3 and R = 1, 0, 0.5: slope −0.25 (S_xy −0.5 / S_xx 2), so a = 0.25, b = 0.5 + 0.25·2 = 1.0;
    # predictions 0.75, 0.5, 0.25, residuals 0.25, −0.5, 0.25: SS_res 0.375 of SS_tot 0.5, R² = 0.25
    f = entropy_law.fit_law(np.log([1.0, 2.0, 3.0]), [1.0, 0.0, 0.5])
    assert (f.a, f.b, f.r2) == pytest.approx((0.25, 1.0, 0.25))


def test_a_fit_says_when_it_is_not_a_result():
    assert "too few points" in entropy_law.fit_law([0.5, 0.4], [0.1, 0.2]).status
    assert "never moved" in entropy_law.fit_law([0.5] * 6, np.linspace(0, 1, 6)).status
    assert not entropy_law.fit_law([0.5, math.nan, 0.4], [0.1, 0.2, math.nan]).ok  # one finite point left


def test_points_are_means_over_bins_of_steps():
    H = np.log([1, 2, 3, 4, 5, 6, 7])  # exp(H) = 1…7: bins of 5 average it to 3 and 6.5
    r = _run("a", 0, H, [0, 0, 0, 0, 1, 1, 1])
    Hb, Rb = entropy_law.binned(r, bin_=5)
    assert Hb == pytest.approx(np.log([3.0, 6.5])) and Rb == pytest.approx([0.2, 1.0])


def test_fit_all_gives_each_arm_its_law_with_intervals_and_its_entropy_against_the_baseline():
    H = np.linspace(1.0, 0.2, 40)
    recs = [_run("grpo", s, H - 0.01 * s, entropy_law.law(H - 0.01 * s, 0.3, 1.0)) for s in range(5)]
    recs += [_run("kl_cov", s, H + 0.1 + 0.01 * s, entropy_law.law(H + 0.1 + 0.01 * s, 0.5, 1.6)) for s in range(5)]
    out = entropy_law.fit_all(recs, tasks=["addition"], arms=["grpo", "kl_cov"], baseline="grpo", n_boot=50)
    g, k = out["tasks"]["addition"]["grpo"], out["tasks"]["addition"]["kl_cov"]
    assert (g["a"], g["b"], k["a"], k["b"]) == pytest.approx((0.3, 1.0, 0.5, 1.6))
    assert g["a_ci"]["low"] == pytest.approx(0.3) and g["a_ci"]["high"] == pytest.approx(0.3)  # every seed on one law
    assert k["p_higher_late"]["mean"] == 1.0 and k["p_higher_whole"]["mean"] == 1.0  # higher entropy in every seed
    # the late entropy is the mean over the last half: 20 of the 40 steps
    assert g["entropy_late"]["mean"] == pytest.approx(np.mean([np.mean((H - 0.01 * s)[20:]) for s in range(5)]))
    assert "p_higher_late" not in g


def test_the_report_shows_the_law_only_when_entropy_and_reward_are_tracked():
    H = np.linspace(1.0, 0.2, 20)
    recs = [_run(v, s, H, entropy_law.law(H, 0.3, 1.0) + 0.01 * s) for v in ("grpo", "clip_higher") for s in range(3)]
    both = report.summarize(recs, baseline="grpo", track=(entropy_law.ENTROPY, entropy_law.REWARD))
    md = report.markdown(both)
    assert "## entropy and the entropy–performance law, task `addition`" in md and "| clip_higher |" in md
    assert both["entropy_law"]["tasks"]["addition"]["grpo"]["a"] == pytest.approx(0.3)
    assert report.summarize(recs, baseline="grpo", track=(entropy_law.ENTROPY,))["entropy_law"] is None


def test_the_written_report_has_the_law_and_its_plot(tmp_path):
    H = np.linspace(1.0, 0.2, 20)
    recs = [_run(v, s, H + 0.01 * s, entropy_law.law(H + 0.01 * s, 0.3, 1.0)) for v in ("grpo", "kl_cov") for s in range(3)]
    report.write_all(recs, tmp_path, title="t", baseline="grpo", track=(entropy_law.ENTROPY, entropy_law.REWARD))
    assert (tmp_path / "entropy_law.png").stat().st_size > 0
    md = (tmp_path / "report.md").read_text()
    assert "![entropy_law](entropy_law.png)" in md and "0.3 [0.3, 0.3]" in md


def test_tracking_entropy_without_the_reward_says_what_to_add():
    H = np.linspace(1.0, 0.2, 20)
    recs = [_run("grpo", s, H, entropy_law.law(H, 0.3, 1.0)) for s in range(3)]
    got = report.notes(report.summarize(recs, baseline="grpo", track=(entropy_law.ENTROPY,)))
    assert any(n.startswith("NO ENTROPY LAW") and "'rollout/accuracy'" in n for n in got)
    assert not any(n.startswith("NO ENTROPY LAW") for n in report.notes(report.summarize(recs, baseline="grpo", track=())))


def test_the_intervals_of_a_and_b_resample_the_runs_of_every_start():
    # seeds 0-4 from two starts on two laws (a = 0.3 and a = 0.6): each bootstrap draw of runs mixes both,
    # so the interval of a holds the pooled fit; drawn by seed alone, one start's runs would stand for both
    H = np.linspace(1.0, 0.2, 40)
    recs = []
    for start, a in ((0, 0.3), (1, 0.6)):
        for s in range(5):
            r = _run("grpo", s, H - 0.01 * s, entropy_law.law(H - 0.01 * s, a, 1.0))
            recs.append(attrs.evolve(r, start=start, run_dir=f"/x/grpo-w{start}-s{s}"))
    out = entropy_law.fit_all(recs, tasks=["addition"], arms=["grpo"], baseline="grpo", n_boot=200)
    g = out["tasks"]["addition"]["grpo"]
    assert 0.3 < g["a"] < 0.6
    assert g["a_ci"]["low"] < g["a"] < g["a_ci"]["high"]
    assert g["a_ci"]["low"] > 0.3 - 1e-9 and g["a_ci"]["high"] < 0.6 + 1e-9
