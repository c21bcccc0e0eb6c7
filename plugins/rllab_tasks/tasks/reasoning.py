"""``reasoning_gym``: any procedural data set of the ``reasoning-gym`` package, scored by its own
``score_answer`` (offline; needs the ``reasoning`` extra).

``task.dataset`` names the data set (``leg_counting``, ``basic_arithmetic``, ``chain_sum``, ...;
``python -c "import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))"`` lists them)
and ``task.options`` sets its own knobs, as a JSON object (``task.options='{"max_animals": 2}'``).
Entry ``i`` of the ``size`` entries is generated on demand from ``seed`` and ``i``; an entry belongs
to the evaluation split when a salted hash of its question falls below ``eval_fraction``
(:mod:`rllab_tasks.split`).
The reward is ``score_answer(answer=completion, entry=entry)``, in [0, 1]; a score of 1 is solved.
The warm start trains on the entry's answer.

The tiny model learns ``spell_backward`` with ``{"min_word_len": 3, "max_word_len": 5}`` (26.5% →
47.5% held-out accuracy in the default 400 GRPO steps, seed 0) and ``chain_sum`` with
``{"min_terms": 3, "max_terms": 3, "max_digits": 1}`` (25.0% → 41.0%).
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import attrs
import torch

import rllab
from rllab.types import Example

from ..split import eval_fraction_knob, eval_size_knob, in_eval_split, seed_knob


MISSING = "the reasoning_gym task needs the reasoning-gym package: pip install 'rllab[reasoning]'"


def installed() -> None:
    """Refuse, naming the ``pip install``, when reasoning-gym is not installed: asked before a run
    creates anything (:func:`rllab.training.parts.check_installed`)."""
    if importlib.util.find_spec("reasoning_gym") is None:
        raise rllab.MissingExtraError(MISSING)


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise rllab.MissingExtraError(MISSING) from None
    return reasoning_gym


def _options(inst, attribute, value):
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"options = {value!r} is not JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"options = {value!r} must be a JSON object, got {type(parsed).__name__}")


@attrs.frozen
class ReasoningGymConfig:
    """Knobs of the reasoning_gym task."""

    dataset: str = rllab.knob("leg_counting", help="a reasoning-gym data set name")
    options: str = rllab.knob(
        "{}", help='the data set\'s own knobs as a JSON object, e.g. \'{"min_animals": 1, "max_animals": 2}\'',
        validator=_options,
    )
    size: int = rllab.knob(100_000, help="entries the data set defines (training and evaluation together)", ge=2)
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = eval_size_knob()
    seed: int = seed_knob()


class ReasoningGymTask(rllab.SingleTurn):
    """A reasoning-gym data set: its questions as prompts, its ``score_answer`` as the reward.

    Entries are generated on demand (entry ``i`` is a function of ``seed`` and ``i``): the held-out
    split is the first ``eval_size`` eval entries in index order, and training draws uniform
    indices, rejecting eval entries.
    """

    name = "reasoning_gym"
    max_draws = 1 << 16
    """Give up (with an error) after this many candidate entries without filling a request."""

    def __init__(self, config: ReasoningGymConfig):
        self.config = config
        rg = _reasoning_gym()
        known = sorted(rg.factory.DATASETS)
        if config.dataset not in known:
            import difflib

            close = difflib.get_close_matches(config.dataset, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"task 'reasoning_gym': unknown data set {config.dataset!r}.{hint} Known: {', '.join(known)}")
        options = json.loads(config.options)
        try:
            self.data = rg.create_dataset(config.dataset, size=config.size, seed=config.seed, **options)
        except (TypeError, ValueError, AssertionError) as e:
            raise ValueError(f"task 'reasoning_gym': data set {config.dataset!r} refused options {options!r}: {e}") from None
        self._cache: dict[int, Example] = {}
        self.eval: list[Example] = []
        seen: set[str] = set()
        for i in range(min(config.size, self.max_draws)):
            ex = self._entry(i)
            if self._is_eval(ex) and ex.prompt not in seen:
                seen.add(ex.prompt)
                self.eval.append(ex)
                if len(self.eval) == config.eval_size:
                    break
        if not self.eval:
            raise ValueError(f"task 'reasoning_gym': {config.dataset!r} has no evaluation entries; raise size or eval_fraction")

    def _entry(self, i: int) -> Example:
        ex = self._cache.get(i)
        if ex is None:
            entry = self.data[i]
            ex = self._cache[i] = Example(prompt=entry["question"], answer=str(entry["answer"]), meta={"entry": entry, "index": i})
        return ex

    def _is_eval(self, ex: Example) -> bool:
        return in_eval_split(ex.prompt, seed=self.config.seed, eval_fraction=self.config.eval_fraction)

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        """``n`` training entries drawn uniformly (with replacement) using ``rng``; none is held out."""
        out: list[Example] = []
        drawn = 0
        while len(out) < n:
            k = 2 * (n - len(out)) + 8
            for i in torch.randint(0, self.config.size, (k,), generator=rng).tolist():
                ex = self._entry(i)
                if not self._is_eval(ex):
                    out.append(ex)
                    if len(out) == n:
                        break
            drawn += k
            if drawn > self.max_draws:
                raise RuntimeError(f"task 'reasoning_gym': found only {len(out)} of {n} training entries in {drawn} draws")
        return out

    def eval_examples(self) -> list[Example]:
        """The held-out entries, in index order."""
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


reasoning_gym.check_installed = installed
