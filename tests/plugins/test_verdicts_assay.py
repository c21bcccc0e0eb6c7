"""Assay sensitivity (rllab_suite.verdicts): an equivalence verdict holds only where the reference arm
beats the no-learning control (no_rl) separably, per start and from every start over starts; a start
whose reference does not learn is flagged; a metric the control has no value of (track:, pass@k) is checked on final
held-out accuracy instead. Every value below is computed by hand: constant
per-problem values give point intervals, and one case resamples 4 problems whose law is known."""

from __future__ import annotations

import pytest

from rllab_suite import pooled
from rllab_suite.committed import CsvRun
from rllab_suite.findings import _learning_note
from rllab_suite.report import starts_lines
from rllab_suite.verdicts import (
    ASSAY_UNCHECKED, NOT_SEPARABLE, REPRODUCED, Claim, assay, evaluate_claims, learning_by_start, learning_lines, markdown_lines, require_assay,
)

EQUIV = "equivalent within ±2 points"
CLAIM = Claim(name="b_matches_a", statement="b ends where a does", arm="b", against="a", metric="final_accuracy", direction="equal",
              min_effect=0.03, margin=0.02)


def runs(per_start: dict, seeds: int = 3) -> list[CsvRun]:
    """``per_start``: start -> {arm: per-problem final accuracies}, the same for every seed (point intervals)."""
    out = []
    for start, arms in per_start.items():
        for arm, vals in arms.items():
            for seed in range(seeds):
                out.append(CsvRun(variant=arm, task="addition", seed=seed, status="done", values={}, problems={"final_accuracy": list(vals)},
                                  start=start, start_sha256=None if start is None else f"{start}" * 64))
    return out


def flat(v: float) -> list[float]:
    return [v] * 4


# --------------------------------------------------------------------------- one start


def test_equivalence_holds_where_the_reference_beats_the_control():
    # a = b = 0.40 on every problem: effect 0, 90% CI [0, 0] inside ±2 → equivalent; a − no_rl = 0.40 − 0.20 = +20 points,
    # 95% CI [+20, +20] above 0: assay sensitivity, the verdict stands and says so
    (e,) = evaluate_claims(runs({None: {"a": flat(0.4), "b": flat(0.4), "no_rl": flat(0.2)}}), (CLAIM,), tasks=["addition"], control="no_rl",
                           n_boot=300)
    assert e["verdict"] == EQUIV and e["assay_mark"] == ""
    assert e["assay"]["learns"] is True and e["assay"]["diff"]["effect"] == pytest.approx(0.2)
    assert "assay sensitivity: a − no_rl on final_accuracy: +20.0 [+20.0, +20.0] points, 95% CI above 0" in e["why"]


@pytest.mark.parametrize("control, gain", [(0.4, "+0.0 [+0.0, +0.0]"), (0.5, "-10.0 [-10.0, -10.0]")])
def test_the_same_numbers_with_a_control_the_reference_does_not_beat_are_not_separable(control, gain):
    # the arms as above, but no_rl scores as much as a (or more): a − no_rl's CI is not above 0, so the equivalence is vacuous
    (e,) = evaluate_claims(runs({None: {"a": flat(0.4), "b": flat(0.4), "no_rl": flat(control)}}), (CLAIM,), tasks=["addition"],
                           control="no_rl", n_boot=300)
    assert e["verdict"] == NOT_SEPARABLE and e["diff"]["ci90"] == pytest.approx((0.0, 0.0))
    assert e["assay"]["learns"] is False
    assert f"without assay sensitivity: a − no_rl on final_accuracy: {gain} points, 95% CI not above 0" in e["why"]


def test_a_gain_whose_interval_reaches_zero_is_not_learning():
    # a − no_rl per problem: [1,1,0,0] − [1,0,0,0] = [0,1,0,0], a gain of +25 points. Resampling the 4 problems draws
    # k ~ Binomial(4, 1/4) ones: P(k = 0) = 0.316 > 2.5%, so the CI's low end is 0; P(k ≥ 3) = 0.051 > 2.5% and P(k = 4) = 0.004,
    # so its high end is 3/4. The seeds are alike. Not above 0: no assay sensitivity
    (e,) = evaluate_claims(runs({None: {"a": [1, 1, 0, 0], "b": [1, 1, 0, 0], "no_rl": [1, 0, 0, 0]}}), (CLAIM,), tasks=["addition"],
                           control="no_rl", n_boot=2000)
    assert e["assay"]["diff"]["ci95"] == pytest.approx((0.0, 0.75))
    assert e["verdict"] == NOT_SEPARABLE and "a − no_rl on final_accuracy: +25.0 [+0.0, +75.0] points, 95% CI not above 0" in e["why"]


