"""The terminal reporter: a live progress bar, the final summary line and ``curves.png``.

It is an ordinary plugin on the run's event hooks (as pytest's terminal reporter is): when the
run asks for progress it prints a header line (the run directory, the task or environment, and
what counts as solved for the accuracy it reports), draws a
rich progress bar from ``on_run_start`` to ``on_run_end``, shows
the latest eval accuracy from ``on_eval_end``, always prints one summary line at the end (also
under ``rllab run -q``), and plots training reward and eval accuracy into ``RUN_DIR/curves.png``.
Another front end (a TUI, a notebook widget) listens to the same hooks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping

import rllab

_RUNS: dict[Path, "_Reporter"] = {}


class _Reporter:
    def __init__(self, run_dir: Path, config, start: int, total: int, progress: bool, solved_when: str | None = None):
        from rich.console import Console

        # piped output (files, CI logs) keeps whole lines instead of folding paths at 80 columns
        self.console = Console(width=None if sys.stdout.isatty() else 1000, soft_wrap=not sys.stdout.isatty())
        self.algorithm = config.component("algorithm").name
        self.parts = {s: config.component(s).name for s in _NAMED}
        self.timeline = timeline(self.parts, config.schedule, total)
        self.last_eval: float | None = None
        self.last_metrics: dict = {}
        self.step_seconds: list[float] = []
        """``time/step`` of every step this process ran: the bar shows their mean."""
        self.progress = None
        if progress:
            print_header(self.console, run_dir, config, solved_when)
            self.progress = training_bar(self.console, total)
            self.progress.start()
            self.task = self.progress.add_task("", total=total, completed=start)

    def step(self, metrics: dict) -> None:
        self.last_metrics = metrics
        if "time/step" in metrics:
            self.step_seconds.append(float(metrics["time/step"]))
        if self.progress is not None:
            self.progress.update(self.task, advance=1, description=self.describe())

    def eval(self, metrics: dict) -> None:
        """An evaluation's accuracy, shown at once (the final one is what the bar ends on)."""
        self.last_eval = metrics.get("eval/accuracy", self.last_eval)
        if self.progress is not None and self.last_metrics:
            self.progress.update(self.task, description=self.describe())

    def describe(self) -> str:
        mean = sum(self.step_seconds) / len(self.step_seconds) if self.step_seconds else None
        return describe(self.last_metrics, self.last_eval, mean_step=mean)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def training_bar(console, total: int):
    """The training bar: ``train ━━━ 12/400 0:00:05 0:02:31 eval 31.0%  0.38s/step (mean)  reward 0.42 …``.
    On a narrow terminal the metrics are cut (ending in …) before the counts and times lose width."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.table import Column

    widths = (5, 16, 2 * len(str(total)) + 1, 7, 7)  # train, the bar, 12/400, elapsed, remaining
    room = console.width - sum(widths) - len(widths)  # one space between columns
    return Progress(
        TextColumn("[bold]train"),
        BarColumn(bar_width=widths[1]),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis", max_width=max(10, room))),
        console=console,
    )


def print_header(console, run_dir: Path, config, solved_when: str | None) -> None:
    """The run's first line: its directory, its task (or environment) and what accuracy counts."""
    from rich.markup import escape

    from rllab.config import COMPONENT_SECTIONS

    source = f"{COMPONENT_SECTIONS[config.source][0]} {config.component(config.source).name!r}"  # the section's kind
    solved = f"; accuracy counts an answer solved when {solved_when}" if solved_when else ""
    console.print(f"[bold]run[/] [cyan]{escape(str(run_dir))}[/]: {escape(source)}{escape(solved)}", highlight=False, soft_wrap=True)


_NAMED = ("advantage", "policy_loss", "preference_loss")
"""The component sections the summary line names."""


def timeline(parts: dict, schedule, total: int) -> list[tuple[int, dict]]:
    """``[(first step, {section: component name})]``: the named components of a run as its
    ``[[schedule]]`` entries switch them (an entry at step 0 replaces the starting ones; entries
    at or after ``total`` never apply). Consecutive equal segments are merged."""
    out = [(0, dict(parts))]
    for entry in sorted(schedule, key=lambda e: e.step):
        if entry.step >= total:
            break
        now = dict(out[-1][1])
        for key, value in entry.set.items():
            sec = key[: -len(".name")] if key.endswith(".name") else key
            if sec in now:
                name = value.get("name") if isinstance(value, Mapping) else value
                if isinstance(name, str):
                    now[sec] = name
        if now == out[-1][1]:
            continue
        if entry.step == out[-1][0]:
            out[-1] = (entry.step, now)
        else:
            out.append((entry.step, now))
    return out


