"""The optimizer step: how every :class:`rllab.OptimizerStep` an algorithm yields is answered.

One object, :class:`Optimizers`, holds a run's models and optimizers and answers the requests of
one algorithm step; the trainer builds one per step, and ``rllab replay`` builds one per recorded
batch, so a replayed step is checked, clipped and applied exactly as a trained one::

    optimizers = Optimizers(policy=policy, optimizer=opt, critic=critic, critic_optimizer=copt, max_grad_norm=1.0)
    outcome = optimizers.drive(algorithm.step(ctx), step=ctx.step, algorithm="rl", nonfinite="raise")
    outcome.metrics   # the step's metrics (a flat dict of floats)
    outcome.kl        # the algorithm's KL measure for the controller (a KLSample), or None
    outcome.stepped   # whether any optimizer step was applied

Each request: measure each model's gradient norm (L2 over the parameters that have a gradient);
a non-finite norm raises :class:`rllab.NonFiniteError`; clip to ``max_grad_norm`` (0: no clip);
step the policy's optimizer and, when the request asks (``OptimizerStep(critic=True)``) and there
is a critic, the critic's; zero the gradients; send ``{"actor/grad_norm", "critic/grad_norm"}``
(the norms before clipping) back into the algorithm's generator.

A :class:`rllab.NonFiniteError` raised while the step runs (a non-finite loss from
:func:`rllab.algorithm.checked_loss`, or a non-finite gradient here) follows ``train.nonfinite``:
``"raise"`` stops with it; ``"skip"`` closes the generator, drops the accumulated gradients and
reports the step as skipped (``train/nonfinite = train/skipped = 1``).
"""

from __future__ import annotations

import math
import warnings
from functools import partial
from typing import Any, Callable, Generator

import attrs
import torch

from rllab.algorithm import KLSample, OptimizerStep, StepReport
from rllab.errors import NonFiniteError, RllabError


@attrs.frozen(kw_only=True)
class StepOutcome:
    """What one driven algorithm step gave the trainer (or replay)."""

    metrics: dict
    """The step's metrics: the algorithm's, or ``train/nonfinite``/``train/skipped`` for a skipped
    step; ``train/skipped = 1`` when no optimizer step was applied."""
    kl: KLSample | None = None
    """The algorithm's KL measure for the controller, or None."""
    stepped: bool = False
    """Whether at least one optimizer step was applied (the backend's weights then change)."""
    nonfinite: str | None = None
    """The error's message when ``train.nonfinite = "skip"`` dropped the step, else None."""


