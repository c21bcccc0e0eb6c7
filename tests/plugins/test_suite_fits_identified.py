"""A compute-curve fit whose B and C_mid the data do not pin down says so, whatever the number of
seeds: left at its starting guesses, a singular Jacobian, or a curve no better than a constant."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import f as f_dist

from rllab_suite import fits
from rllab_suite.records import RunRecord

STEPS = (0, 5, 10, 20, 40, 80, 160)


def _runs(variant, acc_after_0, *, seeds, R0=0.3):
    """Runs whose held-out accuracy after step 0 is ``acc_after_0(seed)`` (compute: 100 tokens a step)."""
    return [RunRecord(run_dir=f"/x/{variant}{s}", variant=variant, task="addition", seed=s, status="done", steps=list(STEPS),
                      accuracy=[R0, *acc_after_0(s)], reward=[R0, *acc_after_0(s)],
                      cost={"tokens": {k: 100.0 for k in range(1, max(STEPS) + 1)}, "seconds": {}})
            for s in range(seeds)]


C = np.array(STEPS[1:], dtype=float) * 100


def test_a_flat_curve_at_its_start_is_not_identified_and_says_why():
    f = fits.fit_curve(np.tile(C, 3), np.full(3 * C.size, 0.3), 0.3)
    assert not f.ok
    # the optimiser had no gradient: B and C_mid are exactly the starting guesses, 1 and the median compute
    assert f.B == 1.0 and f.C_mid == float(np.median(C)) == 3000.0  # (2000 + 4000) / 2
    assert f.status.startswith("parameters not identified: B and C_mid stayed at their starting guesses (1 and the median compute, 3e+03)")


def test_a_noisy_flat_curve_is_not_identified():
    rng = np.random.default_rng(0)
    for seeds in (1, 3, 8):
        CC = np.tile(C, seeds)
        f = fits.fit_curve(CC, 0.3 + rng.normal(0, 0.01, CC.size), 0.3)
        assert not f.ok, (seeds, f)
        assert "not identified" in f.status, (seeds, f.status)


def test_a_good_sigmoid_is_recovered_and_ok():
    rng = np.random.default_rng(1)
    CC = np.tile(C, 3)
    f = fits.fit_curve(CC, fits.saturating(CC, 0.8, 1.5, 2000.0, 0.3) + rng.normal(0, 0.01, CC.size), 0.3)
    assert f.status == "ok"
    assert f.A == pytest.approx(0.8, abs=0.03) and f.B == pytest.approx(1.5, rel=0.25) and f.C_mid == pytest.approx(2000.0, rel=0.2)
    # the noise-free curve: exact, and its Jacobian far from singular
    g = fits.fit_curve(CC, fits.saturating(CC, 0.8, 1.5, 2000.0, 0.3), 0.3)
    assert g.status == "ok" and (g.A, g.B, g.C_mid) == pytest.approx((0.8, 1.5, 2000.0), rel=1e-6)


def test_the_singular_jacobian_check_by_hand():
    # at A = R0 the curve is R0 whatever B and C_mid: their columns of the Jacobian are zero
    why = fits._unidentified(C, np.full(C.size, 0.3), 0.3, 0.3, 1.2, 1500.0)
    assert why.startswith("the fit is singular (a flat curve: its rise A − R0 = +0 points")
    assert fits._unidentified(C, fits.saturating(C, 0.8, 1.5, 2000.0, 0.3), 0.3, 0.8, 1.5, 2000.0) == ""


def test_the_flat_against_a_constant_check_by_hand():
    # data that zig-zag around 0.31 and a gentle curve through them: the curve is no better than their mean
    R = 0.31 + np.array([0.01, -0.01, 0.01, -0.01, 0.01, -0.01])
    A, B, Cm = 0.32, 1.0, 1000.0
    fitted = fits.saturating(C, A, B, Cm, 0.3)
    rss_flat, rss_fit = float(np.sum((R - R.mean()) ** 2)), float(np.sum((R - fitted) ** 2))
    F = ((rss_flat - rss_fit) / 2) / (rss_fit / (R.size - 3))
    crit = f_dist.ppf(0.95, 2, 3)  # 9.55: the 5% point of F(2, 3)
    assert crit == pytest.approx(9.552, abs=1e-3) and F < crit
    why = fits._unidentified(C, R, 0.3, A, B, Cm)
    assert why == (f"a flat curve: the fit explains the evaluations no better than their mean does (F = {F:.2g}, "
                   f"below {crit:.2g} at the 5% level), so B and C_mid describe noise")
    assert fits._unidentified(C, np.full(C.size, 0.31), 0.3, A, B, Cm).startswith("a flat curve: every evaluation has the same accuracy")


@pytest.mark.parametrize("seeds", [1, 2, 5])
def test_fit_all_reports_a_flat_arm_as_not_identified_and_never_compares_it(seeds):
    rng = np.random.default_rng(seeds)
    noise = {s: rng.normal(0, 0.005, C.size) for s in range(seeds)}
    good = {s: fits.saturating(C, 0.8, 1.5, 2000.0, 0.3) + rng.normal(0, 0.005, C.size) for s in range(seeds)}
    recs = _runs("flat", lambda s: list(0.3 + noise[s]), seeds=seeds) + _runs("exact_flat", lambda s: [0.3] * C.size, seeds=seeds)
    recs += _runs("base", lambda s: list(good[s]), seeds=seeds)
    out = fits.fit_all(recs, tasks=["addition"], arms=["base", "flat", "exact_flat"], baseline="base", n_boot=20)
    arms = out["tasks"]["addition"]["arms"]
    assert arms["base"]["status"] == "ok"
    for a in ("flat", "exact_flat"):
        assert not arms[a]["status"].startswith(("ok", "extrapolated")), arms[a]["status"]  # not identified, on a bound, or no fit
        assert "A_ci" not in arms[a]  # no interval around a fit that is not a result
    assert "stayed at their starting guesses" in arms["exact_flat"]["status"]
    assert all(p["arm"] == "base" or p["other"] == "base" for p in out["tasks"]["addition"]["pairs"])
    assert not any({p["arm"], p["other"]} & {"flat", "exact_flat"} for p in out["tasks"]["addition"]["pairs"])
    assert math.isfinite(arms["base"]["A"])
