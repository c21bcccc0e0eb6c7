"""One run's record for a report (:class:`RunRecord`), read from its directory alone
(``config.toml``, ``metrics.jsonl``, ``eval_problems.jsonl``, ``final.json``, ``error.txt``) by :func:`read_run`; the
reports (:mod:`rllab_suite.report`) and plots (:mod:`rllab_suite.plots`) are made from these.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import attrs

from rllab_suite import stats

LAST_FRACTION = 0.1
"""A tracked training metric's "last" value is a run's mean over this share of its last steps (at least one)."""


@attrs.frozen(kw_only=True)
class RunRecord:
    """What a report needs from one run directory."""

    run_dir: str
    variant: str
    task: str
    seed: int
    status: str
    """``done``, ``failed``, ``running`` (no final.json) or ``missing``."""
    steps: list = attrs.field(factory=list)
    """Eval steps, with ``accuracy`` and ``reward`` at each below."""
    accuracy: list = attrs.field(factory=list)
    reward: list = attrs.field(factory=list)
    train_reward_max: float = math.nan
    error: str = ""
    train: dict = attrs.field(factory=dict)
    """Tracked training metrics: name -> (steps, values), one value per training step logged."""
    cost: dict = attrs.field(factory=dict)
    """Training compute per step: ``tokens`` and ``seconds`` -> {step: value} (``rollout/tokens``, ``time/step``)."""
    pass_at: dict = attrs.field(factory=dict)
    """Sampled evaluation (``train.eval_samples``): eval step -> {k: pass@k}, pass@1 being ``eval/mean@n``."""
    eval_n: int | None = None
    """Held-out problems per evaluation (``eval/n``): one problem is worth 1/eval_n of the accuracy."""
    start: int | None = None
    """The warm-start seed of the run's starting model, in a suite with several starts (None: one start)."""
    start_sha256: str | None = None
    """The starting model's hash, from the run's ``provenance.json`` (None where it kept none)."""
    problems: dict = attrs.field(factory=dict)
    """Per held-out problem (``eval_problems.jsonl``; empty for runs that predate it): eval step ->
    {"solved": [0/1 …], "reward": […], and with samples "sampled_correct": [counts], "samples": n}."""

    def metric_value(self, metric: str) -> float:
        """A claim's metric (:data:`rllab_suite.verdicts.METRICS` or ``pass@K``) of this run: its
        final or AUC held-out accuracy or reward, or pass@K at its last evaluation; NaN when absent."""
        if metric.startswith("track:"):
            return self.last(metric[6:])
        if metric.startswith("pass@"):
            k = int(metric[5:])
            return float(self.pass_at.get(self.steps[-1], {}).get(k, math.nan)) if self.steps and self.status == "done" else math.nan
        kind, _, name = metric.partition("_")
        return getattr(self, kind)(name)

    def problem_values(self, metric: str) -> list[float] | None:
        """The metric per held-out problem (its mean over problems is :meth:`metric_value`): final
        greedy solved or reward at the last evaluation, their AUC over the evaluations, or pass@K
        from the last evaluation's sampled counts; None where the run did not record them at every
        evaluation."""
        if self.status != "done" or not self.steps or metric.startswith("track:") or any(s not in self.problems for s in self.steps):
            return None
        last = self.problems[self.steps[-1]]
        if metric.startswith("pass@"):
            from rllab.rollout.evalmetrics import pass_at_k

            k, n = int(metric[5:]), last.get("samples", 0)
            if "sampled_correct" not in last or not 1 <= k <= n:
                return None
            return [pass_at_k(n, c, k) for c in last["sampled_correct"]]
        kind, _, name = metric.partition("_")
        key = "solved" if name == "accuracy" else "reward"
        if kind == "final":
            return [float(v) for v in last[key]]
        if kind == "initial":  # the evaluation before the first step: the starting model, evaluated alike
            return [float(v) for v in self.problems[0][key]] if self.steps[0] == 0 else None
        rows = [self.problems[s][key] for s in self.steps]
        if len({len(r) for r in rows}) != 1:
            return None
        return [stats.auc(self.steps, [row[i] for row in rows]) for i in range(len(rows[0]))]

    def compute(self, kind: str) -> list[float]:
        """The ``kind`` (``tokens``/``seconds``) spent up to each eval step: the sum over the training
        steps up to it (0 at step 0); NaN where a step of it logged none."""
        per = self.cost.get(kind, {})
        out = []
        for s in self.steps:
            vals = [per.get(t, math.nan) for t in range(1, int(s) + 1)]
            out.append(float(sum(vals)))
        return out

    def final(self, metric: str) -> float:
        vals = getattr(self, metric)
        return float(vals[-1]) if vals and self.status == "done" else math.nan

    def initial(self, metric: str) -> float:
        """The held-out ``metric`` at the evaluation before the first step (step 0: the starting model); NaN without one."""
        vals = getattr(self, metric)
        return float(vals[0]) if vals and self.steps and self.steps[0] == 0 and self.status == "done" else math.nan

    def auc(self, metric: str) -> float:
        return stats.auc(self.steps, getattr(self, metric)) if self.status == "done" and self.steps else math.nan

    def last(self, metric: str) -> float:
        """A tracked training metric's mean over the last :data:`LAST_FRACTION` of the steps that
        logged it (at least one); NaN unless the run is done and logged it."""
        _, vals = self.train.get(metric, ((), ()))
        if self.status != "done" or not vals:
            return math.nan
        k = max(1, math.ceil(LAST_FRACTION * len(vals)))
        return float(sum(vals[-k:]) / k)

    def span(self, metric: str, first: int, last: int) -> float:
        """A tracked training metric's mean over the steps ``first``…``last`` (inclusive); NaN when none logged it."""
        steps, vals = self.train.get(metric, ((), ()))
        inside = [v for s, v in zip(steps, vals) if first <= s <= last]
        return float(sum(inside) / len(inside)) if self.status == "done" and inside else math.nan