def test_a_difference_that_separates_does_not_need_the_control():
    # b 0.60 against a 0.40: +20 points, reproduced for a "higher" claim, although a does not beat no_rl (0.40 each)
    higher = Claim(**{**CLAIM.to_dict(), "direction": "higher", "statement": "b ends above a"})
    (e,) = evaluate_claims(runs({None: {"a": flat(0.4), "b": flat(0.6), "no_rl": flat(0.4)}}), (higher,), tasks=["addition"], control="no_rl",
                           n_boot=300)
    assert e["verdict"] == REPRODUCED and "assay" not in e["why"]


def test_without_a_control_the_equivalence_is_kept_and_marked():
    (e,) = evaluate_claims(runs({None: {"a": flat(0.4), "b": flat(0.4)}}), (CLAIM,), tasks=["addition"], n_boot=300)
    assert e["verdict"] == EQUIV and e["assay_mark"] == ASSAY_UNCHECKED == "(no control to check assay sensitivity)"
    assert ("assay sensitivity not checked: the suite has no no-learning control (no_rl) and its runs kept no step-0 evaluation per "
            "problem (initial_accuracy)") in e["why"]
    text = "\n".join(markdown_lines([e], eval_size=4))
    assert "| **equivalent within ±2 points** (no control to check assay sensitivity) |" in text


@pytest.mark.parametrize("initial, verdict, said", [
    (0.2, EQUIV, "assay sensitivity: a − its step-0 evaluation on final_accuracy: +20.0 [+20.0, +20.0] points, 95% CI above 0"),
    (0.4, NOT_SEPARABLE, "without assay sensitivity: a − its step-0 evaluation on final_accuracy: +0.0 [+0.0, +0.0] points, 95% CI not above 0"),
])
def test_without_no_rl_each_run_is_checked_against_its_own_step_0_evaluation(initial, verdict, said):
    # no no_rl arm, but every run kept its step-0 evaluation per problem (initial_accuracy): a ends at 0.40 from 0.20 (+20: it learns)
    # or from 0.40 (+0: it does not), paired by seed; b = a, so the interval alone says equivalent
    rs = [CsvRun(variant=v, task="addition", seed=s, status="done", values={},
                 problems={"final_accuracy": flat(0.4), "initial_accuracy": flat(initial)}) for v in ("a", "b") for s in range(3)]
    (e,) = evaluate_claims(rs, (CLAIM,), tasks=["addition"], n_boot=300)
    assert e["verdict"] == verdict and e["assay_mark"] == "" and said in e["why"]
    assert e["assay"]["control"] == "its step-0 evaluation" and e["assay"]["diff"]["seeds"] == (3, 3)


def test_a_training_metric_the_control_never_logs_is_marked_when_final_accuracy_is_not_recorded_either():
    track = Claim(**{**CLAIM.to_dict(), "metric": "track:actor/entropy", "margin": 0.5, "min_effect": 1.0})
    rs = [CsvRun(variant=v, task="addition", seed=s, status="done", values={"last actor/entropy": "2.0" if v != "no_rl" else "nan"})
          for v in ("a", "b", "no_rl") for s in range(3)]
    (e,) = evaluate_claims(rs, (track,), tasks=["addition"], control="no_rl", n_boot=300)
    assert e["verdict"].startswith("equivalent within ±0.5") and e["assay_mark"] == ASSAY_UNCHECKED
    assert ("assay sensitivity not checked: no_rl does not train, so it logs no track:actor/entropy; nor on final held-out accuracy: "
            "a against no_rl: final_accuracy not recorded") in e["why"]


TRACK = Claim(**{**CLAIM.to_dict(), "metric": "track:actor/entropy", "margin": 0.5, "min_effect": 1.0})
PASS8 = Claim(**{**CLAIM.to_dict(), "metric": "pass@8"})


