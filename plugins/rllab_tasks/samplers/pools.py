"""Built-in prompt samplers (``[sampler]``, :mod:`rllab.sampling`): which examples a step trains on.

``default``
    The task's own draw: ``source(n, rng)`` with the step's generator, exactly what a run without
    a sampler does. Keeps nothing.

``difficulty_pool``
    A curriculum over a fixed pool of prompts, after prime-rl's difficulty pools. At its first
    draw it takes ``pool_size`` examples from the task (with a generator seeded from the first
    step's) and then draws every step's prompts from that pool. Each prompt sits in one of three
    pools by its latest mean group reward ``m`` (fed back after each step)::

        hard    m ≤ hard_threshold                      weight hard_weight   (default 0.25, 0.2)
        normal  hard_threshold < m ≤ easy_threshold     weight normal_weight (default 0.75, 1.0)
        easy    m > easy_threshold                      weight easy_weight   (default 0.2)

    A prompt not yet seen counts as normal. A step draws its ``n`` prompts from the pool without
    replacement, each with probability proportional to its pool's weight (with replacement only
    when fewer than ``n`` prompts have a weight above 0). So prompts the policy always or never
    solves (whose groups have no spread of rewards, and no advantage under a group baseline) come
    up less often, and those it sometimes solves more. Logged: ``sampler/pool_hard``,
    ``sampler/pool_normal``, ``sampler/pool_easy`` (prompts in each), ``sampler/pool_seen`` and
    ``sampler/drawn_hard`` / ``_normal`` / ``_easy`` (the last step's prompts by pool).

``advantage_gate``
    DAPO's dynamic sampling as a sampler: it draws as ``default`` does, and declares
    ``gate_retries = max_retries``, so the rollout stage replaces each group whose scores are all
    equal with a new prompt's group, for at most ``max_retries`` rounds (:mod:`rllab.rollout.gate`).
    Groups still flat after the last round stay in the step (advantage 0 under a group baseline);
    with ``rollout.dynamic_sampling = true`` they are dropped instead. Logged:
    ``sampler/gate_flat``, ``sampler/gate_replaced``, ``sampler/gate_left``, ``sampler/gate_rounds``,
    ``sampler/gate_prompts``.

``reasoning_gym_curriculum``
    reasoning-gym's curricula as a sampler (:mod:`rllab_tasks.samplers.curriculum`).

The pool's state (its seed and each prompt's latest mean reward) is saved in the run's
checkpoints: a resumed run draws what the uninterrupted one would.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import attrs
import torch

import rllab
from rllab.rollout.chat import prompt_key
from rllab.sampling import Sampler, Source
from rllab.types import Example

POOLS = ("hard", "normal", "easy")


class DefaultSampler(Sampler):
    """The task's own draw (what a run without a [sampler] section does)."""

    def __init__(self, *, config: Any = None):
        self.config = config

    def draw(self, *, n: int, rng: torch.Generator, step: int, source: Source) -> list[Example]:
        return source(n, rng)


def default(*, config: Any) -> DefaultSampler:
    """The task's own draw: the step's prompts exactly as a run without a sampler draws them."""
    return DefaultSampler(config=config)


@attrs.frozen
class DifficultyPoolConfig:
    """Knobs of the difficulty_pool sampler."""

    pool_size: int = rllab.knob(256, help="prompts in the pool, drawn once from the task at the first step", ge=1, le=1_000_000)
    hard_threshold: float = rllab.knob(0.25, help="a prompt whose latest mean reward is ≤ this is hard (in the task's reward units)")
    easy_threshold: float = rllab.knob(0.75, help="a prompt whose latest mean reward is > this is easy (≥ hard_threshold)")
    hard_weight: float = rllab.knob(0.2, help="sampling weight of each hard prompt", ge=0.0)
    normal_weight: float = rllab.knob(1.0, help="sampling weight of each normal (and not yet seen) prompt", ge=0.0)
    easy_weight: float = rllab.knob(0.2, help="sampling weight of each easy prompt", ge=0.0)

    def __attrs_post_init__(self):
        for name in ("hard_threshold", "easy_threshold"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"{name} = {value!r} must be a finite reward")
        if self.hard_weight + self.normal_weight + self.easy_weight <= 0:
            raise ValueError("hard_weight, normal_weight and easy_weight are all 0: no prompt could be drawn; give one a weight > 0")
        if self.hard_threshold > self.easy_threshold:
            raise ValueError(f"hard_threshold = {self.hard_threshold!r} is above easy_threshold = {self.easy_threshold!r}; "
                             f"the thresholds must be in order (hard ≤ easy)")


def pool_of(mean: float | None, config: DifficultyPoolConfig) -> str:
    """``"hard"``, ``"normal"`` or ``"easy"`` for a prompt's latest mean reward (None: not seen, normal)."""
    if mean is None:
        return "normal"
    if mean <= config.hard_threshold:
        return "hard"
    return "normal" if mean <= config.easy_threshold else "easy"


