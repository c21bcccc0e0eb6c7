"""Asynchronous rollouts with bounded staleness (``rollout.max_staleness = k``).

With ``k = 0`` the trainer samples each step's batch with the weights it trains (the synchronous
loop; nothing here is used). With ``k ≥ 1`` a producer thread samples the batches of later steps
while a step trains::

    trainer thread:  ── train step t (batch t) ──┬ settle ┬ sync W(t+1) ┬ train step t+1 …
    producer thread: ── sample batch t+k with W(t) ┘        └ sample batch t+k+1 with W(t+1) …

The schedule is fixed: the batch of step ``s`` is always sampled with the weights at the start of
step ``max(0, s − k)`` (``W(0)`` for the first ``k + 1`` batches), from the prompts and sampling
seed of step ``s`` (``seed_for(seed, s, …)``), whatever the timing. Before a weight sync the
trainer waits until the producer has sampled batch ``t + k`` ("settle"); syncs, evaluations and
the producer's batches never overlap (one lock), so the backend's weights are the trainer's
except while a batch is sampled ahead. A deterministic sampler (``hf`` on CPU) therefore gives a
deterministic run for a given ``k``, and checkpoints hold the ``k`` batches already sampled ahead,
so resume after ``kill -9`` reproduces the uninterrupted run: the batch being sampled when the
checkpoint was written used the checkpoint's own weights and is sampled again.

``rollout.run_ahead = false``: the producer samples batch ``s`` only after the sync that precedes
step ``s`` (with ``W(s)``), so every sample is fresh and the run is the synchronous one value for
value (same prompts, seeds, weights and torch threads; the trainer waits for each batch): a
reference that isolates the threading, queueing and versioning from the effect of staleness.

Versions and staleness: the backend is wrapped in :class:`VersionedBackend`, which counts weight
syncs (``version``). A completion's version is the integer its backend reports
(``Completion.weight_version``: ``hf`` and ``sglang`` count their syncs alike), else the version
at which its batch was sampled. When step ``t`` takes its batch, each sample's staleness is
``trainer version − sample version`` (``EpisodeResult.staleness``, ``RolloutBatch.staleness``); a sample
more than ``k`` versions old is dropped (``rollout.stale = "drop"``) or trained on (``"train"``),
counted either way (``async/dropped``, ``async/stale_trained``).

Metrics of a step: ``async/staleness_mean``, ``async/staleness_max``, ``async/staleness_<j>``
(how many samples are ``j`` versions old: the histogram), ``async/dropped``,
``async/stale_trained``, and ``time/rollout_wait``, the time the trainer waited for the producer
(for its batch, and before the weight sync: that share alone is ``time/push_wait``), against ``time/rollout``, the producer's own
sampling time of that batch (spent while earlier steps trained).

Pushes that do not wait (``sglang`` with ``backend.push = "pause"``, a backend whose
``pushes_in_flight`` is true): the sync neither settles nor takes the lock, so the producer's
requests stay in flight across it and finish with the new weights — a completion may carry tokens
of two versions. The backend reports each completion's *oldest* version, so a sample's staleness
is that of its oldest token, and the drop/train rule applies to it. The bound holds: batch ``s``
is queued after the sync that follows step ``s − k − 1``, so its tokens are at most ``k`` versions
old when step ``s`` takes it (``async/dropped`` stays 0 unless a server lags). What a batch is
sampled with now depends on timing: such a run is not deterministic, and a checkpoint holds only
the batches already finished; one still in flight is sampled again after a resume, from the
checkpoint's weights (counted in ``async/regenerated``).

Threads: on CPU the trainer keeps ⌊n/2⌋ of the process's n torch threads and the producer gets
the rest (one each on two cores; ``backend.num_threads`` still applies inside ``hf`` generation).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import pickle
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import attrs
import torch

from rllab.algorithm import ROLLOUT_MEMBERS
from rllab.errors import ConfigError, RllabError
from rllab.members import member
from rllab.rollout.stage import Rollouts, RolloutStage

if TYPE_CHECKING:
    from rllab.rollout.episodes import EpisodeResult
    from rllab.settings import RolloutConfig
    from rllab.types import Completion, Example, RolloutBatch, SamplingParams


class VersionedBackend:
    """A rollout backend behind a lock that counts its weight syncs.

    ``generate`` and ``update_weights`` hold the (re-entrant) lock, so a sync never lands in the
    middle of a batch — except on a backend whose ``pushes_in_flight`` is true (``overlap``),
    whose syncs run beside its batches; ``version`` is the number of ``update_weights`` calls so
    far. Each thread reads the ``last_metrics`` of its own last ``generate``. The backend
    protocol's optional members (``follow_weights``, ``pushes_in_flight``) are the inner
    backend's; nothing else is forwarded (``inner`` is the backend itself).
    """

    def __init__(self, inner: Any):
        self.inner = inner
        self.lock = threading.RLock()
        self.version = 0
        self.overlap = bool(member(inner, "rollout_backend", "pushes_in_flight"))
        """Weight syncs do not wait for the batch being sampled (module docstring)."""
        self._local = threading.local()

    def generate(self, prompts, params):
        with self.lock:
            out = self.inner.generate(prompts, params)
            self._local.metrics = self.inner.last_metrics()
        return out

    def last_metrics(self) -> dict:
        return dict(getattr(self._local, "metrics", None) or {})

    def update_weights(self, model):
        with contextlib.nullcontext() if self.overlap else self.lock:
            out = self.inner.update_weights(model)
            self.version += 1
        return out

    def close(self) -> None:
        self.inner.close()

    # the backend protocol's optional members (rllab.members.MEMBERS["rollout_backend"]), the inner
    # backend's own; nothing else is forwarded
    @property
    def follow_weights(self):
        return member(self.inner, "rollout_backend", "follow_weights")

    @property
    def pushes_in_flight(self) -> bool:
        return self.overlap


def sample_versions(rollouts: Rollouts, produced_at: int) -> torch.Tensor:
    """(N,) int64: each episode's weight version — the integer its backend reported, else
    ``produced_at`` (the version its batch was sampled with)."""

    def one(v: Any) -> int:
        try:
            return int(v)
        except (TypeError, ValueError):
            return produced_at

    return torch.tensor([one(e.completion.weight_version) for e in rollouts.episodes], dtype=torch.long)


def apply_staleness(rollouts: Rollouts, versions: torch.Tensor, current: int, *, max_staleness: int, stale: str) -> Rollouts:
    """``rollouts`` as step-time data for a trainer at weight version ``current``: each episode's
    staleness (``current − versions``), episodes over ``max_staleness`` dropped (``stale =
    "drop"``) or kept (``"train"``), and the ``async/*`` metrics (module docstring)."""
    staleness = (current - versions).clamp(min=0)
    over = staleness > max_staleness
    kept = rollouts.keep
    keep = kept & ~over if stale == "drop" else kept
    n = max(1, staleness.numel())
    metrics = dict(rollouts.metrics)
    metrics.update({
        "async/staleness_mean": staleness.float().sum().item() / n,
        "async/staleness_max": float(staleness.max().item()) if staleness.numel() else 0.0,
        "async/dropped": float((over & kept).sum().item()) if stale == "drop" else 0.0,
        "async/stale_trained": float((over & kept).sum().item()) if stale == "train" else 0.0,
        "rollout/kept_frac": keep.float().mean().item() if keep.numel() else 0.0,
    })
    for j, c in enumerate(torch.bincount(staleness, minlength=max_staleness + 1).tolist()):
        metrics[f"async/staleness_{j}"] = float(c)
    episodes = [attrs.evolve(e, keep=k, staleness=a) for e, k, a in zip(rollouts.episodes, keep.tolist(), staleness.tolist())]
    return attrs.evolve(rollouts, episodes=episodes, metrics=metrics)


class AsyncRollout:
    """The rollout stage seen by the algorithm when ``rollout.max_staleness = k > 0``.

    :param stage: the run's :class:`RolloutStage` (its backend a :class:`VersionedBackend`).
    :param limit: the run's number of steps, read when a batch would be queued (none past it).
    :param cpu: whether the trainer computes on the CPU (then the torch threads are split).

    ``sample(step)`` hands out the batch sampled ahead for ``step``; :meth:`settle` and
    :meth:`advance` are the trainer's, around each weight sync. The other members of the rollout
    protocol (:class:`rllab.algorithm.Rollout`) are the stage's; nothing else is forwarded.
    """

    def __init__(self, stage: RolloutStage, *, limit: Callable[[], int], cpu: bool):
        self.stage = stage
        self.backend: VersionedBackend = stage.backend
        self.k = stage.config.max_staleness
        self.stale = stage.config.stale
        self.ahead = self.k if stage.config.run_ahead else 0
        """How many batches past the trainer's step the producer samples (0: ``run_ahead = false``)."""
        self.limit = limit
        self.futures: dict[int, concurrent.futures.Future] = {}
        self.wait_s = 0.0
        self.regenerated: set[int] = set()
        """Steps whose batch a checkpoint could not hold: sampled again after a resume (``async/regenerated``)."""
        threads = torch.get_num_threads()
        self._trainer_threads = None
        producer_threads = None
        if cpu and threads > 1 and self.ahead:
            self._trainer_threads = (threads, threads // 2)
            producer_threads = threads - threads // 2
        elif cpu:  # never ahead: the two never compute at once, each gets the trainer's threads (as synchronous)
            producer_threads = threads
        self.pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="rllab-rollout", initializer=_set_threads, initargs=(producer_threads,)
        )
        if self._trainer_threads is not None:
            torch.set_num_threads(self._trainer_threads[1])

    def __getattr__(self, name: str):
        """Only reached for a member this class does not have: says what an algorithm may use."""
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"the rollout has no member {name!r} with rollout.max_staleness > 0 (batches sampled ahead): an algorithm "
            f"may use the members of rllab.Rollout only ({', '.join(ROLLOUT_MEMBERS)})", name=name, obj=self,
        )

    # -- the rest of the rollout protocol (rllab.algorithm.Rollout): the stage's own, nothing else

    @property
    def task(self) -> Any:
        return self.stage.task

    @property
    def tokenizer(self) -> Any:
        return self.stage.tokenizer

    def to_batch(self, rollouts: Rollouts) -> RolloutBatch | None:
        return self.stage.to_batch(rollouts)

    def greedy_rewards(self, examples: Sequence[Example]) -> torch.Tensor:
        return self.stage.greedy_rewards(examples)

    def generate(self, examples: Sequence[Example], params: SamplingParams) -> list[Completion]:
        return self.stage.generate(examples, params)

    def play(self, examples: Sequence[Example], params: SamplingParams) -> list[EpisodeResult]:
        with self.backend.lock:
            return self.stage.play(examples, params)

    def sampling_params(self, step: int, *, n: int, greedy: bool = False) -> SamplingParams:
        return self.stage.sampling_params(step, n=n, greedy=greedy)

    def score_components(self, examples: Sequence[Example], completions: Sequence[Completion]) -> tuple:
        return self.stage.score_components(examples, completions)

    def solved(self, example: Example, reward: float, components: Sequence[float] | None = None) -> bool:
        return self.stage.solved(example, reward, components)

    def encode(self, prompt: Any) -> list[int]:
        return self.stage.encode(prompt)

    def response_ids(self, text: str, *, prompt: Any = None) -> list[int]:
        return self.stage.response_ids(text, prompt=prompt)

    @property
    def solved_rule(self) -> str:
        return self.stage.solved_rule

    # -- the run's rollout state (RolloutStage's, with the batches sampled ahead)

    samples_ahead = True

    def announcing(self, events: Any):
        """The stage's :meth:`RolloutStage.announcing` (the batches handed out are made by the stage)."""
        return self.stage.announcing(events)

    def succeeded_by(self, stage: RolloutStage) -> AsyncRollout:
        """This rollout itself: the [rollout] settings cannot change while batches are sampled ahead."""
        if stage.config != self.stage.config:
            raise RllabError("[rollout] cannot change during a run with rollout.max_staleness > 0 (batches are sampled ahead)")
        return self

    # -- the producer

    def _produce(self, step: int) -> tuple[Rollouts, int]:
        with self.backend.lock:  # no sync, evaluation or other batch meanwhile
            return self.stage.sample(step), self.backend.version

    def _submit(self, step: int) -> None:
        if step not in self.futures and step < self.limit():
            self.futures[step] = self.pool.submit(self._produce, step)

    def _wait(self, future: concurrent.futures.Future):
        t0 = time.perf_counter()
        out = future.result()
        self.wait_s += time.perf_counter() - t0
        return out

    def _fill(self, step: int) -> None:
        """Queue batches ``step … step + k`` not yet queued (the start of a run, or a resume);
        only ``step`` with ``run_ahead = false``."""
        for s in range(step, step + self.ahead + 1):
            self._submit(s)

    # -- the trainer's side

    def sample(self, step: int, **kw: Any) -> Rollouts:
        """The batch of ``step``, sampled ahead, with its staleness against the current weights."""
        if kw:
            raise ConfigError(f"rollout.max_staleness = {self.k}: a batch sampled ahead has the run's prompts and group size; got {kw}")
        self._fill(step)
        self.wait_s = 0.0
        rollouts, produced_at = self._wait(self.futures.pop(step))
        out = apply_staleness(
            rollouts, sample_versions(rollouts, produced_at), self.backend.version, max_staleness=self.k, stale=self.stale
        )
        out.metrics["time/rollout_wait"] = self.wait_s
        if step in self.regenerated:
            out.metrics["async/regenerated"] = 1.0
        return out

    def settle(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
        """Wait until the producer has sampled every batch up to ``step + k`` (before the weight
        sync that follows step ``step``); returns the step's metrics with the seconds waited
        (``time/push_wait``, also counted in ``time/rollout_wait``). A backend whose pushes leave
        its requests in flight (``overlap``) is not waited for: 0."""
        t0 = time.perf_counter()
        if not self.backend.overlap:
            for s in sorted(self.futures):
                if s <= step + self.k:
                    self.futures[s].result()
        waited = 0.0 if self.backend.overlap else time.perf_counter() - t0
        return {"time/push_wait": waited, "time/rollout_wait": metrics.get("time/rollout_wait", 0.0) + waited}

    def advance(self, step: int) -> None:
        """Step ``step`` is next: queue batch ``step + k`` (``step`` with ``run_ahead = false``),
        sampled with the weights synced now."""
        self._fill(step)

    def evaluate(self, size: int, *, samples: int = 0) -> dict:
        with self.backend.lock:
            return self.stage.evaluate(size, samples=samples)

    @property
    def eval_episodes(self) -> list:
        """The stage's last evaluation's greedy episodes."""
        return getattr(self.stage, "eval_episodes", [])

    @property
    def eval_problems(self) -> dict | None:
        """The stage's last evaluation per held-out problem."""
        return getattr(self.stage, "eval_problems", None)

    # -- checkpoints

    def state_dict(self, step: int) -> dict:
        """The stage's state (:meth:`RolloutStage.state_dict`) and, under ``rollout_ahead``, the
        batches already sampled for steps ``step …`` (settled), each with its samples' ages
        (versions behind the current weights), so that a resumed run trains on the same data.
        A batch that does not pickle (an environment's episode objects), or that is still being
        sampled (syncs that do not wait, ``overlap``), is listed under ``regenerate`` instead: a
        resumed run samples it again from the checkpoint's weights."""
        batches, regenerate = {}, []
        for s, f in sorted(self.futures.items()):
            if s < step or s > step + self.k - 1:
                continue
            if not f.done():  # in flight across the last sync (overlap): sampled again after a resume
                regenerate.append(s)
                continue
            rollouts, produced_at = f.result()
            ages = self.backend.version - sample_versions(rollouts, produced_at)
            try:
                pickle.dumps(rollouts)
            except Exception:
                regenerate.append(s)
                continue
            batches[s] = {"rollouts": rollouts, "ages": ages}
        return {**self.stage.state_dict(step), "rollout_ahead": {"max_staleness": self.k, "batches": batches, "regenerate": regenerate}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Set back :meth:`state_dict`: the stage's part, then the batches sampled ahead, their
        versions rebased on this process's weight counter (the checkpoint's weights were just synced)."""
        self.stage.load_state_dict(state)
        state = state.get("rollout_ahead") or {}
        for s, item in state.get("batches", {}).items():
            rollouts, ages = item["rollouts"], item["ages"]
            versions = self.backend.version - ages
            rollouts = attrs.evolve(rollouts, episodes=[
                attrs.evolve(e, completion=attrs.evolve(e.completion, weight_version=str(int(v))))
                for e, v in zip(rollouts.episodes, versions.tolist())
            ])
            future: concurrent.futures.Future = concurrent.futures.Future()
            future.set_result((rollouts, self.backend.version))
            self.futures[int(s)] = future
        self.regenerated = set(state.get("regenerate", []))

    def close(self) -> None:
        for f in self.futures.values():
            f.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.futures.clear()
        if self._trainer_threads is not None:
            torch.set_num_threads(self._trainer_threads[0])
            self._trainer_threads = None


def _set_threads(n: int | None) -> None:
    if n is not None:
        torch.set_num_threads(n)


def versioned(backend: Any, config: RolloutConfig) -> Any:
    """The run's rollout backend, behind a :class:`VersionedBackend` when batches are sampled
    ahead (``max_staleness > 0``: syncs counted, and never in the middle of a batch)."""
    return VersionedBackend(backend) if config.max_staleness > 0 else backend


def ahead(stage: RolloutStage, *, limit: Callable[[], int], cpu: bool) -> RolloutStage | AsyncRollout:
    """What a run samples from: ``stage`` itself, or with ``max_staleness > 0`` an
    :class:`AsyncRollout` sampling ahead over it (its backend :func:`versioned`)."""
    return AsyncRollout(stage, limit=limit, cpu=cpu) if stage.config.max_staleness > 0 else stage


__all__ = ["AsyncRollout", "VersionedBackend", "ahead", "apply_staleness", "sample_versions", "versioned"]
