"""``reasoning_gym_curriculum``: a sampler that raises a reasoning-gym data set's difficulty as the
policy masters it (reasoning-gym's curricula: ``create_curriculum``, ``increment_attr_level``).

It is the sampler of a run whose task is ``reasoning_gym``: the task's own draws tell it the data
set (their entries' ``source_dataset``), and the task scores what it draws with that data set's
``score_answer``. It starts every curriculum attribute at its lowest level (reasoning-gym's
``generate_configuration``) and draws each step's entries uniformly from ``size`` entries of the
data set at the current levels. After each step it records the step's mean reward (the mean over
prompts of each prompt's mean group reward); once the last ``window`` steps average at least
``promote_at``, it raises the next attribute's level (round robin over ``attributes``, skipping
those at their top level), forgets the window and draws from the harder data set from the next
step on. The held-out evaluation stays the task's (its fixed configuration).

Entries in the held-out split are rejected as the task rejects them: by the salted hash of the
question, with ``split_seed`` and ``eval_fraction``, which must be the task's ``seed`` and
``eval_fraction`` (their defaults are). Logged: ``sampler/level_<attribute>`` and
``sampler/window_reward`` (the mean over the current window).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import attrs
import torch

import rllab
from rllab.errors import SamplerSourceError
from rllab.sampling import Sampler, Source
from rllab.types import Example

from ..tasks.reasoning import _reasoning_gym
from ..split import eval_fraction_knob, in_eval_split, seed_knob


@attrs.frozen
class CurriculumConfig:
    """Knobs of the reasoning_gym_curriculum sampler."""

    attributes: rllab.StrOrStrs = rllab.knob((), help="the curriculum attributes to raise, in turn; empty: all of the data set's")
    promote_at: float = rllab.knob(0.7, help="raise a level once the mean reward of the last `window` steps is at least this",
                                   ge=0.0)
    window: int = rllab.knob(4, help="steps whose mean reward decides a promotion", ge=1, le=10_000)
    size: int = rllab.knob(100_000, help="entries of the data set at each level, drawn uniformly", ge=1)
    data_seed: int = rllab.knob(0, help="seeds the data set at each level (with the number of promotions so far)")
    split_seed: int = seed_knob()
    eval_fraction: float = eval_fraction_knob()


class Curriculum(Sampler):
    """Levels of a reasoning-gym curriculum raised by the step's mean reward (module docstring)."""

    max_draws = 1 << 16

    def __init__(self, *, config: CurriculumConfig):
        self.config = config
        self.dataset: str | None = None
        self.levels: dict[str, int] = {}
        self.window: list[float] = []
        self.promotions = 0
        self.turn = 0
        self._curriculum: Any = None
        self._data: Any = None

    # -- the data set at the current levels

    def _attach(self, source: Source) -> None:
        probe = source(1, torch.Generator().manual_seed(0))
        entry = probe[0].meta.get("entry") if probe else None
        name = entry.get("metadata", {}).get("source_dataset") if isinstance(entry, dict) else None
        if name is None:
            raise SamplerSourceError("sampler 'reasoning_gym_curriculum' draws reasoning-gym entries for a reasoning_gym task, "
                                     "but the run's examples carry no reasoning-gym entry; use task = \"reasoning_gym\"")
        factory = _reasoning_gym().factory
        if not factory.has_curriculum(name):
            raise ValueError(f"sampler 'reasoning_gym_curriculum': reasoning-gym has no curriculum for data set {name!r}")
        self._curriculum = factory.create_curriculum(name)
        known = list(self._curriculum.attributes)
        wanted = [self.config.attributes] if isinstance(self.config.attributes, str) else list(self.config.attributes)
        unknown = [a for a in wanted if a not in known]
        if unknown:
            raise ValueError(f"sampler 'reasoning_gym_curriculum': attributes = {unknown} are not curriculum attributes of "
                             f"{name!r}; its attributes: {', '.join(known)}")
        if self.dataset is None:  # a new run: every attribute at its lowest level
            self.dataset, self.levels = name, {a: 0 for a in (wanted or known)}
        elif self.dataset != name:
            raise ValueError(f"sampler 'reasoning_gym_curriculum': the checkpoint's data set is {self.dataset!r}, the task's {name!r}")
        for attr, level in self.levels.items():
            self._curriculum.set_attr_level(attr, level)
        self._build()

    def _build(self) -> None:
        cfg = self._curriculum.generate_configuration({"seed": self.config.data_seed + self.promotions, "size": self.config.size})
        self._data = _reasoning_gym().create_dataset(self.dataset, **dataclasses.asdict(cfg))

    def draw(self, *, n: int, rng: torch.Generator, step: int, source: Source) -> list[Example]:
        if self._data is None:
            self._attach(source)
        out: list[Example] = []
        drawn = 0
        while len(out) < n:
            k = 2 * (n - len(out)) + 8
            for i in torch.randint(0, self.config.size, (k,), generator=rng).tolist():
                entry = self._data[i]
                if not in_eval_split(entry["question"], seed=self.config.split_seed, eval_fraction=self.config.eval_fraction):
                    out.append(Example(prompt=entry["question"], answer=str(entry["answer"]), meta={"entry": entry, "index": i}))
                    if len(out) == n:
                        break
            drawn += k
            if drawn > self.max_draws:
                raise RuntimeError(f"sampler 'reasoning_gym_curriculum': found only {len(out)} of {n} training entries in {drawn} draws")
        return out

    # -- feedback: promotions

    def feedback(self, *, step: int, examples: Sequence[Example], rewards: Sequence[float | None]) -> None:
        scored = [r for r in rewards if r is not None]
        if not scored:
            return
        self.window = (self.window + [sum(scored) / len(scored)])[-self.config.window:]
        if len(self.window) == self.config.window and sum(self.window) / len(self.window) >= self.config.promote_at:
            self._promote()

    def _promote(self) -> None:
        attrs_ = list(self.levels)
        for k in range(len(attrs_)):
            attr = attrs_[(self.turn + k) % len(attrs_)]
            if self._curriculum.increment_attr_level(attr):
                self.levels[attr] = self._curriculum.get_attr_level(attr)
                self.turn = (self.turn + k + 1) % len(attrs_)
                self.promotions += 1
                self.window = []
                self._build()
                return
        # every attribute at its top level: stay there

    def metrics(self) -> dict[str, float]:
        out = {f"sampler/level_{a}": float(v) for a, v in self.levels.items()}
        if self.window:
            out["sampler/window_reward"] = sum(self.window) / len(self.window)
        return out

    def state_dict(self) -> dict:
        return {"dataset": self.dataset, "levels": dict(self.levels), "window": list(self.window),
                "promotions": self.promotions, "turn": self.turn}

    def load_state_dict(self, state: dict) -> None:
        self.dataset, self.levels = state["dataset"], dict(state["levels"])
        self.window, self.promotions, self.turn = list(state["window"]), state["promotions"], state["turn"]
        self._data = None  # rebuilt at the next draw, at the saved levels


def reasoning_gym_curriculum(*, config: CurriculumConfig) -> Curriculum:
    """A reasoning-gym curriculum: the data set's levels raised as the step's mean reward reaches promote_at."""
    return Curriculum(config=config)
