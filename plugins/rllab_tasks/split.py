"""The held-out split every built-in task shares.

An instance belongs to the evaluation split when a hash of its prompt, salted with the task's
``seed`` knob, falls below ``eval_fraction``::

    is_eval(prompt) = blake2b(f"{seed}\\0{prompt}") / 2**64 < eval_fraction

:class:`SplitTask` draws training instances with the generator it is given and rejects eval
instances, so the two splits are disjoint whatever the number of draws; its eval list is drawn
with a generator seeded from ``seed`` (the first ``eval_size`` distinct eval instances).
"""

from __future__ import annotations

import hashlib
import itertools

import torch

import rllab
from rllab.rollout.chat import prompt_key
from rllab.types import Example


def in_eval_split(prompt: str | tuple, *, seed: int, eval_fraction: float) -> bool:
    """Whether ``prompt`` belongs to the held-out split (a salted hash below ``eval_fraction``).
    Chat messages are hashed as their canonical JSON (:func:`rllab.rollout.chat.prompt_key`)."""
    digest = hashlib.blake2b(f"{seed}\0{prompt_key(prompt)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < eval_fraction


def train_seeds(n: int, rng: torch.Generator, *, held_out, max_draws: int, who: str) -> list[int]:
    """``n`` episode seeds drawn uniformly from ``[0, 2**31)`` with ``rng``, none of them
    ``held_out(seed)`` (the environments whose examples are seeds: textarena, gem, openenv).
    Gives up after ``max_draws`` candidates, naming ``who``."""
    seeds: list[int] = []
    drawn = 0
    while len(seeds) < n:
        k = 2 * (n - len(seeds)) + 8
        seeds += [s for s in torch.randint(0, 2**31, (k,), generator=rng).tolist() if not held_out(s)]
        drawn += k
        if drawn > max_draws and len(seeds) < n:
            raise RuntimeError(f"{who}: found only {len(seeds)} of {n} training seeds in {drawn} draws")
    return seeds[:n]


def eval_seeds(*, held_out, size: int, max_draws: int) -> list[int]:
    """The first ``size`` held-out seeds counting up from 0 (fixed for a config)."""
    return list(itertools.islice((s for s in range(max_draws) if held_out(s)), size))


class SeededExamples:
    """The examples of an environment whose example is an episode seed (textarena, gem, openenv):
    a seed is held out by the shared hash split of its decimal string, training seeds are drawn
    with the run's generator (:func:`train_seeds`), the eval list is the first ``eval_size``
    held-out seeds (:func:`eval_seeds`). A subclass sets ``name`` and ``_eval = None`` and defines
    ``example(seed)``; its config has ``seed``, ``eval_fraction`` and ``eval_size``."""

    name = ""
    max_draws = 1 << 16
    """Give up (with an error) after this many candidate seeds without filling a request."""

    def _is_eval(self, seed: int) -> bool:
        return in_eval_split(str(seed), seed=self.config.seed, eval_fraction=self.config.eval_fraction)

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        """``n`` seeds drawn uniformly from ``[0, 2**31)`` with ``rng``, none held out."""
        seeds = train_seeds(n, rng, held_out=self._is_eval, max_draws=self.max_draws, who=f"environment {self.name!r}")
        return [self.example(s) for s in seeds]

    def eval_examples(self) -> list[Example]:
        """The first ``eval_size`` held-out seeds counting up from 0 (fixed for a config)."""
        if self._eval is None:
            seeds = eval_seeds(held_out=self._is_eval, size=self.config.eval_size, max_draws=self.max_draws)
            self._eval = [self.example(s) for s in seeds]
        return list(self._eval)


class SplitTask:
    """Shared machinery: hash split, rejection sampling of training draws, a fixed eval list.

    Subclasses set ``name`` and implement ``draw(gen, k) -> list[Example]`` (``k`` candidate
    instances drawn with ``gen``), ``reward`` and, if the answer is not the demonstration,
    ``demonstration``. The config must have ``seed``, ``eval_fraction`` and ``eval_size``.
    """

    name = ""
    max_draws = 1 << 20
    """Give up (with an error) after this many candidate draws without filling a request."""

    def __init__(self, config):
        self.config = config
        self._eval: list[Example] | None = None

    def draw(self, gen: torch.Generator, k: int) -> list[Example]:
        raise TypeError(f"{type(self).__name__} must define draw(gen, k)")

    def is_eval(self, example: Example) -> bool:
        return in_eval_split(example.prompt, seed=self.config.seed, eval_fraction=self.config.eval_fraction)

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        """``n`` training instances (with replacement), drawn with ``rng``; none is in the eval split."""
        out: list[Example] = []
        drawn = 0
        while len(out) < n:
            k = max(2 * (n - len(out)), 16)
            for ex in self.draw(rng, k):
                if not self.is_eval(ex):
                    out.append(ex)
                    if len(out) == n:
                        break
            drawn += k
            if drawn > self.max_draws:
                raise RuntimeError(
                    f"task {self.name!r}: found only {len(out)} of {n} training instances in {drawn} draws; "
                    f"the training split is (nearly) empty — lower eval_fraction or enlarge the task"
                )
        return out

    def eval_examples(self) -> list[Example]:
        """The held-out split: up to ``eval_size`` distinct eval instances, in a fixed order."""
        if self._eval is None:
            gen = torch.Generator().manual_seed(self.config.seed)
            seen: set[str] = set()
            out: list[Example] = []
            drawn = 0
            while len(out) < self.config.eval_size and drawn < self.max_draws:
                before = len(out)
                for ex in self.draw(gen, 1024):
                    key = prompt_key(ex.prompt)
                    if key not in seen and self.is_eval(ex):
                        seen.add(key)
                        out.append(ex)
                        if len(out) == self.config.eval_size:
                            break
                drawn += 1024
                if len(out) == before:  # a whole batch found nothing new: the split is exhausted
                    break
            self._eval = out
        return list(self._eval)

    def demonstration(self, example: Example) -> str:
        """A correct completion: the reference answer."""
        return example.answer

    def __repr__(self):
        return f"<task {self.name!r} {self.config!r}>"


def eval_fraction_knob():
    return rllab.knob(0.1, help="share of the instance space held out for evaluation", gt=0.0, lt=1.0)


def eval_size_knob():
    return rllab.knob(200, help="held-out instances returned by eval_examples()", ge=1)


def seed_knob():
    return rllab.knob(0, help="salts the train/eval hash split and seeds the eval draw")