def tracked(per_start: dict, seeds: int = 3) -> list[CsvRun]:
    """``per_start``: start -> {arm: per-problem final accuracies}; every trained arm logs entropy 2.0 and pass@8 0.5 on every seed
    (effect 0, interval [0, 0]), no_rl logs neither (it does not train; its pass@k not recorded)."""
    out = runs(per_start, seeds)
    for r in out:
        r.values.update({"last actor/entropy": "2.0", "pass@8": "0.5"} if r.variant != "no_rl" else {})
    return out


@pytest.mark.parametrize("claim", [TRACK, PASS8], ids=["track", "pass@k"])
def test_a_metric_the_control_lacks_is_checked_on_final_accuracy(claim):
    # a = b on the claim's metric (effect 0, [0, 0]): equivalent by the interval. no_rl has no value of it, so the reference a is
    # checked on final held-out accuracy: 0.40 − 0.20 = +20 points [+20, +20], above 0 — the equivalence stands, unmarked
    (e,) = evaluate_claims(tracked({None: {"a": flat(0.4), "b": flat(0.4), "no_rl": flat(0.2)}}), (claim,), tasks=["addition"],
                           control="no_rl", n_boot=300)
    assert e["verdict"].startswith("equivalent within ±") and e["assay_mark"] == ""
    assert e["assay"]["metric"] == "final_accuracy" and e["assay"]["diff"]["effect"] == pytest.approx(0.2)
    assert ("; assay sensitivity checked on final accuracy (the metric itself has no control value): a − no_rl on final_accuracy: "
            "+20.0 [+20.0, +20.0] points, 95% CI above 0") in e["why"]
    # the same with no_rl level with a on final accuracy (0.40: +0 [+0, +0]): not separable, saying why it was checked there
    (e,) = evaluate_claims(tracked({None: {"a": flat(0.4), "b": flat(0.4), "no_rl": flat(0.4)}}), (claim,), tasks=["addition"],
                           control="no_rl", n_boot=300)
    assert e["verdict"] == NOT_SEPARABLE and e["assay_mark"] == ""
    assert ("without assay sensitivity: a − no_rl on final_accuracy: +0.0 [+0.0, +0.0] points, 95% CI not above 0 (checked on final "
            "held-out accuracy, as the claim's metric has no control value: ") in e["why"]
    # a claim against the control itself is not checked on final accuracy instead: kept, marked
    rs = tracked({None: {"a": flat(0.4), "b": flat(0.4), "no_rl": flat(0.2)}})
    for against_control in (Claim(**{**claim.to_dict(), "arm": "no_rl"}), Claim(**{**claim.to_dict(), "against": "no_rl"})):
        check = assay(rs, against_control, "addition", "no_rl", n_boot=300)
        assert check["learns"] is None and check["metric"] == claim.metric and "no_rl itself" in check["why"]


def test_without_no_rl_a_training_metric_is_checked_on_final_accuracy_against_step_0():
    # no no_rl: a's final accuracy 0.40 against its own step-0 evaluation 0.20 (+20, paired by seed): the equivalence stands
    rs = [CsvRun(variant=v, task="addition", seed=s, status="done", values={"last actor/entropy": "2.0"},
                 problems={"final_accuracy": flat(0.4), "initial_accuracy": flat(0.2)}) for v in ("a", "b") for s in range(3)]
    (e,) = evaluate_claims(rs, (TRACK,), tasks=["addition"], n_boot=300)
    assert e["verdict"] == "equivalent within ±0.5 (actor/entropy)" and e["assay_mark"] == ""
    assert ("assay sensitivity checked on final accuracy (the metric itself has no control value): a − its step-0 evaluation on "
            "final_accuracy: +20.0 [+20.0, +20.0] points, 95% CI above 0") in e["why"]


def test_require_assay_leaves_other_verdicts_alone():
    failing = {"learns": False, "why": "a − no_rl on final_accuracy: +0.0 [+0.0, +0.0] points, 95% CI not above 0"}
    assert require_assay(REPRODUCED, "w", [("", failing)]) == (REPRODUCED, "w", "")
    assert require_assay(NOT_SEPARABLE, "w", [("", failing)]) == (NOT_SEPARABLE, "w", "")
    v, why, mark = require_assay(EQUIV, "w", [("from start 0", {"learns": True, "why": "x"}), ("from start 2", failing)])
    assert (v, mark) == (NOT_SEPARABLE, "") and why.startswith("w, but without assay sensitivity: a − no_rl") and "from start 2" in why


