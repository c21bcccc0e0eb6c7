"""What an algorithm plugin sees and returns: the run context, the optimizer-step request, the
step's report, and the checks every algorithm applies to what its components return.

An algorithm (``register_algorithms``) is the step a run repeats. It reads the run through a
:class:`RunContext` and never steps an optimizer itself: its ``step`` is a generator that yields
an :class:`OptimizerStep` after each backward pass, and the trainer answers by checking,
clipping and applying the gradients (:class:`rllab.training.optimizer.Optimizers`)::

    class SFT:
        uses = {"task", "backend"}            # register(..., uses=SFT.uses): config sections it reads
        provides = {}                         # register(..., provides=SFT.provides): inputs it passes on

        def __init__(self, *, config):
            self.config = config

        def needs(self, ctx):                 # extra models: "reference", "critic"
            return set()

        def step(self, ctx):
            loss = ...                        # forwards through ctx.policy
            loss = checked_loss(loss, ctx, "sft")
            loss.backward()
            grad = yield OptimizerStep()      # the trainer clips and steps; grad metrics back
            return {"loss/sft": loss.item(), **grad}

The step returns its metrics (a flat dict of floats: logged, never read by the trainer) or a
:class:`StepReport`: the metrics plus what the trainer acts on, a :class:`KLSample` (the KL to the
reference that the KL controller adapts β to, and the number of samples it was measured on)::

            return StepReport(metrics=metrics, kl=KLSample(value=kl, samples=rows))

The kernel fires the rollout events for every algorithm (:class:`StepEvents`): ``on_rollout_end``
as a batch is made from the step's rollouts (``ctx.rollout.to_batch``), ``on_step_samples`` after
the step. An algorithm that has advantages or the policy's log-probs of the samples hands them to
the listeners with :func:`report_samples`, after its update::

        rollouts = ctx.rollout.sample(ctx.step)
        batch = rollout_batch(ctx, rollouts)          # ctx.rollout.to_batch: on_rollout_end
        ...                                           # the update
        metrics.update(report_samples(ctx, rollouts, batch, advantages=adv, trainer_log_prob=old))
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable, Generator, Mapping, Protocol, Sequence, runtime_checkable

import attrs
import torch

from rllab.errors import NonFiniteError, RllabError
from rllab.parallel.reducer import SINGLE, Reducer, current_reducer, reducing  # noqa: F401  (re-exported: ctx.reducer's type)

if TYPE_CHECKING:
    from rllab.types import Completion, Example, RolloutBatch, SamplingParams


def seed_for(seed: int, step: int, salt: int) -> int:
    """A per-(seed, step, purpose) seed: every step's data and sampling derive from the run's seed."""
    return (seed * 1_000_003 + step * 7919 + salt * 104_729) % (2**31 - 1)


@attrs.frozen(kw_only=True)
class OptimizerStep:
    """Yielded by an algorithm after a backward pass: "apply the accumulated gradients now".

    ``critic``: also step the critic's optimizer (when the run has a critic).
    """

    critic: bool = False


@attrs.frozen(kw_only=True)
class KLSample:
    """The step's KL to the reference, for the KL controller (``controller.update(current_kl=value,
    n_steps=samples)``; an adaptive controller scales its horizon by ``samples``)."""

    value: float
    """The KL measure (e.g. the mean over valid tokens of ``old − ref`` log-probs)."""
    samples: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    """How many samples (rows) it was measured on."""


@attrs.frozen(kw_only=True)
class StepReport:
    """What an algorithm's step returns: its metrics, and the KL measure for the controller.

    ``metrics`` go to the run's row (loggers, ``on_step_end``) and are never read for control;
    ``kl`` steers the KL controller when the run has a reference model (None: β stays).
    """

    metrics: Mapping[str, Any] = attrs.field(factory=dict)
    kl: KLSample | None = None

    @classmethod
    def of(cls, value: Any, *, algorithm: str) -> StepReport:
        """``value`` as a report: a StepReport as it is, a dict (or None) as metrics without a KL."""
        if isinstance(value, StepReport):
            return value
        if value is None or isinstance(value, Mapping):
            return cls(metrics=dict(value or {}))
        raise RllabError(f"algorithm {algorithm!r}: its step returned a {type(value).__name__}; return a dict of metrics or an rllab.StepReport")


@attrs.frozen(kw_only=True, eq=False)
class RunContext:
    """A read-only view of the run for one step.

    ``components`` maps config sections (``policy_loss``, ``advantage``, …) to built components;
    ``rollout`` is the run's :class:`Rollout` (its :class:`rllab.rollout.stage.RolloutStage`, the
    asynchronous wrapper around it, or a :class:`rllab.RecordedRollout`); ``reference`` / ``critic`` are None
    unless the algorithm's ``needs`` asked for them. ``kl_coef`` is the KL controller's current β.
    """

    step: int
    """0-based index of the step being taken (the run has completed ``step`` steps)."""
    config: Any
    components: Mapping[str, Any]
    rollout: Rollout | None
    policy: torch.nn.Module
    reference: torch.nn.Module | None = None
    critic: torch.nn.Module | None = None
    kl_coef: float = 0.0
    device: torch.device = torch.device("cpu")
    autocast_dtype: torch.dtype | None = None
    hook: Any = None
    """The Lab's event hooks (``ctx.hook.on_rollout_end(...)``)."""
    run_dir: Any = None
    """The run directory (the events' ``run_dir``; None outside a run)."""
    reducer: Reducer = SINGLE
    """Sums over data-parallel ranks (:mod:`rllab.parallel.distributed`): an algorithm passes every
    batch-wide count through ``reducer.sum`` (the identity in one process)."""
    events: StepEvents | None = None
    """The step's rollout events, fired by the kernel (None outside a run's step: :func:`rollout_batch`
    and :func:`report_samples` then fire them themselves)."""

    @property
    def seed(self) -> int:
        return self.config.train.seed

    def autocast(self):
        """A context for the forwards: ``torch.autocast`` at the run's compute dtype, or nothing."""
        if self.autocast_dtype is None:
            return _Null()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@runtime_checkable