@attrs.frozen(kw_only=True, eq=False)
class Optimizers:
    """A run's models and optimizers, and the one optimizer step (see the module docstring).

    ``observe``, when given, is called with each request before its gradients are measured,
    clipped or applied (``rllab replay`` records the raw gradients there); it must not change them.
    """

    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    critic: torch.nn.Module | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    max_grad_norm: float = 0.0
    """Clip each model's gradient to this L2 norm; 0: measure only."""
    observe: Callable[[OptimizerStep], None] | None = None
    clip: Callable[[list, float], float] | None = None
    """``clip(params, limit)``: the gradients' L2 norm before clipping them to ``limit`` — the
    run's placement's (sharded gradients under ``fsdp2``, :mod:`rllab.parallel.placement`); None:
    ``torch.nn.utils.clip_grad_norm_``."""

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)

    def apply(self, request: OptimizerStep, *, step: int) -> dict[str, float]:
        """Check, clip and apply the accumulated gradients; returns the norms before clipping.

        ``step``: the 0-based index of the step being taken (errors name ``step + 1``).
        """
        if self.observe is not None:
            self.observe(request)
        out = {}
        pairs = [("policy", self.policy, self.optimizer, "actor/grad_norm")]
        if request.critic and self.critic is not None:
            pairs.append(("critic", self.critic, self.critic_optimizer, "critic/grad_norm"))
        limit = self.max_grad_norm if self.max_grad_norm > 0 else math.inf
        for what, model, _, key in pairs:
            params = [p for p in model.parameters() if p.grad is not None]
            clip = self.clip or (lambda ps, lim: float(torch.nn.utils.clip_grad_norm_(ps, lim)))
            norm = float(clip(params, limit)) if params else 0.0
            if not math.isfinite(norm):
                raise NonFiniteError(
                    f"the {what}'s gradient is non-finite ({norm}) at step {step + 1} (the losses were finite: look at "
                    f"the components' gradients — `rllab check NAME` tests them); set train.nonfinite = \"skip\" to drop such updates",
                    step=step + 1,
                )
            out[key] = norm
        for _, _, opt, _ in pairs:
            opt.step()
        self.zero_grad()
        return out

    def drive(self, steps: Generator[OptimizerStep, dict, Any], *, step: int, algorithm: str, nonfinite: str) -> StepOutcome:
        """Run one algorithm step to its end, answering each request with :meth:`apply`.

        ``steps``: the generator ``algorithm.step(ctx)`` returned; ``step``: ``ctx.step``;
        ``algorithm``: its name, for errors; ``nonfinite``: ``train.nonfinite`` (``"raise"`` or
        ``"skip"``). The generator's return value is a :class:`rllab.StepReport` or a plain dict
        of metrics (a report without a KL measure).
        """
        stepped = False
        self.zero_grad()
        try:
            request = next(steps)
            while True:
                if not isinstance(request, OptimizerStep):
                    raise RllabError(f"algorithm {algorithm!r} yielded {request!r}; expected rllab.OptimizerStep")
                answer = self.apply(request, step=step)
                stepped = True
                request = steps.send(answer)
        except StopIteration as done:
            report = StepReport.of(done.value, algorithm=algorithm)
        except NonFiniteError as e:
            steps.close()
            self.zero_grad()
            if nonfinite != "skip":
                raise
            return StepOutcome(metrics={"train/nonfinite": 1.0, "train/skipped": 1.0}, nonfinite=str(e))
        metrics = dict(report.metrics)
        if not stepped:
            metrics.setdefault("train/skipped", 1.0)
        return StepOutcome(metrics=metrics, kl=report.kl, stepped=stepped)


def lr_factor(t, step: int) -> float:
    """The learning rate's multiplier at ``step`` under ``[train]`` ``t``: a linear warm-up over
    ``warmup_steps`` and a constant, linear or cosine decay to 0 at ``lr_schedule_steps`` (0:
    ``steps``). ``step`` counts ``t.lr_schedule_unit``: training steps or optimizer steps.

    ``lr_warmup = "scaled"``: the warm-up factor ``min(1, (step + 1) / warmup_steps)`` multiplies a
    decay that runs from step 0. ``"then_decay"`` (transformers' and verl's schedules): ``step /
    warmup_steps`` during the warm-up, then the decay runs from ``warmup_steps`` to the end."""
    horizon = t.lr_schedule_steps or t.steps
    warmup = t.warmup_steps
    if t.lr_warmup == "then_decay":
        if step < warmup:
            return step / warmup
        scale, progress = 1.0, (step - warmup) / max(1, horizon - warmup)
    else:
        scale, progress = (min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0), step / max(1, horizon)
    if t.lr_schedule == "constant" or horizon <= 0:
        return scale
    progress = min(1.0, progress)
    if t.lr_schedule == "linear":
        return scale * (1.0 - progress)
    return scale * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_scheduler(optimizer: torch.optim.Optimizer, t) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule of ``[train]`` ``t`` on ``optimizer``.

    With ``t.lr_schedule_unit == "optimizer_step"`` it advances itself after every optimizer step
    (a step post-hook: the k-th optimizer step of the run uses ``lr_factor(t, k)``, as transformers'
    Trainer steps its scheduler); a skipped update (``train.nonfinite = "skip"``) does not count.
    With ``"step"`` the trainer advances it once per training step (:func:`advance_per_step`)."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, t))
    if t.lr_schedule_unit == "optimizer_step":
        optimizer.register_step_post_hook(lambda *_: scheduler.step())
    return scheduler


def advance_per_step(scheduler: torch.optim.lr_scheduler.LambdaLR, t) -> None:
    """The end of a training step: advance a schedule that counts training steps (also after a
    skipped step: the schedule counts steps); one that counts optimizer steps has advanced already."""
    if t.lr_schedule_unit != "step":
        return
    with warnings.catch_warnings():
        # torch warns when scheduler.step() runs before any optimizer.step() (a skipped step)
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        scheduler.step()
