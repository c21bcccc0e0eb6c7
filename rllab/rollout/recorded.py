"""A rollout that hands out one recorded batch instead of sampling (``rllab replay``).

It has every member of the rollout protocol (:class:`rllab.algorithm.Rollout`): ``sample`` and
``to_batch`` give the recording, and the members that would need a model or a task raise
:class:`rllab.RllabError`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs
import torch

from rllab.errors import RllabError
from rllab.rollout.stage import Rollouts
from rllab.types import Completion, Example, RolloutBatch, SamplingParams


class RecordedRollout:
    """A rollout stage that hands out one recorded :class:`RolloutBatch` instead of sampling.

    ``rllab replay`` puts one in a :class:`rllab.RunContext` (``rollout=``) so that an algorithm's
    own ``step(ctx)`` trains on recorded rollouts: :meth:`sample` gives :class:`Rollouts` with no
    episodes (a recording keeps the batch, not the texts) and the recorded ``metrics``;
    :meth:`to_batch` gives the batch. Anything that would generate (ReMax's greedy baselines,
    evaluation) raises :class:`rllab.RllabError`.
    """

    def __init__(self, *, batch: RolloutBatch, metrics: Mapping[str, float] | None = None,
                 component_weights: Sequence[float] | None = None):
        self.batch = batch
        self.metrics = dict(metrics or {})
        self._weights = None if component_weights is None else [float(w) for w in component_weights]

    def component_weights(self) -> list[float] | None:
        """The recorded task's ``reward_weights`` (None: not given: the batch's own, else all 1), as
        :meth:`RolloutStage.component_weights`."""
        return None if self._weights is None else list(self._weights)

    def sample(self, step: int, **_: Any) -> Rollouts:
        return Rollouts(examples=[], episodes=[], metrics=dict(self.metrics))

    def to_batch(self, rollouts: Rollouts) -> RolloutBatch:
        """The recorded batch, carrying ``component_weights`` when they were given (they win over
        the batch's own ``reward_component_weights``)."""
        if self._weights is None or self.batch.reward_components is None:
            return self.batch
        return attrs.evolve(self.batch, reward_component_weights=self._weights)

    def _cannot(self, what: str):
        raise RllabError(f"a recorded rollout cannot {what}: it holds one batch and no model to sample from")

    def greedy_rewards(self, examples: Sequence[Example]) -> torch.Tensor:
        self._cannot("sample greedy baselines (an estimator that requires reward_baselines)")

    def generate(self, examples: Sequence[Example], params: SamplingParams):
        self._cannot("generate")

    def play(self, examples: Sequence[Example], params: SamplingParams):
        self._cannot("play episodes")

    def evaluate(self, size: int, *, samples: int = 0) -> dict:
        self._cannot("evaluate")

    @property
    def task(self) -> Any:
        self._cannot("give its task (it keeps no examples)")

    @property
    def tokenizer(self) -> Any:
        self._cannot("give a tokenizer")

    def sampling_params(self, step: int, *, n: int, greedy: bool = False) -> SamplingParams:
        self._cannot("give sampling parameters")

    def score_components(self, examples: Sequence[Example], completions: Sequence[Completion]) -> tuple:
        self._cannot("score completions")

    def solved(self, example: Example, reward: float, components: Sequence[float] | None = None) -> bool:
        self._cannot("tell whether an answer is solved")

    def encode(self, prompt: Any) -> list[int]:
        self._cannot("encode a prompt")

    def response_ids(self, text: str, *, prompt: Any = None) -> list[int]:
        self._cannot("encode a response")
