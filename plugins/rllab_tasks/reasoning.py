"""``reasoning_gym``: any procedural data set of the ``reasoning-gym`` package, scored by its own
``score_answer`` (offline; needs the ``reasoning`` extra).

``task.dataset`` names the data set (``leg_counting``, ``basic_arithmetic``, ``chain_sum``, ...;
``python -c "import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))"`` lists them)
and ``task.options`` sets its own knobs (a table: ``task.options = {min_terms = 2}``). The data set
is generated once with ``size`` entries from ``seed``; an entry belongs to the evaluation split
when a salted hash of its question falls below ``eval_fraction`` (:mod:`rllab_tasks.split`).
The reward is ``score_answer(answer=completion, entry=entry)``, in [0, 1]; a score of 1 is solved.
The warm start trains on the entry's answer.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

import rllab
from rllab.types import Example

from .split import eval_fraction_knob, in_eval_split, seed_knob


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError("the reasoning_gym task needs the reasoning-gym package: pip install 'rllab[reasoning]'") from None
    return reasoning_gym


@attrs.frozen
class ReasoningGymConfig:
    """Knobs of the reasoning_gym task."""

    dataset: str = rllab.knob("leg_counting", help="a reasoning-gym data set name")
    options: dict = rllab.knob(factory=dict, help="the data set's own configuration knobs (a table)")
    size: int = rllab.knob(10_000, help="entries generated (training and evaluation together)", ge=2)
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = rllab.knob(200, help="at most this many held-out entries", ge=1)
    seed: int = seed_knob()


class ReasoningGymTask:
    """A reasoning-gym data set: its questions as prompts, its ``score_answer`` as the reward."""

    name = "reasoning_gym"

    def __init__(self, config: ReasoningGymConfig):
        self.config = config
        rg = _reasoning_gym()
        known = sorted(rg.factory.DATASETS)
        if config.dataset not in known:
            import difflib

            close = difflib.get_close_matches(config.dataset, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"task 'reasoning_gym': unknown data set {config.dataset!r}.{hint} Known: {', '.join(known)}")
        try:
            self.data = rg.create_dataset(config.dataset, size=config.size, seed=config.seed, **dict(config.options))
        except (TypeError, ValueError, AssertionError) as e:
            raise ValueError(f"task 'reasoning_gym': data set {config.dataset!r} refused options {dict(config.options)!r}: {e}") from None
        self.train: list[Example] = []
        self.eval: list[Example] = []
        seen: set[str] = set()
        for i in range(config.size):
            entry = self.data[i]
            ex = Example(prompt=entry["question"], answer=str(entry["answer"]), meta={"entry": entry, "index": i})
            if in_eval_split(ex.prompt, seed=config.seed, eval_fraction=config.eval_fraction):
                if ex.prompt not in seen and len(self.eval) < config.eval_size:
                    seen.add(ex.prompt)
                    self.eval.append(ex)
            else:
                self.train.append(ex)
        if not self.train or not self.eval:
            raise ValueError(
                f"task 'reasoning_gym': {config.dataset!r} with size {config.size} gave {len(self.train)} training and "
                f"{len(self.eval)} evaluation entries; raise size or change eval_fraction"
            )

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        """``n`` training entries drawn uniformly with replacement using ``rng``."""
        idx = torch.randint(0, len(self.train), (n,), generator=rng).tolist()
        return [self.train[i] for i in idx]

    def eval_examples(self) -> list[Example]:
        """The held-out entries, in generation order."""
        return list(self.eval)

    def reward(self, example: Example, completion: str) -> float:
        """The data set's own ``score_answer`` of the stripped completion."""
        score: Any = self.data.score_answer(answer=completion.strip(), entry=example.meta["entry"])
        return float(score)

    def demonstration(self, example: Example) -> str:
        """The entry's reference answer."""
        return example.answer

    def __repr__(self):
        return f"<task {self.name!r} {self.config!r}>"


def reasoning_gym(*, config: ReasoningGymConfig) -> ReasoningGymTask:
    """A reasoning-gym procedural data set by name (leg_counting, chain_sum, ...), scored by its own score_answer."""
    return ReasoningGymTask(config)
