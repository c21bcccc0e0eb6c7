"""The warm start's progress bar (:func:`rllab.models.tiny.warm_start` with ``progress=True``)."""

from __future__ import annotations


class warm_start_progress:
    """A rich progress bar showing the loss and the probe accuracy, or a no-op when disabled.

    When the warm start ends (without an error) a line under the bar says why it stopped: its
    probe accuracy reached ``target`` (``model.warm_start.target_accuracy``) before the last step,
    or it ran every step (reaching the target there, or not) — :func:`stop_reason`."""

    def __init__(self, enabled: bool, total: int, target: float | None = None):
        self.enabled, self.total, self.target = enabled, total, target
        self.step, self.acc, self.verdict = 0, None, None

    def __enter__(self):
        if not self.enabled:
            return lambda step, loss, acc: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("warm start"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.3f}  probe acc {task.fields[acc]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.console = self.bar.console
        self.bar.__enter__()
        task_id = self.bar.add_task("warm", total=self.total, loss=float("nan"), acc="-")

        def advance(step, loss, acc):
            fields = {"loss": loss} if acc is None else {"loss": loss, "acc": f"{acc:.0%}"}
            self.step, self.acc = step, (acc if acc is not None else self.acc)
            self.bar.update(task_id, completed=step, **fields)

        self.task_id = task_id
        return advance

    def pending(self, step: int, loss: float, verdict: str) -> None:
        """The last probe, taken at ``step``, is known to have ``"reached"`` the target or to stay
        ``"below"`` it while its last scores are still out: the bar shows that, not a value."""
        self.step, self.acc, self.verdict = step, None, verdict
        if self.enabled and self.target is not None:
            acc = f"{'≥' if verdict == 'reached' else '<'} {self.target:.0%}"
            self.bar.update(self.task_id, completed=step, loss=loss, acc=acc)

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.__exit__(*exc)
            if exc[0] is None and self.step:
                self.console.print(stop_reason(self.step, self.total, self.acc, self.target, self.verdict), highlight=False)


def stop_reason(step: int, total: int, acc: float | None, target: float | None, verdict: str | None = None) -> str:
    """The line that ends the warm start's bar: where it stopped and why. ``verdict``
    (``"reached"``, ``"below"``), with ``acc`` None: the last probe's place against ``target``,
    known before its last scores came (its value is recorded once they are in)."""
    later = acc is None and verdict is not None and target is not None
    if later:
        measured = f"probe accuracy {'at least' if verdict == 'reached' else 'under'} {target:.0%}"
    else:
        measured = f"probe accuracy {acc:.0%}" if acc is not None else "probe accuracy not measured"
    note = "; its value goes into the model's record (warm/probe_accuracy) once its last scores are in" if later else ""
    if target is not None and ((acc is not None and acc >= target) or (later and verdict == "reached")):
        when = f"at step {step} of {total}" if step < total else f"at its last step ({total})"
        what = "probe accuracy" if later else measured
        return (f"warm start stopped {when}: {what} reached the target {target:.0%} "
                f"(model.warm_start.target_accuracy){note}")
    if target is None:
        return f"warm start ran all {total} steps (no target accuracy set): {measured}"
    return (f"warm start ran all {total} steps (model.warm_start.steps) without reaching the target {target:.0%}: {measured}{note}; "
            "more steps or a lower model.warm_start.target_accuracy would change that")
