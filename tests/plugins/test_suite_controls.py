"""Findings with controls: the suite's control arms (random reward, no RL), each arm against them,
curves fitted to compute (ScaleRL's saturating curve), pass@k before and after RL, and the note
that marks intervals resting on fewer than 5 seeds."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from rllab.rollout.evalmetrics import pass_at_k, report_ks
from rllab_suite import controls, fits, report
from rllab_suite.records import RunRecord
from rllab_suite.spec import SuiteError, expand, parse_suite


def suite(**over):
    data = {"name": "t", "preset": "grpo", "steps": 7, "seeds": 3, "tasks": ["addition"], "baseline": "ppo",
            "variants": {"ppo": {"algorithm.minibatches": 2}, "rloo": {"advantage": "rloo"}}, "controls": ["random_reward", "no_rl"]}
    data.update(over)
    return data


# --------------------------------------------------------------------------- control arms


def test_controls_are_the_baseline_with_a_random_reward_and_the_warm_start_alone(lab):
    s = parse_suite(suite())
    assert s.variant_names == ["ppo", "rloo", "random_reward", "no_rl"] and s.controls == ["random_reward", "no_rl"]
    cells = {(c.variant, c.seed): c.config for c in expand(s, lab=lab)}
    rr, none, ppo = cells[("random_reward", 1)], cells[("no_rl", 1)], cells[("ppo", 1)]
    assert rr["rollout"]["random_reward"] == "given" and rr["rollout"]["random_reward_p"] == 0.5
    assert rr["algorithm"]["minibatches"] == 2 and rr["train"]["steps"] == 7  # the baseline's settings and budget
    assert none["train"]["steps"] == 0 and none["algorithm"]["minibatches"] == 2 and none["rollout"]["random_reward"] == "off"
    assert ppo["train"]["steps"] == 7 and ppo["rollout"]["random_reward"] == "off"
    assert none["train"]["eval_size"] == ppo["train"]["eval_size"]  # evaluated like every arm


def test_a_random_reward_control_takes_its_rate(lab):
    cfg = expand(parse_suite(suite(controls=[{"name": "random_reward", "p": 0.2}], baseline=None, seeds=1)), lab=lab)[-1].config
    assert cfg["rollout"]["random_reward_p"] == 0.2 and cfg["algorithm"]["minibatches"] == 1  # no baseline: the base config
    cfg = expand(parse_suite(suite(controls=[{"name": "random_reward", "p": "matched"}], seeds=1)), lab=lab)[-1].config
    assert cfg["rollout"]["random_reward"] == "matched"


@pytest.mark.parametrize("over, needle", [
    ({"controls": ["random"]}, r"'random' is not a control; known: 'random_reward', 'no_rl'"),
    ({"controls": "no_rl"}, r"controls must be a list"),
    ({"controls": ["no_rl", "no_rl"]}, r"'no_rl' is given twice"),
    ({"variants": {"ppo": {}, "no_rl": {}}}, r"'no_rl' is given twice, or is also a variant's name"),
    ({"controls": [{"name": "random_reward", "p": 2}]}, r"p = 2: give a probability in \[0, 1\] or \"matched\""),
    ({"controls": [{"name": "no_rl", "p": 0.5}]}, r"control 'no_rl' takes no settings, not p"),
    ({"controls": [{"name": "random_reward", "q": 0.5}]}, r"control 'random_reward' takes p, not q"),
    ({"compute": "flops"}, r"compute = 'flops'.*'tokens', 'seconds'"),
    ({"baseline": "no_rl"}, r"baseline 'no_rl' is a control arm: give a variant as the baseline"),
])
def test_malformed_controls_are_refused(over, needle):
    with pytest.raises(SuiteError, match=needle):
        parse_suite(suite(**over))


def test_the_identical_variant_check_leaves_the_controls_out(lab, tmp_path, monkeypatch):
    from rllab_suite import suite as suite_mod

    seen = []
    monkeypatch.setattr(suite_mod, "prebuild_models", lambda *a, **k: None)
    monkeypatch.setattr(suite_mod.executor, "run_local", lambda jobs, **k: None)
    monkeypatch.setattr(suite_mod, "identical_variants", lambda cells, **k: seen.extend(c.variant for c in cells) or [])
    suite_mod.run_suite(suite(seeds=1), directory=tmp_path / "s", lab=lab, progress=False, workers=1)
    assert set(seen) == {"ppo", "rloo"}
    manifest = json.loads((tmp_path / "s" / "suite.json").read_text())
    assert manifest["controls"] == ["random_reward", "no_rl"] and manifest["compute"] == "tokens"


# --------------------------------------------------------------------------- against the controls


@pytest.mark.parametrize("poi, want", [(None, "—"), ((0.9, 0.6, 1.0), "beats"), ((0.1, 0.0, 0.4), "below"), ((0.6, 0.5, 0.8), "not told apart")])
def test_control_verdicts(poi, want):
    assert controls.verdict(poi) == want


def _record(variant, seed, acc, *, steps=(0, 10, 20, 40), tokens=100.0, task="addition"):
    return RunRecord(run_dir=f"/x/{variant}{seed}", variant=variant, task=task, seed=seed, status="done", steps=list(steps),
                     accuracy=list(acc), reward=list(acc), cost={"tokens": {s: tokens for s in range(1, max(steps) + 1)}, "seconds": {}})


def test_an_arm_that_ends_above_every_control_run_beats_it():
    recs = [_record("a", s, [0.2, 0.3, 0.4, 0.5 + 0.01 * s]) for s in range(5)]
    recs += [_record("random_reward", s, [0.2, 0.2, 0.25, 0.3 + 0.01 * s]) for s in range(5)]
    recs += [_record("no_rl", s, [0.2], steps=(0,)) for s in range(5)]
    out = controls.against_controls(recs, variants=["a", "random_reward", "no_rl"], tasks=["addition"], controls=("random_reward", "no_rl"))
    got = {(e["variant"], e["control"]): e for e in out}
    assert got[("a", "random_reward")]["p_improvement"]["mean"] == 1.0 and got[("a", "random_reward")]["verdict"] == "beats"
    assert got[("random_reward", "no_rl")]["p_improvement"]["mean"] == 1.0  # 0.30…0.34 against 0.2 five times
    assert got[("no_rl", "random_reward")]["verdict"] == "below"
    assert ("no_rl", "no_rl") not in got and len(out) == 4


# --------------------------------------------------------------------------- curves fitted to compute


def test_the_saturating_curve_by_hand():
    # R0 + (A − R0) / (1 + (C_mid / C)^B): half-way at C_mid, R0 at 0, A far out
    assert fits.saturating(100.0, 0.8, 1.0, 100.0, 0.2) == pytest.approx(0.5)
    assert fits.saturating(200.0, 0.8, 1.0, 100.0, 0.2) == pytest.approx(0.2 + 0.6 / 1.5)
    assert fits.saturating(50.0, 0.8, 2.0, 100.0, 0.2) == pytest.approx(0.2 + 0.6 / 5)
    assert fits.saturating(0.0, 0.8, 2.0, 100.0, 0.2) == pytest.approx(0.2)
    assert fits.saturating(1e12, 0.8, 2.0, 100.0, 0.2) == pytest.approx(0.8)


def test_a_fit_recovers_the_curve_and_says_when_it_is_not_a_result():
    C = np.geomspace(100, 10000, 8)
    f = fits.fit_curve(C, fits.saturating(C, 0.7, 1.5, 1000.0, 0.2), 0.2)
    assert (f.A, f.B, f.C_mid, f.status) == (pytest.approx(0.7, abs=1e-6), pytest.approx(1.5, abs=1e-5), pytest.approx(1000.0, rel=1e-5), "ok")
    assert "too few evaluations" in fits.fit_curve(C[:3], [0.3, 0.4, 0.45], 0.2).status  # 3 points, 3 parameters: no check
    assert fits.fit_curve(C[:4], fits.saturating(C[:4], 0.7, 1.5, 1000.0, 0.2), 0.2).ok
    assert fits.fit_curve(C, 0.2 + 1e-6 * C, 0.2).status.startswith("extrapolated: C_mid")  # a straight line never bends
    assert fits.fit_curve(C, np.where(C > 2000, 0.9, 0.2), 0.2).status.startswith("B at its bound")  # a step between two evals
    assert not fits.fit_curve(C, np.where(C > 2000, 0.9, 0.2), 0.2).ok


def test_a_fit_that_does_not_converge_says_so(monkeypatch):
    import scipy.optimize

    def fail(*a, **k):
        raise RuntimeError("Optimal parameters not found: The maximum number of function evaluations is exceeded.")

    monkeypatch.setattr(scipy.optimize, "curve_fit", fail)
    f = fits.fit_curve(np.geomspace(100, 10000, 8), np.linspace(0.2, 0.6, 8), 0.2)
    assert f.status.startswith("did not converge (RuntimeError: Optimal parameters not found") and not f.ok


def _curve_runs(variant, A, C_mid, *, noise, seeds=5):
    steps = (0, 5, 10, 20, 40, 80, 160)
    rng = np.random.default_rng(len(variant))
    out = []
    for s in range(seeds):
        C = np.array(steps, dtype=float) * 100
        acc = [0.2] + list(fits.saturating(C[1:], A, 1.5, C_mid, 0.2) + rng.normal(0, noise, len(C) - 1))
        out.append(_record(variant, s, acc, steps=steps))
    return out


def test_fits_tell_arms_that_differ_in_A_from_arms_that_differ_only_in_efficiency():
    recs = _curve_runs("base", 0.6, 2000.0, noise=0.005) + _curve_runs("higher", 0.8, 2000.0, noise=0.005)
    recs += _curve_runs("faster", 0.6, 500.0, noise=0.005) + [_record("no_rl", s, [0.2], steps=(0,)) for s in range(5)]
    out = fits.fit_all(recs, tasks=["addition"], arms=["base", "higher", "faster", "no_rl"], baseline="base", n_boot=100)
    arms, pairs = out["tasks"]["addition"]["arms"], {p["arm"]: p for p in out["tasks"]["addition"]["pairs"]}
    assert arms["base"]["A"] == pytest.approx(0.6, abs=0.01) and arms["higher"]["A"] == pytest.approx(0.8, abs=0.01)
    assert arms["base"]["A_ci"]["low"] < 0.6 < arms["base"]["A_ci"]["high"]
    assert arms["faster"]["C_mid_ci"]["high"] < arms["base"]["C_mid_ci"]["low"]
    assert arms["no_rl"]["status"].startswith("no training") and arms["no_rl"]["R0"] == pytest.approx(0.2)
    assert pairs["higher"]["verdict"].startswith("differ in A: higher saturates higher")
    assert pairs["faster"]["verdict"].startswith("same A within the CI; differ only in efficiency: faster reaches half its gain with less")
    assert set(pairs) == {"higher", "faster"}
    assert "extrapolated" not in pairs["higher"]["verdict"]
    md = "\n".join(fits.markdown_lines(out, "addition"))
    assert "| no_rl | — | — | — | 20.0 | — | — | no training (the warm start alone) |" in md
    assert f"| higher | {100 * arms['higher']['A']:.1f} [{100 * arms['higher']['A_ci']['low']:.1f}, " in md
    pred = arms["higher"]["prediction"]  # the prediction's error beside the last value's
    assert f"| {100 * pred['mae']:.1f} (last value {100 * pred['mae_last']:.1f}) |" in md and "beside that of keeping the last early" in md


def test_summary_csv_carries_each_arms_fit(tmp_path):
    import csv

    recs = _curve_runs("base", 0.6, 2000.0, noise=0.005) + [_record("no_rl", s, [0.2], steps=(0,)) for s in range(5)]
    summary = report.write_all(recs, tmp_path, title="t", baseline=None)
    rows = {r["variant"]: r for r in csv.DictReader((tmp_path / "summary.csv").open())}
    fit = summary["fits"]["tasks"]["addition"]["arms"]["base"]
    base = rows["base"]
    assert base["fit_status"] == "ok" and float(base["fit_A"]) == pytest.approx(fit["A"]) and float(base["fit_A"]) == pytest.approx(0.6, abs=0.01)
    assert float(base["fit_A_low"]) == pytest.approx(fit["A_ci"]["low"]) and float(base["fit_C_mid_high"]) == pytest.approx(fit["C_mid_ci"]["high"])
    assert float(base["fit_C_mid_tokens"]) == pytest.approx(fit["C_mid"])
    assert rows["no_rl"]["fit_status"].startswith("no training") and rows["no_rl"]["fit_A"] == ""


def test_an_arm_with_one_seed_gets_a_fit_without_an_interval():
    recs = _curve_runs("one", 0.6, 2000.0, noise=0.005, seeds=1)
    out = fits.fit_all(recs, tasks=["addition"], arms=["one"], n_boot=20)
    row = next(line for line in fits.markdown_lines(out, "addition") if line.startswith("| one |"))
    assert row.startswith(f"| one | {100 * out['tasks']['addition']['arms']['one']['A']:.1f} | ") and "[" not in row
    assert "nan" not in row and row.count("| — |") >= 1  # no refits: no failure rate either


def test_a_pair_verdict_names_an_extrapolated_asymptote():
    short = [_record("slow", s, [0.2, 0.205 + 0.001 * s, 0.21, 0.22, 0.24, 0.28 - 0.001 * s], steps=(0, 5, 10, 20, 40, 80)) for s in range(5)]  # a line in C
    recs = _curve_runs("base", 0.6, 2000.0, noise=0.005) + short
    out = fits.fit_all(recs, tasks=["addition"], arms=["base", "slow"], baseline="base", n_boot=50)
    assert out["tasks"]["addition"]["arms"]["slow"]["status"].startswith("extrapolated")
    assert out["tasks"]["addition"]["pairs"][0]["verdict"].startswith("not compared: slow: A extrapolated beyond the compute measured")


def test_an_asymptote_on_its_bound_or_with_failed_refits_is_never_compared():
    assert fits._unpinned({"status": "ok", "A": 1.0, "A_on_bound": True, "boot_failure_rate": 0.0}) == ["A on its bound (100%)"]
    assert fits._unpinned({"status": "ok", "A": 0.5, "A_on_bound": False, "boot_failure_rate": 0.42}) == ["42% of the refits failed"]
    assert fits._unpinned({"status": "ok", "A": 0.5, "A_on_bound": False, "boot_failure_rate": 0.1}) == []  # at most 10%: compared
    # a curve still rising steeply at the end of the data, fitted with A pinned at 1 (its bound)
    steep = [_record("steep", s, list(fits.saturating(np.array([1.0, 500, 1000, 2000, 4000, 8000]), 1.0, 3.0, 9000.0, 0.2) + [0, 0.001 * s, 0, 0, 0, 0]),
                     steps=(0, 5, 10, 20, 40, 80)) for s in range(5)]
    recs = _curve_runs("base", 0.6, 2000.0, noise=0.005) + steep
    out = fits.fit_all(recs, tasks=["addition"], arms=["base", "steep"], baseline="base", n_boot=30)
    arm = out["tasks"]["addition"]["arms"]["steep"]
    if arm["A_on_bound"]:
        assert "A on its bound (100%)" in out["tasks"]["addition"]["pairs"][0]["verdict"]
    assert out["tasks"]["addition"]["pairs"][0]["verdict"].startswith("not compared: ")
    md = "\n".join(fits.markdown_lines(out, "addition"))
    assert "| refit failures |" in md and "never a verdict" in md


def test_the_predictive_check_by_hand():
    """Evaluations at C = 500 … 16000; the early half (C ≤ 8000: 500, 1000, 2000, 4000, 8000) is
    fitted, 16000 predicted. On an exact curve the error is 0; with the last evaluation 10 points
    below the curve in every seed, it is 10 points."""
    steps = (0, 5, 10, 20, 40, 80, 160)
    C = np.array(steps, dtype=float) * 100
    exact = [0.2] + list(fits.saturating(C[1:], 0.7, 1.5, 1000.0, 0.2))
    runs = [(_record("a", s, exact, steps=steps), list(C)) for s in range(3)]
    got = fits.predictive_check(runs)
    assert got["status"] == "ok" and got["cutoff"] == 8000 and got["early_points"] == 15 and got["later_steps"] == 1
    assert got["mae"] == pytest.approx(0.0, abs=1e-6)
    # the trivial forecast: accuracy stays at its value at C = 8000
    assert got["mae_last"] == pytest.approx(exact[-1] - exact[-2])
    dropped = exact[:-1] + [exact[-1] - 0.1]
    runs = [(_record("a", s, dropped, steps=steps), list(C)) for s in range(3)]
    assert fits.predictive_check(runs)["mae"] == pytest.approx(0.1, abs=1e-6)
    assert fits.predictive_check(runs)["mae_last"] == pytest.approx(abs(exact[-1] - 0.1 - exact[-2]))
    short = [(_record("a", s, exact[:3], steps=steps[:3]), list(C[:3])) for s in range(3)]
    assert fits.predictive_check(short)["status"].startswith("early fit not usable: too few evaluations")


def test_compute_is_summed_over_the_training_steps_up_to_each_evaluation(tmp_path):
    rows = [{"step": 0, "eval/accuracy": 0.1}, {"step": 1, "rollout/tokens": 30, "time/step": 0.5},
            {"step": 2, "rollout/tokens": 50, "time/step": 0.25}, {"step": 2, "eval/accuracy": 0.3},
            {"step": 3, "rollout/tokens": 20, "time/step": 1.0}, {"step": 3, "eval/accuracy": 0.4, "eval/mean@4": 0.25,
                                                                 "eval/pass@2": 0.5, "eval/pass@4": 0.75}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "final.json").write_text("{}")
    r = report.read_run(tmp_path, variant="a", task="t", seed=0)
    assert r.compute("tokens") == [0.0, 80.0, 100.0] and r.compute("seconds") == [0.0, 0.75, 1.75]
    assert r.pass_at == {3: {1: 0.25, 2: 0.5, 4: 0.75}}


# --------------------------------------------------------------------------- pass@k and honest intervals


def test_pass_at_k_up_to_256_is_the_closed_form():
    assert report_ks(256) == [2, 4, 8, 16, 32, 64, 128, 256]
    for c in (0, 1, 7, 128, 255, 256):
        for k in range(1, 257):
            want = 1 - Fraction(math.comb(256 - c, k), math.comb(256, k))
            assert pass_at_k(256, c, k) == pytest.approx(float(want), abs=1e-12), (c, k)


def test_pass_at_k_before_and_after_rl_is_reported_and_plotted(tmp_path):
    recs = []
    for s in range(5):
        r = _record("a", s, [0.2, 0.4, 0.5, 0.6])
        recs.append(RunRecord(**{**{f: getattr(r, f) for f in ("run_dir", "variant", "task", "seed", "status", "steps", "accuracy", "reward", "cost")},
                                 "pass_at": {0: {1: 0.1, 2: 0.2}, 40: {1: 0.3 + 0.01 * s, 2: 0.4}}}))
    summary = report.write_all(recs, tmp_path, title="t", baseline=None)
    pa = summary["rows"][0]["pass_at"]
    assert {w: pa[w] for w in ("before", "after")} == {"before": {1: 0.1, 2: 0.2}, "after": {1: pytest.approx(0.32), 2: pytest.approx(0.4)}}
    # the gain of each seed over its own first evaluation: 0.20 … 0.24 at k = 1 (mean 0.22), 0.2 at k = 2 for every seed
    assert pa["gain"][1][0] == pytest.approx(0.22) and 0.20 <= pa["gain"][1][1] <= 0.22 <= pa["gain"][1][2] <= 0.24
    assert pa["gain"][2] == pytest.approx((0.2, 0.2, 0.2))
    md = (tmp_path / "report.md").read_text()
    assert "| a | 10.0 → 32.0 | 20.0 → 40.0 |" in md
    assert "| a | +22.0 [" in md and "| none up to k = 2 |" in md
    assert "| a | — | — | — | 20.0 | — | early fit not usable: too few evaluations to fit three parameters (2 compute values after step 0; need 4 or more) | too few evaluations to fit three parameters (3 compute values after step 0; need 4 or more) |" in md  # no refits
    assert (tmp_path / "pass_at_k.png").is_file() and (tmp_path / "fits.png").is_file()


def test_the_pass_at_k_crossover_is_where_the_base_stays_above_by_hand():
    nan = math.nan
    # mean gain +, +, −, + , −, −: the base stays above from k = 16 on; the CI's upper end is below 0 only at k = 32
    gain = {1: (0.1, 0.05, 0.15), 2: (0.05, 0.0, 0.1), 4: (-0.01, -0.02, 0.01), 8: (0.01, -0.01, 0.02),
            16: (-0.02, -0.04, 0.01), 32: (-0.03, -0.05, -0.01)}
    assert report.crossover(gain) == (16, 32)
    assert report.crossover({1: (0.1, 0.0, 0.2), 2: (0.05, 0.0, 0.1)}) == (None, None)
    # one seed: no interval, so never sure
    assert report.crossover({1: (0.1, nan, nan), 2: (-0.1, nan, nan)}) == (2, None)
    # the last k sure but not the one before it: sure from the last only
    assert report.crossover({4: (-0.02, -0.04, 0.01), 8: (-0.03, -0.05, -0.01)}) == (4, 8)


def test_pass_at_k_crossover_in_the_report(tmp_path):
    """Two seeds whose RL arm gains at k = 1 and loses at k = 4: the report names k = 4 (mean) and the
    gains with their intervals."""
    recs = []
    for s in range(5):
        r = _record("a", s, [0.2, 0.4, 0.5, 0.6])
        recs.append(RunRecord(**{**{f: getattr(r, f) for f in ("run_dir", "variant", "task", "seed", "status", "steps", "accuracy", "reward", "cost")},
                                 "pass_at": {0: {1: 0.1, 2: 0.3, 4: 0.9}, 40: {1: 0.3, 2: 0.35 + 0.01 * s, 4: 0.8 - 0.01 * s}}}))
    summary = report.write_all(recs, tmp_path, title="t", baseline=None)
    gain = summary["rows"][0]["pass_at"]["gain"]
    assert gain[4][0] == pytest.approx(-0.12) and gain[4][2] < 0
    md = (tmp_path / "report.md").read_text()
    assert "| k ≥ 4 (sure from k = 4) |" in md
    assert "+20.0 [+20.0, +20.0]" in md and "-12.0 [" in md


@pytest.mark.parametrize("seeds, unreliable", [(3, True), (4, True), (5, False)])
def test_fewer_than_five_seeds_mark_the_intervals_unreliable(tmp_path, seeds, unreliable):
    recs = [_record(v, s, [0.2, 0.3, 0.4, 0.5 + 0.01 * s]) for v in ("a", "b") for s in range(seeds)]
    summary = report.summarize(recs, baseline="a")
    assert any(n.startswith("UNRELIABLE CIs") for n in report.notes(summary)) is unreliable
    assert ("Unreliable intervals" in report.markdown(summary)) is unreliable


def test_the_tui_reports_a_suites_controls(lab, tmp_path):
    from rllab_tui.state import SuiteDir

    path = tmp_path / "s.toml"
    path.write_text('name = "t"\npreset = "grpo"\nsteps = 3\nseeds = 3\ncontrols = ["no_rl"]\ncompute = "seconds"\n[variants]\ngrpo = {}\n')
    sd = SuiteDir(lab, file=path, directory=tmp_path / "d")
    assert (sd.controls, sd.compute) == (("no_rl",), "seconds")
    assert [(e["variant"], e["control"]) for e in sd.summary()["vs_controls"]] == [("grpo", "no_rl")]


def test_the_report_states_whether_each_arm_beats_the_controls(tmp_path):
    from rich.console import Console

    recs = _curve_runs("a", 0.6, 2000.0, noise=0.005) + _curve_runs("random_reward", 0.3, 2000.0, noise=0.005)
    recs += [_record("no_rl", s, [0.2], steps=(0,)) for s in range(5)]
    console = Console(record=True, width=200)
    report.write_all(recs, tmp_path, title="t", baseline="a", controls=("random_reward", "no_rl"), console=console)
    md = (tmp_path / "report.md").read_text()
    assert "| a | 1.00 [1.00, 1.00] beats | 1.00 [1.00, 1.00] beats |" in md
    assert "| random_reward | (itself) | 1.00 [1.00, 1.00] beats |" in md
    assert "| no_rl | 0.00 [0.00, 0.00] below | (itself) |" in md
    assert "- random_reward vs a: differ in A: random_reward saturates lower" in md
    text = console.export_text()
    assert "against the controls" in text and "random_reward vs a: differ in A" in text