# --------------------------------------------------------------------------- several starts


def test_over_starts_every_start_that_enters_needs_assay_sensitivity():
    # b = a from every start (effect 0, every interval [0, 0]); no_rl below a from starts 0 and 1 (0.20: +20 points), level with it
    # from start 2 (0.40: +0). Per start: equivalent, equivalent, not separable; over the three the interval is [0, 0] too, but start 2
    # enters it without assay sensitivity, so not separable, naming start 2 and its gain
    per = {s: {"a": flat(0.4), "b": flat(0.4), "no_rl": flat(0.2 if s < 2 else 0.4)} for s in (0, 1, 2)}
    (e,) = evaluate_claims(runs(per), (CLAIM,), tasks=["addition"], control="no_rl", n_boot=300)
    assert [p["verdict"] for p in e["per_start"]] == [EQUIV, EQUIV, NOT_SEPARABLE] and e["differs"]
    assert e["diff"]["ci90"] == pytest.approx((0.0, 0.0)) and e["verdict"] == NOT_SEPARABLE
    assert ("without assay sensitivity: a − no_rl on final_accuracy: +0.0 [+0.0, +0.0] points, 95% CI not above 0 from start 2 (22222222)"
            in e["why"]) and "start 0" not in e["why"]
    text = "\n".join(markdown_lines([e], eval_size=4))
    assert "- b_matches_a (addition), start 2 (22222222): not separable at this budget: 90% CI inside ±2 points" in text


def test_over_starts_equivalence_that_every_start_supports():
    per = {s: {"a": flat(0.4), "b": flat(0.4), "no_rl": flat(0.2 + 0.05 * s)} for s in (0, 1, 2)}
    (e,) = evaluate_claims(runs(per), (CLAIM,), tasks=["addition"], control="no_rl", n_boot=300)
    assert e["verdict"] == EQUIV and not e["differs"]
    assert ("assay sensitivity from every start that enters it: a − no_rl on final_accuracy +20.0 [+20.0, +20.0] points from start 0 "
            "(00000000), +15.0 [+15.0, +15.0] points from start 1 (11111111), +10.0 [+10.0, +10.0] points from start 2 (22222222)") in e["why"]


def test_over_starts_a_training_metric_needs_the_reference_to_learn_on_final_accuracy_from_every_start():
    # entropy alike in a and b from every start (effect 0, intervals [0, 0]); no_rl logs no entropy. On final accuracy a − no_rl is
    # +20 from starts 0 and 1 (0.40 − 0.20) and +0 from start 2 (0.40 − 0.40): start 2's equivalence is vacuous, and so is the one
    # over starts it enters, naming start 2, its gain, and that the check was made on final accuracy
    per = {s: {"a": flat(0.4), "b": flat(0.4), "no_rl": flat(0.2 if s < 2 else 0.4)} for s in (0, 1, 2)}
    (e,) = evaluate_claims(tracked(per), (TRACK,), tasks=["addition"], control="no_rl", n_boot=300)
    ok = "equivalent within ±0.5 (actor/entropy)"
    assert [(p["verdict"], p["assay_mark"]) for p in e["per_start"]] == [(ok, ""), (ok, ""), (NOT_SEPARABLE, "")]
    assert e["diff"]["ci90"] == pytest.approx((0.0, 0.0)) and (e["verdict"], e["assay_mark"]) == (NOT_SEPARABLE, "")
    assert ("but without assay sensitivity: a − no_rl on final_accuracy: +0.0 [+0.0, +0.0] points, 95% CI not above 0 from start 2 "
            "(22222222) (checked on final held-out accuracy, as the claim's metric has no control value: no_rl does not train, so it "
            "logs no track:actor/entropy)") in e["why"] and "start 0" not in e["why"]
    # no_rl at 0.20, 0.25, 0.30: a learns from every start (+20, +15, +10): the equivalence over starts stands, unmarked
    per = {s: {"a": flat(0.4), "b": flat(0.4), "no_rl": flat(0.2 + 0.05 * s)} for s in (0, 1, 2)}
    (e,) = evaluate_claims(tracked(per), (TRACK,), tasks=["addition"], control="no_rl", n_boot=300)
    assert (e["verdict"], e["assay_mark"]) == (ok, "")
    assert ("assay sensitivity checked on final accuracy (the metric itself has no control value) from every start that enters it: "
            "a − no_rl on final_accuracy +20.0 [+20.0, +20.0] points from start 0 (00000000), +15.0 [+15.0, +15.0] points from start 1 "
            "(11111111), +10.0 [+10.0, +10.0] points from start 2 (22222222)") in e["why"]
    text = "\n".join(markdown_lines([e], eval_size=4))
    assert "| **equivalent within ±0.5 (actor/entropy)** |" in text and ASSAY_UNCHECKED not in text.split("| verdict |")[1]