class Rollout(Protocol):
    """What an algorithm may use of ``ctx.rollout``: every rollout a run hands an algorithm (the
    :class:`rllab.rollout.stage.RolloutStage`, :class:`rllab.rollout.asynchronous.AsyncRollout` around it,
    :class:`rllab.RecordedRollout`) has each of these members and forwards nothing else, so a
    step that reaches for another one fails with an AttributeError naming it. A recorded rollout
    raises :class:`rllab.RllabError` from the members that would need a model or a task."""

    task: Any
    """The run's task (its examples, demonstrations)."""
    tokenizer: Any
    """The policy's tokenizer (``pad_token_id``)."""

    def sample(self, step: int, **kw: Any) -> Any:
        """The step's episodes and metrics, a :class:`rllab.rollout.stage.Rollouts` (``prompts=``,
        ``group_size=`` override the config's). Named in words: the rollout module builds on this one."""

    def to_batch(self, rollouts: Any) -> RolloutBatch | None:
        """The kept episodes as a padded batch (None when nothing is kept)."""

    def greedy_rewards(self, examples: Sequence[Example]) -> torch.Tensor:
        """(N,) float32: the reward of one greedy completion per example (ReMax's baselines)."""

    def generate(self, examples: Sequence[Example], params: SamplingParams) -> list[Completion]:
        """Completions of the examples' prompts."""

    def play(self, examples: Sequence[Example], params: SamplingParams) -> list:
        """``params.n`` episodes per example through the episode loop, scored
        (:class:`rllab.rollout.episodes.EpisodeResult`, prompt-major)."""

    def sampling_params(self, step: int, *, n: int, greedy: bool = False) -> SamplingParams:
        """The rollout settings' sampling parameters for ``step`` (``n`` samples per prompt)."""

    def score_components(self, examples: Sequence[Example], completions: Sequence[Completion]) -> tuple:
        """``(rewards, components, keep, n_errors)`` of completions of the examples."""

    def solved(self, example: Example, reward: float, components: Sequence[float] | None = None) -> bool:
        """Whether an answer with this reward is solved."""

    def encode(self, prompt: Any) -> list[int]:
        """The token ids of a prompt (a string, or chat messages)."""

    def response_ids(self, text: str, *, prompt: Any = None) -> list[int]:
        """Token ids of a response text to ``prompt``, ending as a sampled response would."""

    def evaluate(self, size: int, *, samples: int = 0) -> dict:
        """Held-out metrics (``eval/accuracy``, …) on the first ``size`` evaluation examples."""


