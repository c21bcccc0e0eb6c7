"""Each arm against the suite's control arms (``controls = ["random_reward", "no_rl"]``).

A finding is an arm that beats its controls: the same recipe trained on a reward blind to the
answers (``random_reward``: what training alone, with no information about correctness, does) and
the warm start without any training (``no_rl``). Per arm and control the report gives the
probability of improvement P(arm > control) of the final held-out accuracy (Mann–Whitney, averaged
over tasks, stratified bootstrap CI: :func:`rllab_suite.stats.prob_improvement`) and a verdict:

- ``beats`` — the CI lies above ½;
- ``below`` — the CI lies below ½;
- ``not told apart`` — the CI holds ½ (at this budget and seed count);
- ``—`` — fewer than :data:`rllab_suite.stats.MIN_POI_SEEDS` seeds on a side.
"""

from __future__ import annotations

from rllab_suite import stats


def verdict(poi: tuple | None) -> str:
    """The verdict of a P(improvement) ``(mean, low, high)``; see the module docstring."""
    if poi is None:
        return "—"
    _, lo, hi = poi
    if lo > 0.5:
        return "beats"
    if hi < 0.5:
        return "below"
    return "not told apart"


def against_controls(records, *, variants: list, tasks: list, controls: tuple) -> list[dict]:
    """One entry per (arm, control), every arm (controls too) against every other control."""
    def finals(v, t):
        return [r.final("accuracy") for r in records if r.variant == v and r.task == t and r.status == "done"]

    out = []
    for v in variants:
        for c in controls:
            if c == v:
                continue
            poi = stats.prob_improvement([(finals(v, t), finals(c, t)) for t in tasks])
            out.append({"variant": v, "control": c, "verdict": verdict(poi),
                        "p_improvement": None if poi is None else dict(zip(("mean", "low", "high"), poi))})
    return out


def markdown_lines(entries: list[dict], controls: tuple) -> list[str]:
    """The "against the controls" table: per arm, P(arm > control) [95% CI] and the verdict per control."""
    if not entries:
        return []
    arms = list(dict.fromkeys(e["variant"] for e in entries))
    head = ["arm"] + [f"P(> {c}) [95% CI]" for c in controls]
    lines = [
        "## against the controls (final accuracy)", "",
        "P(arm > control): the Mann–Whitney probability that a run of the arm ends above a run of the control, "
        "averaged over tasks, with a stratified 95% bootstrap CI; *beats* when the CI lies above 0.5.", "",
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
    ]
    for a in arms:
        cells = []
        for c in controls:
            e = next((e for e in entries if e["variant"] == a and e["control"] == c), None)
            if e is None:
                cells.append("(itself)")
            elif e["p_improvement"] is None:
                cells.append(f"— (needs {stats.MIN_POI_SEEDS} seeds per side)")
            else:
                p = e["p_improvement"]
                cells.append(f"{p['mean']:.2f} [{p['low']:.2f}, {p['high']:.2f}] {e['verdict']}")
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return lines + [""]