def test_a_start_that_does_not_learn_is_flagged():
    # a at 0.40 everywhere; b at 0.30 from starts 0 and 1 and 0.45 from start 2; no_rl 0.20, 0.20, 0.40. Start 0: a +20, b +10, both
    # above 0, a separates most; start 2: a +0, b +5 [+5, +5] — b learns from start 2 too. With b at 0.40 from start 2 nothing does
    per = {s: {"a": flat(0.4), "b": flat(0.3 if s < 2 else 0.45), "no_rl": flat(0.2 if s < 2 else 0.4)} for s in (0, 1, 2)}
    learning = learning_by_start(runs(per), ["a", "b"], "no_rl", tasks=["addition"], n_boot=300)
    assert [(g["arm"], g["learns"]) for g in learning] == [("a", True), ("a", True), ("b", True)]
    assert learning[2]["diff"]["effect"] == pytest.approx(0.05)
    per[2]["b"] = flat(0.4)
    learning = learning_by_start(runs(per), ["a", "b"], "no_rl", tasks=["addition"], n_boot=300)
    assert [g["learns"] for g in learning] == [True, True, False]
    lines = learning_lines(learning)
    assert lines[2] == ("- **start 2 (22222222) is not shown to learn**: no arm ends above no_rl (closest: a − no_rl on final_accuracy: "
                        "+0.0 [+0.0, +0.0] points, 95% CI not above 0); no equivalence holds from it (assay sensitivity).")
    assert lines[0] == "- start 0 (00000000) learns: a − no_rl on final_accuracy: +20.0 [+20.0, +20.0] points, 95% CI above 0."
    assert _learning_note("s", learning, False) == ("; **not shown to learn**: start 2 (a − no_rl, final accuracy +0.0 [+0.0, +0.0] points), "
                                                    "so no equivalence holds from it")
    table = "\n".join(starts_lines({"starts": [{"start": 2, "sha256": "2" * 64, "rows": []}], "learning": learning}))
    assert "**start 2 (22222222) is not shown to learn**" in table and "a start learns when some arm's 95% CI lies above 0" in table
    unchecked = learning_by_start(runs(per), ["a", "b"], None, tasks=["addition"], n_boot=300)
    no_control = "the suite has no no-learning control (no_rl) and its runs kept no step-0 evaluation per problem (initial_accuracy)"
    assert learning_lines(unchecked) == [f"- Whether each start learns is not checked: {no_control}.", ""]
    assert _learning_note("s", unchecked, True) == f"; whether each start learns is not checked in `s`: {no_control}"


# --------------------------------------------------------------------------- pooled over suites


def _folded(suite, variant, seed, vals, start="ab" * 32):
    """A run as a pool folds it; its job: (base, steps, control, overrides), the variant's own override telling the jobs apart."""
    run = CsvRun(variant=variant, task="addition", seed=seed, status="done", values={}, problems={"final_accuracy": vals})
    job = (("preset", "grpo"), 0 if variant == "no_rl" else 10, "no_rl" if variant == "no_rl" else None, (("arm", repr(variant)),))
    return pooled.Folded(suite=suite, variant=variant, task="addition", seed=seed, job=job, start_sha256=start,
                         identity=f"{suite}/{variant}/{seed}", run=run)