ROLLOUT_MEMBERS: tuple[str, ...] = tuple(dict.fromkeys(n for n in (*Rollout.__annotations__, *vars(Rollout)) if not n.startswith("_")))
"""The members of :class:`Rollout`, by name."""


@runtime_checkable
class Algorithm(Protocol):
    """What ``register_algorithms`` factories return (see :mod:`rllab.hookspecs`).

    Also read when present (:data:`rllab.members.MEMBERS` ``["algorithm"]``, with their defaults):
    ``reconfigure(config)`` (default None) — it takes a ``[[schedule]]`` entry's new knobs (None: a
    change of its knobs mid-run is refused). What it declares before it is built (``uses``,
    ``provides``, ``data_parallel``, ``replayable``, ``async_rollouts``) are traits of its registration.
    """

    def needs(self, ctx: RunContext) -> set[str]:
        """The extra models this run needs: a subset of {"reference", "critic"}."""

    def step(self, ctx: RunContext) -> Generator[OptimizerStep, dict, StepReport | dict]:
        """One training step; yields after each backward pass (the answer: the gradient norms),
        returns a :class:`StepReport` (metrics and the KL measure) or just the metrics dict."""


class StepEvents:
    """The rollout events of one step, fired by the kernel whatever the algorithm.

    The trainer makes one per step and has the run's rollout call :meth:`batched` as it makes a
    batch of the step's rollouts (``to_batch``): ``on_rollout_end`` goes out then. The samples go
    to ``on_step_samples`` when the algorithm reports them (:func:`report_samples`, with its
    advantages and log-probs), or else after its step (:meth:`finish`, without them). Only rank
    0's loggers listen, so nothing here runs a forward or a collective."""

    def __init__(self, *, hook: Any, step: int, run_dir: Any, tokenizer: Any):
        self.hook, self.step, self.run_dir, self.tokenizer = hook, step, run_dir, tokenizer
        self.unreported: list[tuple[Any, RolloutBatch]] = []
        """The rollouts batched this step whose samples the algorithm has not reported (yet)."""

    def batched(self, rollouts: Any, batch: RolloutBatch | None) -> None:
        """A batch of ``rollouts`` was made (None: nothing kept, nothing announced)."""
        if batch is None or self.hook is None:
            return
        self.hook.on_rollout_end(step=self.step + 1, batch=batch, metrics=dict(rollouts.metrics))
        self.unreported.append((rollouts, batch))

    def report(self, rollouts: Any, batch: RolloutBatch, *, advantages: torch.Tensor | None = None,
               trainer_log_prob: torch.Tensor | None = None) -> dict[str, float]:
        """:func:`report_samples`, within the step."""
        self.unreported = [(r, b) for r, b in self.unreported if r is not rollouts]
        return _samples_out(self.hook, self.step, rollouts, batch, advantages, trainer_log_prob, lambda: self.tokenizer, self.run_dir)

    def finish(self) -> dict[str, float]:
        """After the algorithm's step: the samples of each batch it did not report, without
        advantages or log-probs; ``{"time/samples": seconds}`` when a listener took some."""
        seconds = sum(_samples_out(self.hook, self.step, r, b, None, None, lambda: self.tokenizer, self.run_dir).get("time/samples", 0.0)
                      for r, b in self.unreported)
        self.unreported = []
        return {"time/samples": seconds} if seconds else {}


def rollout_batch(ctx: RunContext, rollouts: Any) -> RolloutBatch | None:
    """The step's kept episodes as a batch (``ctx.rollout.to_batch``; None when nothing is kept).
    Within a run's step the rollout announces it (``on_rollout_end``, :class:`StepEvents`);
    outside one (a context built by hand, ``rllab replay``) this does."""
    batch = ctx.rollout.to_batch(rollouts)
    if ctx.events is None and batch is not None and ctx.hook is not None:
        ctx.hook.on_rollout_end(step=ctx.step + 1, batch=batch, metrics=dict(rollouts.metrics))
    return batch


