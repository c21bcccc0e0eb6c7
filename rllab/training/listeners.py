"""A run's loggers, listening to its events: the one place the logger component meets the run.

A logger (``register_loggers``) is a component: built once per run from the config's
``loggers = [...]``, with ``log(step, metrics)`` and ``close()``. The trainer never calls it: it
fires ``on_step_end`` after each step and ``on_eval_end`` after each evaluation, as it does for
every listener, and :class:`RunLoggers` turns those events of *its* run directory into ``log``
calls (several runs may share a process and a :class:`rllab.Lab`). It listens first
(``tryfirst``), so a row is written before the console or any other listener sees the step, and
a logger that cannot write stops the run (the event hooks' rule, :mod:`rllab.hookspecs`).

A logger may also have ``start(config)``: called on ``on_run_start`` (also when a run resumes)
with the run's resolved config as a plain nested dict (``ExperimentConfig.to_dict()``), for the
trackers that record a run's settings next to its metrics; and ``samples(step=, episodes=, batch=,
advantages=, trainer_log_prob=, tokenizer=)`` and ``eval_samples(step=, episodes=, tokenizer=)``:
called on ``on_step_samples`` and ``on_eval_samples`` with a step's samples and an evaluation's
greedy answers, for per-sample traces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from rllab.hookspecs import hookimpl


class RunLoggers:
    """The loggers of the run in ``run_dir``, registered with ``lab`` as an event listener until :meth:`close`."""

    def __init__(self, *, lab: Any, loggers: Sequence[Any], run_dir: Path):
        self.lab = lab
        self.loggers = list(loggers)
        self.run_dir = Path(run_dir)
        lab.pm.register(self, name=f"rllab-loggers-{id(self):x}")

    def _mine(self, run_dir) -> bool:
        return run_dir is not None and Path(run_dir) == self.run_dir

    @hookimpl(tryfirst=True)
    def on_run_start(self, run_dir, config):
        if self._mine(run_dir):
            data = config.to_dict()
            for lg in self.loggers:
                if callable(getattr(lg, "start", None)):
                    lg.start(data)

    @hookimpl(tryfirst=True)
    def on_step_end(self, step, metrics, run_dir):
        if self._mine(run_dir):
            for lg in self.loggers:
                lg.log(step, metrics)

    @hookimpl(tryfirst=True)
    def on_eval_end(self, step, metrics, run_dir):
        if self._mine(run_dir):
            for lg in self.loggers:
                lg.log(step, metrics)

    @hookimpl(tryfirst=True)
    def on_step_samples(self, step, episodes, batch, advantages, trainer_log_prob, tokenizer, run_dir):
        if self._mine(run_dir):
            for lg in self.loggers:
                if callable(getattr(lg, "samples", None)):
                    lg.samples(step=step, episodes=episodes, batch=batch, advantages=advantages,
                               trainer_log_prob=trainer_log_prob, tokenizer=tokenizer)

    @hookimpl(tryfirst=True)
    def on_eval_samples(self, step, episodes, tokenizer, run_dir):
        if self._mine(run_dir):
            for lg in self.loggers:
                if callable(getattr(lg, "eval_samples", None)):
                    lg.eval_samples(step=step, episodes=episodes, tokenizer=tokenizer)

    def close(self) -> None:
        """Stop listening and close every logger (once)."""
        if self.lab.pm.is_registered(self):
            self.lab.pm.unregister(self)
            for lg in self.loggers:
                lg.close()