def test_pooled_equivalence_needs_each_comparisons_reference_to_learn():
    # two suites compare tis with sync (0.40 each, 3 seeds); s1's no_rl scores 0.20 (sync learns: +20), s2's 0.40 (+0).
    # Each comparison: effect 0, [0, 0]; s1's is equivalent, s2's is not separable, and so is the pool, naming s2's comparison
    claim = Claim(name="tis_equal", statement="TIS ends where sync does", arm="tis", against="sync", metric="final_accuracy",
                  direction="equal", min_effect=0.03, margin=0.02)
    folded, controls = [], []
    for suite, ctrl, start in (("s1", 0.2, "ab" * 32), ("s2", 0.4, "cd" * 32)):
        for seed in range(3):
            folded += [_folded(suite, "tis", seed, flat(0.4), start), _folded(suite, "sync", seed, flat(0.4), start)]
            controls.append(_folded(suite, "no_rl", seed, flat(ctrl), start))
    e = pooled.decide_pool(folded, claim, n_boot=300, controls=controls)
    assert [g["verdict"] for g in e["strata"]] == [EQUIV, NOT_SEPARABLE]
    assert e["strata"][1]["assay"]["why"] == "sync − no_rl on final_accuracy: +0.0 [+0.0, +0.0] points, 95% CI not above 0"
    assert e["verdict"] == NOT_SEPARABLE and "without assay sensitivity" in e["why"] and "start cdcdcdcd" in e["why"]
    unmarked = pooled.decide_pool(folded, claim, n_boot=300)  # no control runs at all: kept, marked
    assert unmarked["verdict"] == EQUIV and unmarked["assay_mark"] == ASSAY_UNCHECKED
    assert "no suite that ran its sync runs (s1) has a no-learning control (no_rl)" in unmarked["strata"][0]["why"]
    # no no_rl runs, but the sync runs kept their step-0 evaluation: 0.20 in s1 (+20, learns), 0.40 in s2 (+0): as with no_rl
    for f in folded:
        f.run.problems["initial_accuracy"] = flat(0.2 if f.suite == "s1" else 0.4)
    step0 = pooled.decide_pool(folded, claim, n_boot=300)
    assert [g["verdict"] for g in step0["strata"]] == [EQUIV, NOT_SEPARABLE] and step0["verdict"] == NOT_SEPARABLE
    assert step0["strata"][0]["assay"]["why"] == "sync − its step-0 evaluation on final_accuracy: +20.0 [+20.0, +20.0] points, 95% CI above 0"


def test_pooled_equivalence_on_a_training_metric_checks_each_comparisons_reference_on_final_accuracy():
    # tis and sync log entropy 2.0 on every seed in both suites (effect 0, [0, 0]); no_rl logs none. On final accuracy sync ends at
    # 0.40: +20 over s1's no_rl (0.20), +0 over s2's (0.40): s2's comparison and the pool are not separable, saying the check was made
    # on final accuracy; with s2's no_rl at 0.20 too, the pool is equivalent, unmarked
    claim = Claim(name="tis_entropy", statement="TIS keeps sync's entropy", arm="tis", against="sync", metric="track:actor/entropy",
                  direction="equal", min_effect=1.0, margin=0.5)

    def pool(s2_control):
        folded, controls = [], []
        for suite, ctrl, start in (("s1", 0.2, "ab" * 32), ("s2", s2_control, "cd" * 32)):
            for seed in range(3):
                for v in ("tis", "sync"):
                    f = _folded(suite, v, seed, flat(0.4), start)
                    f.run.values["last actor/entropy"] = "2.0"
                    folded.append(f)
                controls.append(_folded(suite, "no_rl", seed, flat(ctrl), start))
        return pooled.decide_pool(folded, claim, n_boot=300, controls=controls)

    ok = "equivalent within ±0.5 (actor/entropy)"
    e = pool(0.4)
    assert [g["verdict"] for g in e["strata"]] == [ok, NOT_SEPARABLE] and (e["verdict"], e["assay_mark"]) == (NOT_SEPARABLE, "")
    assert e["strata"][0]["assay"]["why"] == "sync − no_rl on final_accuracy: +20.0 [+20.0, +20.0] points, 95% CI above 0"
    assert ("sync − no_rl on final_accuracy: +0.0 [+0.0, +0.0] points, 95% CI not above 0 in *" in e["why"] and "start cdcdcdcd" in e["why"]
            and "(checked on final held-out accuracy, as the claim's metric has no control value: no_rl does not train, so it logs no "
            "track:actor/entropy)" in e["why"])
    e = pool(0.2)
    assert (e["verdict"], e["assay_mark"]) == (ok, "")
    assert "assay sensitivity checked on final accuracy (the metric itself has no control value) from every start that enters it: sync − no_rl on final_accuracy +20.0 [+20.0, +20.0] points in *" in e["why"]