def report_samples(ctx: RunContext, rollouts: Any, batch: RolloutBatch, *, advantages: torch.Tensor | None = None,
                   trainer_log_prob: torch.Tensor | None = None) -> dict[str, float]:
    """Hand the step's samples to the listeners that take them (``on_step_samples``: the traces
    logger), after the update; returns ``{"time/samples": seconds}`` when one did, else ``{}``.

    ``batch``: what :func:`rollout_batch` returned for ``rollouts``. ``advantages``: (B, T) what
    the update trained on (None: the algorithm has none). ``trainer_log_prob``: (B, T) the
    policy's log-probs of the sampled tokens before the update, from a forward the step runs
    anyway (None: it has none; a tensor with NaN, rows its forwards reached only after an
    optimizer step, counts as none).

    Only rank 0's loggers listen, so whether anyone takes the samples differs between
    data-parallel ranks: this runs no forward and no collective, and a step must never run one
    to feed it (a rank would wait for the others forever). Samples an algorithm does not report
    reach the listeners after its step all the same, without advantages (:class:`StepEvents`)."""
    if ctx.events is not None:
        return ctx.events.report(rollouts, batch, advantages=advantages, trainer_log_prob=trainer_log_prob)
    return _samples_out(ctx.hook, ctx.step, rollouts, batch, advantages, trainer_log_prob, lambda: ctx.rollout.tokenizer, ctx.run_dir)


def _samples_out(hook: Any, step: int, rollouts: Any, batch: RolloutBatch, advantages: torch.Tensor | None,
                 trainer_log_prob: torch.Tensor | None, tokenizer: Callable[[], Any], run_dir: Any) -> dict[str, float]:
    """``on_step_samples`` of the kept episodes when a listener takes them (``tokenizer()``: read then)."""
    impls = getattr(getattr(hook, "on_step_samples", None), "get_hookimpls", None)
    kept = [e for e in rollouts.episodes if e.keep]
    if not (impls and impls()) or len(kept) != batch.input_ids.shape[0]:
        return {}
    t0 = time.perf_counter()
    if trainer_log_prob is not None and bool(trainer_log_prob.isnan().any()):
        trainer_log_prob = None
    hook.on_step_samples(step=step + 1, episodes=kept, batch=batch, advantages=advantages,
                         trainer_log_prob=trainer_log_prob, tokenizer=tokenizer(), run_dir=run_dir)
    return {"time/samples": time.perf_counter() - t0}


def describe(component: Any, section: str) -> str:
    """``policy_loss 'ppo_clip' (plugin rllab_policy_losses)`` for error messages."""
    spec = getattr(component, "spec", None)
    if spec is None:
        return f"[{section}]"
    return f"{section} {spec.name!r} (plugin {spec.provider})"


def checked_loss(value: Any, ctx: RunContext, section: str, component: Any = None) -> torch.Tensor:
    """``value`` if it is a finite scalar tensor; otherwise an error naming the component.

    A loss of the wrong shape (e.g. a (B, T) per-token matrix that was never aggregated) raises
    :class:`RllabError`; a NaN/inf loss raises :class:`NonFiniteError` (which the trainer's
    ``train.nonfinite`` policy handles).
    """
    who = describe(component if component is not None else ctx.components.get(section), section)
    if not isinstance(value, torch.Tensor):
        raise RllabError(f"{who} returned a {type(value).__name__} as its loss; a loss must be a scalar torch.Tensor")
    if value.ndim != 0:
        raise RllabError(
            f"{who} returned a loss of shape {tuple(value.shape)}; a loss must be a scalar (0-dim) tensor — "
            f"reduce the per-token loss with the `aggregate` argument (`rllab check {getattr(getattr(component, 'spec', None), 'name', section)}` "
            f"runs the contract suite)"
        )
    if not math.isfinite(value.item()):
        raise NonFiniteError(
            f"{who} returned a non-finite loss ({value.item()}) at step {ctx.step + 1}; set train.nonfinite = \"skip\" "
            f"to drop such updates instead of stopping",
            section=section,
            step=ctx.step + 1,
        )
    return value