def read_run(run_dir: Path, *, variant: str = "", task: str = "", seed: int | None = None, track: tuple = (), start: int | None = None) -> RunRecord:
    """One run's record; ``track`` names training metrics to keep per step (a step logged twice,
    as after a resume, keeps its last value)."""
    run_dir = Path(run_dir)
    cfg = {}
    if (run_dir / "config.toml").is_file():
        cfg = tomllib.loads((run_dir / "config.toml").read_text())
    task = task or (cfg.get("task", {}) or {}).get("name", "?")
    seed = seed if seed is not None else int((cfg.get("train", {}) or {}).get("seed", 0))
    steps, acc, rew, train_max = [], [], [], -math.inf
    tracked: dict[str, dict] = {m: {} for m in track}
    cost: dict[str, dict] = {"tokens": {}, "seconds": {}}
    pass_at: dict[int, dict] = {}
    eval_n = None
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if "eval/accuracy" in row:
                if steps and steps[-1] == row["step"]:
                    steps.pop(), acc.pop(), rew.pop()
                steps.append(row["step"])
                acc.append(row["eval/accuracy"])
                rew.append(row.get("eval/reward", math.nan))
                eval_n = int(row["eval/n"]) if "eval/n" in row else eval_n
            if "rollout/reward" in row:
                train_max = max(train_max, row["rollout/reward"])
            if "time/step" in row:
                cost["seconds"][row["step"]] = float(row["time/step"])
            if "rollout/tokens" in row:
                cost["tokens"][row["step"]] = float(row["rollout/tokens"])
            ks = {int(k.split("@")[1]): float(v) for k, v in row.items() if k.startswith("eval/pass@")}
            mean_at = next((float(v) for k, v in row.items() if k.startswith("eval/mean@")), None)
            if ks or mean_at is not None:
                pass_at[row["step"]] = {**({1: mean_at} if mean_at is not None else {}), **ks}
            for m in track:
                if m in row and "step" in row:
                    tracked[m][row["step"]] = float(row[m])
    problems: dict[int, dict] = {}
    if (run_dir / "eval_problems.jsonl").is_file():  # a step evaluated twice (a resume) keeps its last
        for line in (run_dir / "eval_problems.jsonl").read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                problems[row.pop("step")] = row
    error = (run_dir / "error.txt").read_text() if (run_dir / "error.txt").is_file() else ""
    if (run_dir / "final.json").is_file():
        status = "done"
    elif error:
        status = "failed"
    elif run_dir.is_dir():
        status = "running"
    else:
        status = "missing"
    return RunRecord(
        run_dir=str(run_dir), variant=variant, task=task, seed=seed, status=status, steps=steps, accuracy=acc, reward=rew,
        train_reward_max=train_max if train_max > -math.inf else math.nan, error=error.strip().splitlines()[-1] if error.strip() else "",
        train={m: (sorted(d), [d[k] for k in sorted(d)]) for m, d in tracked.items() if d}, cost=cost, pass_at=pass_at,
        problems=problems, eval_n=eval_n, start=start, start_sha256=_start_sha256(run_dir),
    )


def _start_sha256(run_dir: Path) -> str | None:
    try:
        record = json.loads((run_dir / "provenance.json").read_text())
    except (OSError, ValueError):
        return None
    return (((record.get("hashes") or {}).get("start")) or {}).get("sha256")
