"""A suite's or comparison's plots (matplotlib, imported when called): ``curves.png`` (held-out
accuracy against step), ``final.png`` (final accuracy per variant, seeds as dots) and
``track.png`` (the tracked training metrics), from the records and summary of
:mod:`rllab_suite.records` and :mod:`rllab_suite.report`.
"""

from __future__ import annotations

import math
from pathlib import Path
from rllab_suite import stats
from rllab_suite.records import RunRecord


def plot(records: list[RunRecord], summary: dict, out_dir: Path, title: str = "") -> list[Path]:
    """``curves.png`` (held-out accuracy per variant with a 95% CI band, one panel per task) and
    ``final.png`` (final accuracy per variant with its CI and the seeds as dots)."""
    import numpy as np

    out = []
    fig, panels, variants, colors = _task_panels(summary)
    for ax, task in panels:
        for i, v in enumerate(variants):
            rs = [r for r in records if r.task == task and r.variant == v and r.status == "done"]
            if not rs:
                continue
            steps = sorted(set.intersection(*(set(r.steps) for r in rs)))
            if not steps:
                continue
            mat = np.array([[r.accuracy[r.steps.index(s)] for s in steps] for r in rs])
            cis = [stats.mean_ci(mat[:, j]) for j in range(len(steps))]
            mean = np.array([c[0] for c in cis])
            c = colors[i % len(colors)]
            ax.plot(steps, mean, "-o", ms=3, color=c, label=f"{v} (n={len(rs)})")
            lo, hi = np.array([c_[1] for c_ in cis]), np.array([c_[2] for c_ in cis])
            if np.isfinite(lo).all():
                ax.fill_between(steps, lo, hi, color=c, alpha=0.2)
        ax.set_title(f"{title} — {task}" if title else task, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    out.append(_save(fig, out_dir / "curves.png"))
    fig, panels, _, _ = _task_panels(summary, width=max(4, 1.2 * len(variants) + 2))
    for ax, task in panels:
        for i, v in enumerate(variants):
            row = next((r for r in summary["rows"] if r["task"] == task and r["variant"] == v), None)
            if row is None or not row["runs"]:
                continue
            d = row["final_accuracy"]
            err = None
            if math.isfinite(d["low"]):
                err = [[d["mean"] - d["low"]], [d["high"] - d["mean"]]]
            ax.bar(i, d["mean"], yerr=err, color=colors[i % len(colors)], alpha=0.6, capsize=4)
            pts = [r.final("accuracy") for r in records if r.task == task and r.variant == v and r.status == "done"]
            ax.plot([i] * len(pts), pts, "k.", ms=6)
        ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("final held-out accuracy")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{task}: mean, 95% CI, seeds", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    out.append(_save(fig, out_dir / "final.png"))
    track = [m for m in summary.get("track", []) if m not in summary.get("track_missing", [])]
    if track:
        out.append(plot_track(records, summary["tasks"], variants, track, out_dir, title))
    return out


def plot_track(records: list[RunRecord], tasks: list, variants: list, track: list, out_dir: Path, title: str = "") -> Path:
    """``track.png``: each tracked training metric against step (one row per task, one column
    per metric), per variant the mean over seeds of a moving average, and the seeds' range as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(len(tasks), len(track), figsize=(5.5 * len(track), 4 * len(tasks)), squeeze=False)
    for row, task in zip(axes, tasks):
        for ax, m in zip(row, track):
            for i, v in enumerate(variants):
                rs = [r for r in records if r.task == task and r.variant == v and r.status == "done" and m in r.train]
                if not rs:
                    continue
                steps = sorted(set.intersection(*(set(r.train[m][0]) for r in rs)))
                if not steps:
                    continue
                mat = np.array([[dict(zip(*r.train[m]))[s] for s in steps] for r in rs])
                k = max(1, len(steps) // 20)
                smooth = np.array([np.convolve(x, np.ones(k) / k, mode="valid") for x in mat])
                xs = steps[k - 1:]
                c = colors[i % len(colors)]
                ax.plot(xs, smooth.mean(0), color=c, label=f"{v} (n={len(rs)})")
                ax.fill_between(xs, smooth.min(0), smooth.max(0), color=c, alpha=0.15)
            ax.set_title(f"{title} — {task}: {m}" if title else f"{task}: {m}", fontsize=10)
            ax.set_xlabel("step (moving average over 5% of the steps)")
            ax.set_ylabel(m)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    return _save(fig, out_dir / "track.png")


def plot_fits(records: list[RunRecord], summary: dict, out_dir: Path, title: str = "") -> Path:
    """``fits.png``: per task, each arm's held-out accuracy against training compute (the mean over
    seeds at each eval step, the seeds as dots) and its fitted saturating curve (dashed where the
    fit is not a result); an arm that did not train (``no_rl``) as a horizontal line."""
    import numpy as np

    from rllab_suite.fits import saturating

    fits = summary["fits"]
    fig, panels, variants, colors = _task_panels(summary, width=6, height=4.2)
    for ax, task in panels:
        arms = fits["tasks"].get(task, {}).get("arms", {})
        top = max((c for r in records if r.task == task and r.status == "done" for c in r.compute(fits["kind"]) if np.isfinite(c)), default=1.0)
        for i, v in enumerate(variants):
            d, c = arms.get(v), colors[i % len(colors)]
            rs = [r for r in records if r.task == task and r.variant == v and r.status == "done"]
            if d is None or not rs:
                continue
            if "A" not in d:
                if np.isfinite(d.get("R0", np.nan)):
                    ax.axhline(d["R0"], color=c, ls=":", label=f"{v}: {d['status']}")
                continue
            pts = [(x, y) for r in rs for s, x, y in zip(r.steps, r.compute(fits["kind"]), r.accuracy) if s > 0]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ".", color=c, alpha=0.35, ms=4)
            steps = sorted(set.intersection(*(set(r.steps) for r in rs)) - {0})
            if steps:
                mx = [np.mean([r.compute(fits["kind"])[r.steps.index(s)] for r in rs]) for s in steps]
                my = [np.mean([r.accuracy[r.steps.index(s)] for r in rs]) for s in steps]
                ax.plot(mx, my, "o", color=c, ms=5)
            if np.isfinite(d.get("A", np.nan)):
                xs = np.geomspace(top / 200, top * 3, 200)
                ax.plot(xs, saturating(xs, d["A"], d["B"], d["C_mid"], d["R0"]), "-" if d["status"] == "ok" else "--", color=c,
                        label=f"{v}: A={100 * d['A']:.1f}%" + ("" if d["status"] == "ok" else " (not a result)"))
            else:
                ax.plot([], [], "o", color=c, label=f"{v}: fit {d['status'][:40]}")
        ax.set_xscale("log")
        ax.set_xlabel(f"training compute ({fits['kind']})")
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.set_title(f"{title} — {task}: fitted to compute" if title else f"{task}: fitted to compute", fontsize=10)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[1]:  # no arm fitted (or with a floor) on this task: no legend to draw
            ax.legend(fontsize=7)
    return _save(fig, out_dir / "fits.png")


def plot_pass_at(summary: dict, out_dir: Path, title: str = "") -> Path:
    """``pass_at_k.png``: per task, pass@k against k (log scale) per arm, before RL (dashed) and after (solid,
    with its 95% CI over seeds as a band)."""
    fig, panels, variants, colors = _task_panels(summary)
    for ax, task in panels:
        for i, v in enumerate(variants):
            row = next((r for r in summary["rows"] if r["task"] == task and r["variant"] == v), None)
            for when, ls in (("before", "--"), ("after", "-")):
                curve = (row or {}).get("pass_at", {}).get(when)
                if curve and (when == "after" or i == 0):  # one "before" line: every arm starts from the same warm start
                    ks = sorted(curve)
                    before = when == "before"
                    ax.plot(ks, [curve[k] for k in ks], ls, marker=".", color="gray" if before else colors[i % len(colors)],
                            lw=3 if before else 1.5, alpha=0.6 if before else 1.0, zorder=3 if before else 2,
                            label="before RL (warm start)" if before else f"{v}, after")
                    band = (row or {}).get("pass_at", {}).get("after_ci", {})
                    if not before and band and all(k in band and all(map(math.isfinite, band[k])) for k in ks):
                        ax.fill_between(ks, [band[k][0] for k in ks], [band[k][1] for k in ks], color=colors[i % len(colors)], alpha=0.15, lw=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k")
        ax.set_ylabel("pass@k (unbiased, held-out)")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{title} — {task}: pass@k" if title else f"{task}: pass@k", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, out_dir / "pass_at_k.png")


def _task_panels(summary: dict, *, width: float = 5.5, height: float = 4):
    """A figure of one panel per task of ``summary`` (matplotlib, headless), each ``width`` by
    ``height`` inches: ``(fig, [(axes, task), ...], variants, colors)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = summary["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(width * len(tasks), height), squeeze=False)
    return fig, list(zip(axes[0], tasks)), summary["variants"], plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _save(fig, path: Path) -> Path:
    import warnings

    import matplotlib.pyplot as plt

    with warnings.catch_warnings():  # long labels: the layout is kept as it is, said in no warning (the file is written all the same)
        warnings.filterwarnings("ignore", message="Tight layout not applied", category=UserWarning)
        fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_entropy_law(records: list[RunRecord], summary: dict, out_dir: Path, title: str = "") -> Path:
    """``entropy_law.png``: per task, each arm's (entropy, training reward) points along training
    (:func:`rllab_suite.entropy_law.binned`, all seeds) and its fitted law R = −a·exp(H) + b."""
    import numpy as np

    from rllab_suite.entropy_law import binned, law

    fitted = summary["entropy_law"]
    fig, panels, variants, colors = _task_panels(summary, width=6, height=4.2)
    for ax, task in panels:
        arms = fitted["tasks"].get(task, {})
        for i, v in enumerate(variants):
            d, c = arms.get(v), colors[i % len(colors)]
            if d is None:
                continue
            pts = [p for r in records if r.task == task and r.variant == v and r.status == "done" for p in zip(*binned(r))]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ".", color=c, alpha=0.4, ms=4)
            if np.isfinite(d.get("a", np.nan)) and pts:
                xs = np.linspace(min(p[0] for p in pts), max(p[0] for p in pts), 100)
                ax.plot(xs, law(xs, d["a"], d["b"]), "-", color=c, label=f"{v}: a={d['a']:.3g}, b={d['b']:.3g}, R²={d['r2']:.2f}")
            else:
                ax.plot([], [], ".", color=c, label=f"{v}: {d['status'][:40]}")
        ax.set_xlabel(f"entropy H ({fitted['entropy']}, mean over {fitted['bin']} steps)")
        ax.set_ylabel(f"training reward R ({fitted['reward']})")
        ax.set_title(f"{title} — {task}: R = −a·exp(H) + b" if title else f"{task}: R = −a·exp(H) + b", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out_dir / "entropy_law.png")