class DifficultyPool(Sampler):
    """Easy / normal / hard pools by each prompt's latest mean group reward (see the module docstring)."""

    def __init__(self, *, config: DifficultyPoolConfig):
        self.config = config
        self.pool_seed: int | None = None
        """Seeds the generator the pool is drawn with (from the first step's); None before the first draw."""
        self.means: list[float | None] = [None] * config.pool_size
        """Each pool prompt's latest mean group reward (None: not seen yet)."""
        self._pool: list[Example] | None = None
        self._index: dict[str, list[int]] = {}
        self._drawn: dict[str, int] = {}

    def _build(self, source: Source) -> None:
        self._pool = list(source(self.config.pool_size, torch.Generator().manual_seed(self.pool_seed)))
        if len(self._pool) != self.config.pool_size:
            raise ValueError(f"difficulty_pool: the task gave {len(self._pool)} examples for a pool of {self.config.pool_size}")
        self._index = {}
        for i, ex in enumerate(self._pool):
            self._index.setdefault(prompt_key(ex.prompt), []).append(i)

    def weights(self) -> torch.Tensor:
        """(pool_size,) float64: each pool prompt's sampling weight, by its pool."""
        w = {"hard": self.config.hard_weight, "normal": self.config.normal_weight, "easy": self.config.easy_weight}
        return torch.tensor([w[pool_of(m, self.config)] for m in self.means], dtype=torch.float64)

    def draw(self, *, n: int, rng: torch.Generator, step: int, source: Source) -> list[Example]:
        if self.pool_seed is None:
            self.pool_seed = int(torch.randint(0, 2**62, (1,), generator=rng).item())
        if self._pool is None:
            self._build(source)
        w = self.weights()
        if not (w > 0).any():  # every prompt sits in pools of weight 0
            w = torch.ones_like(w)
        picks = torch.multinomial(w, n, replacement=int((w > 0).sum()) < n, generator=rng).tolist()
        self._drawn = {p: 0 for p in POOLS}
        for i in picks:
            self._drawn[pool_of(self.means[i], self.config)] += 1
        return [self._pool[i] for i in picks]

    def feedback(self, *, step: int, examples: Sequence[Example], rewards: Sequence[float | None]) -> None:
        """Each prompt of the pool among ``examples`` moves to the pool of its new mean reward
        (a prompt whose every sample failed keeps its last one)."""
        for ex, mean in zip(examples, rewards):
            if mean is None:
                continue
            for i in self._index.get(prompt_key(ex.prompt), ()):
                self.means[i] = float(mean)

    def counts(self) -> dict[str, int]:
        """Prompts in each pool now."""
        out = {p: 0 for p in POOLS}
        for m in self.means:
            out[pool_of(m, self.config)] += 1
        return out

    def metrics(self) -> dict[str, float]:
        out = {f"sampler/pool_{p}": float(c) for p, c in self.counts().items()}
        out["sampler/pool_seen"] = float(sum(m is not None for m in self.means))
        out.update({f"sampler/drawn_{p}": float(c) for p, c in self._drawn.items()})
        return out

    def state_dict(self) -> dict:
        return {"pool_seed": self.pool_seed, "means": list(self.means), "pool_size": self.config.pool_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("pool_size") != self.config.pool_size:
            raise ValueError(f"difficulty_pool: the checkpoint's pool has {state.get('pool_size')} prompts, the config "
                             f"{self.config.pool_size}; resume with sampler.pool_size={state.get('pool_size')}")
        self.pool_seed = state["pool_seed"]
        self.means = list(state["means"])
        self._pool = None  # drawn again from the seed at the next draw: the same prompts


def difficulty_pool(*, config: DifficultyPoolConfig) -> DifficultyPool:
    """Easy / normal / hard pools by each prompt's latest mean reward, sampled by pool weight (prime-rl)."""
    return DifficultyPool(config=config)


@attrs.frozen
class AdvantageGateConfig:
    """Knobs of the advantage_gate sampler."""

    max_retries: int = rllab.knob(
        2, help="rounds of replacement prompts for groups whose scores are all equal; what is still flat after them stays "
        "in the step (dropped with rollout.dynamic_sampling = true)", ge=1, le=64)


class AdvantageGate(DefaultSampler):
    """The task's own draw; the stage replaces flat groups (the ``gate_retries`` trait)."""


def advantage_gate(*, config: AdvantageGateConfig) -> AdvantageGate:
    """DAPO's dynamic sampling: groups whose scores are all equal replaced by new prompts' (bounded rounds)."""
    return AdvantageGate(config=config)


def register(register_fn) -> None:
    """Register the built-in samplers with a ``register_samplers`` hook's ``register``."""
    register_fn("default", default, stateless=True)
    register_fn("difficulty_pool", difficulty_pool, config=DifficultyPoolConfig)
    register_fn("advantage_gate", advantage_gate, config=AdvantageGateConfig, stateless=True,
                gate_retries=lambda config: config.max_retries)
    from .curriculum import CurriculumConfig, reasoning_gym_curriculum

    register_fn("reasoning_gym_curriculum", reasoning_gym_curriculum, config=CurriculumConfig)