def components_used(algorithm: str, line: list[tuple[int, dict]]) -> str:
    """The summary's ``(…)``: the algorithm and the components it ran with, each switch named
    with its step (``rl: grpo + ppo_clip → rloo + ppo_clip from step 10``)."""

    def one(parts: dict) -> str:
        if algorithm in ("dpo", "online_dpo"):
            return parts["preference_loss"]
        return f"{parts['advantage']} + {parts['policy_loss']}"

    if algorithm not in ("rl", "dpo", "online_dpo"):
        return algorithm
    text = one(line[0][1]) + "".join(f" → {one(parts)} from step {step}" for step, parts in line[1:])
    return f"{algorithm}: {text}"


def describe(m: dict, last_eval: float | None = None, mean_step: float | None = None) -> str:
    """The progress bar's text: latest eval accuracy, the step's key metrics and the seconds per
    step (``mean_step``: the mean over the run's steps so far, labelled so; else the last step's)."""
    parts = []
    if last_eval is not None:
        parts.append(f"eval {last_eval:.1%}")
    if mean_step is not None:  # before the metrics: a narrow terminal cuts those first
        parts.append(f"{mean_step:.2f}s/step (mean)")
    elif "time/step" in m:
        parts.append(f"{m['time/step']:.2f}s/step (last)")
    for key, label in (("rollout/reward", "reward"), ("actor/entropy", "entropy"), ("loss/preference", "loss"), ("dpo/accuracy", "pref-acc")):
        if key in m:
            parts.append(f"{label} {m[key]:.3f}")
    for key, label in (("actor/approx_kl", "kl"), ("actor/clipfrac", "clip")):
        if m.get(key):  # always 0 on a fully on-policy step: shown only when informative
            parts.append(f"{label} {m[key]:.3f}")
    if m.get("train/nonfinite"):
        parts.append("[red]non-finite update skipped[/]")
    return "  ".join(parts)


def plot_run(run_dir: Path, history: list[dict], title: str | None = None) -> Path | None:
    """A PNG of training reward and eval accuracy against step; None when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(h["step"], h["rollout/reward"]) for h in history if "rollout/reward" in h]
    ev = [(h["step"], h["eval/accuracy"]) for h in history if "eval/accuracy" in h]
    if not train and not ev:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot([s for s, _ in train], [r for _, r in train], label="train reward", alpha=0.7)
    if ev:
        ax.plot([s for s, _ in ev], [a for _, a in ev], "o-", label="eval accuracy (greedy)")
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title or run_dir.name, fontsize=10)
    out = run_dir / "curves.png"
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


@rllab.hookimpl
def on_run_start(run_dir, config, start_step, total_steps, progress, solved_when):
    _RUNS[Path(run_dir)] = _Reporter(Path(run_dir), config, start_step, total_steps, progress, solved_when)


@rllab.hookimpl
def on_run_error(run_dir, step, error):
    r = _RUNS.pop(Path(run_dir), None)
    if r is not None:
        r.close()


@rllab.hookimpl
def on_step_end(step, metrics, run_dir):
    r = _RUNS.get(Path(run_dir))
    if r is not None:
        r.step(metrics)


@rllab.hookimpl
def on_eval_end(step, metrics, run_dir):
    r = _RUNS.get(Path(run_dir))
    if r is not None:
        r.eval(metrics)


@rllab.hookimpl
def on_run_end(run_dir, metrics, history):
    run_dir = Path(run_dir)
    r = _RUNS.pop(run_dir, None)
    if r is None:
        return
    r.close()
    from rich.markup import escape

    what = components_used(r.algorithm, r.timeline)
    plot_run(run_dir, history, title=f"{what} — {run_dir.name}")
    r.console.print(
        f"[bold]done[/]: eval accuracy {metrics['initial/accuracy']:.1%} → {metrics['final/accuracy']:.1%} "
        f"in {metrics['steps']} steps ({what}); run directory [cyan]{run_dir}[/]",
        highlight=False,
        soft_wrap=True,
    )
    r.console.print(escape(next_steps(run_dir)), highlight=False, soft_wrap=True)


def next_steps(run_dir: Path) -> str:
    """The done line's follow-up: what of the run to open next (those it has)."""
    items = []
    if (run_dir / "curves.png").is_file():
        items.append(f"the curves {run_dir / 'curves.png'}")
    try:
        from rllab_loggers import traces_path

        traced = traces_path(run_dir).is_file()  # the file the run's traces logger names
    except Exception:  # noqa: BLE001  (no traces, or no loggers plugin: nothing to point at)
        traced = False
    if traced:
        items.append(f"the samples: rllab traces {run_dir}")
    items.append(f"score the model: rllab eval {run_dir}")
    if (run_dir / "model").is_dir():
        items.append(f"the model (Hugging Face): {run_dir / 'model'}")
    return "next: " + "; ".join(items)
