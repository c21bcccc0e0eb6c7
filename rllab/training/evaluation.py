"""The trainer's held-out evaluation (:class:`Evaluations`, a part of :class:`rllab.training.trainer.Trainer`).

An evaluation is the rollout stage's (:meth:`rllab.rollout.stage.RolloutStage.evaluate`); the
trainer logs it (its history, ``RUN_DIR/eval_problems.jsonl``) and announces it (``on_eval_end``,
``on_eval_samples``). The evaluation before the first step may overlap that step
(:meth:`Evaluations.evaluate` ``overlapped``): its answers are sampled at once, then scored in a
thread (:class:`_Overlapped`) while the step samples and scores its own, and it is logged, as it
was, before anything of that step.
"""

from __future__ import annotations

import contextvars
import json
import threading

from rllab.training.rundir import EVAL_PROBLEMS_FILE


class Evaluations:
    """The evaluations of a :class:`~rllab.training.trainer.Trainer`, which holds what they read:
    ``rollout``, ``cfg``, ``step``, ``history``, ``placement``, ``run_dir`` and ``hook``."""

    def evaluate(self, *, overlapped: bool = False) -> dict | None:
        """Greedy accuracy and mean reward on the task's held-out split (and mean@n / pass@k with
        ``train.eval_samples``); logged and announced.

        ``overlapped`` (the evaluation before the first step): when the stage allows it
        (:meth:`~rllab.rollout.stage.RolloutStage.scored_elsewhere`: a reward service, one
        process), the answers are sampled now and scored in a thread while the next step samples
        and scores its own, so that the service's retries and waits of both overlap; the
        evaluation is logged and announced, as it was, before anything of that step: once the
        step's rewards are in (the stage calls :attr:`pending_eval`), at the latest when the step's
        algorithm returns. Returns None then."""
        rollout = self.rollout
        t = self.cfg.train
        if overlapped and getattr(rollout, "scored_elsewhere", None) is not None and rollout.scored_elsewhere():
            finish = rollout.evaluate_sampled(t.eval_size, samples=t.eval_samples)
            self._pending_eval = _Overlapped(finish, lambda metrics, step=self.step: self._evaluated(metrics, step))
            rollout.pending_eval = self._pending_eval
            return None
        return self._evaluated(rollout.evaluate(t.eval_size, samples=t.eval_samples), self.step)

    _pending_eval = None
    """The evaluation scored in a thread (:meth:`evaluate` ``overlapped``) not yet logged, else None."""

    def _log_pending_eval(self) -> None:
        """Wait for the evaluation scored in a thread, if any, and log it."""
        pending, self._pending_eval = self._pending_eval, None
        if pending is not None:
            pending()

    def _evaluated(self, metrics: dict, step: int) -> dict:
        """Log and announce an evaluation of the model after ``step``."""
        rollout = self.rollout
        self.history.append({"step": step, **metrics})
        problems = getattr(rollout, "eval_problems", None)
        if problems and self.placement.speaks:  # per held-out problem, for intervals over problems (EVAL_PROBLEMS_FILE)
            with (self.run_dir / EVAL_PROBLEMS_FILE).open("a") as f:
                f.write(json.dumps({"step": step, **problems}) + "\n")
        self.hook.on_eval_end(step=step, metrics=dict(metrics), run_dir=self.run_dir)
        episodes = getattr(rollout, "eval_episodes", None)
        takers = getattr(getattr(self.hook, "on_eval_samples", None), "get_hookimpls", None)
        if episodes and takers and takers():  # the greedy answers, for per-sample traces
            self.hook.on_eval_samples(step=step, episodes=list(episodes), tokenizer=rollout.tokenizer, run_dir=self.run_dir)
        return metrics

    def _settle_pending_eval(self, error: BaseException) -> None:
        """On the way out with ``error``: the evaluation scored in a thread is still logged, as it
        was before the step that failed (not when interrupted, nor if it failed itself: ``error`` is
        what the run reports)."""
        pending, self._pending_eval = self._pending_eval, None
        if pending is None or not isinstance(error, Exception):
            return
        try:
            pending()
        except Exception:
            pass


class _Overlapped:
    """An evaluation being scored in a thread (:meth:`Evaluations.evaluate` ``overlapped``): called,
    it waits for the scores, then logs the evaluation (``log(metrics)``), once; the scoring's
    error, if any, is raised then, in the caller's thread."""

    def __init__(self, finish, log):
        self.log, self.box, self.done = log, {}, False
        context = contextvars.copy_context()  # the run's lab, for reward names resolved while scoring

        def run() -> None:
            try:
                self.box["metrics"] = context.run(finish)
            except BaseException as e:  # raised in the thread that logs it
                self.box["error"] = e

        self.thread = threading.Thread(target=run, name="rllab-eval-scores", daemon=True)
        self.thread.start()

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        self.thread.join()
        if "error" in self.box:
            raise self.box["error"]
        self.log(self.box["metrics"])

