"""The warm start's progress bar (:func:`rllab.models.tiny.warm_start` with ``progress=True``)."""

from __future__ import annotations


class warm_start_progress:
    """A rich progress bar showing the loss and the probe accuracy, or a no-op when disabled."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total

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
        self.bar.__enter__()
        task_id = self.bar.add_task("warm", total=self.total, loss=float("nan"), acc="-")

        def advance(step, loss, acc):
            fields = {"loss": loss} if acc is None else {"loss": loss, "acc": f"{acc:.0%}"}
            self.bar.update(task_id, completed=step, **fields)

        return advance

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.__exit__(*exc)
