"""What an episode is, for everything that reads one: the limits of a step's episodes
(:class:`EpisodeLimits`), one finished episode (:class:`EpisodeResult`) and why it ended
(:data:`FINISH_REASONS`). The loop that plays them is :mod:`rllab.rollout.episodes`, which
publishes these names too."""

from __future__ import annotations

from typing import Any

import attrs

from rllab.errors import ConfigError
from rllab.members import member
from rllab.settings import RolloutConfig
from rllab.types import Completion, Example

FINISH_REASONS = ("stop", "length", "max_turns", "overflow", "abort")
"""Why an episode ended: the environment ended it after a turn that stopped on a stop token
(``stop``) or ran out of ``max_new_tokens`` (``length``); the turn limit (``max_turns``); the
token budget (``overflow``); the backend gave up or the environment failed (``abort``)."""


@attrs.frozen(kw_only=True)
class EpisodeLimits:
    """The limits of one step's episodes (from ``[rollout]``, see :class:`rllab.settings.RolloutConfig`)."""

    max_turns: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    max_new_tokens: int = attrs.field(default=32, validator=attrs.validators.ge(1))
    """Each turn's cap."""
    max_episode_tokens: int | None = None
    """Budget of response-side tokens (model + observation); None: none."""
    context_tokens: int | None = None
    """The model's context (prompt + response tokens); an episode's budget is at most what its
    prompt leaves of it. None: not bounded."""
    turn_limit_reward: float = 0.0
    overflow_reward: float = 0.0

    @classmethod
    def of(cls, env: Any, rollout: RolloutConfig, *, name: str, context_tokens: int | None = None) -> EpisodeLimits:
        """The limits of ``env``'s episodes under ``rollout`` (a ``[rollout]`` config): its
        ``max_turns`` (``rollout.max_turns`` overrides it; a task's is 1), the token limits, and
        the model's context (``context_tokens``: an episode that would outgrow it ends with
        "overflow"). ``name`` is the environment's, for the error of a missing turn bound."""
        r = rollout
        turns = r.max_turns
        if turns is None:
            turns = member(env, "environment", "max_turns")
            if turns is None or isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
                raise ConfigError(
                    f"environment {name!r} has max_turns = {turns!r}: an episode needs a bound on its turns; give "
                    f"the environment an integer max_turns ≥ 1 or set rollout.max_turns",
                    key="max_turns",
                )
        return cls(
            max_turns=turns, max_new_tokens=r.max_new_tokens, max_episode_tokens=r.max_episode_tokens,
            turn_limit_reward=r.turn_limit_reward, overflow_reward=r.overflow_reward,
            context_tokens=context_tokens,
        )


@attrs.frozen(kw_only=True, eq=False)
class EpisodeResult:
    """One finished episode.

    ``completion`` is the whole episode as one :class:`~rllab.types.Completion`: its
    ``prompt_ids`` the opening prompt's, its ``token_ids`` every response-side token (turns and
    observations), ``model_mask`` (None for an episode of one turn) and ``log_probs`` (0 on
    observation tokens), ``prompt_index`` the example's index and ``finish_reason`` the episode's.
    """

    example: Example
    completion: Completion
    token_rewards: tuple[float, ...]
    """One reward per entry of ``completion.token_ids``: each turn's reward (and a limit's) on its
    last model token, 0 elsewhere."""
    reward: float
    """The episode's total reward (0 for an episode that failed)."""
    score: tuple[float, ...] = ()
    """Its reward components in the declared order (``task.reward_components``: a task's episode,
    from its step's ``Step.score``); empty with one reward, and for an episode that failed."""
    shaping: float = 0.0
    """Added to ``reward`` for training (DAPO's overlong penalty; float32), on its last model token."""
    keep: bool = True
    """False: dropped from the step's batch (``reward_errors = "skip"``, dynamic sampling, too stale)."""
    staleness: int | None = None
    """Weight versions between its sampler and the trainer that takes it (asynchronous
    rollouts, :mod:`rllab.rollout.asynchronous`); None: synchronous."""
    turns: int = 1
    token_versions: tuple[int, ...] | None = None
    """Partial rollouts (:mod:`rllab.rollout.partial`): the step whose weights sampled each entry of
    ``completion.token_ids``; None: all of them the step's own."""
    texts: tuple[str, ...] = ()
    """Each model turn's decoded text (up to its first stop token)."""
    metrics: dict = attrs.Factory(dict)
    """Its steps' ``Step.metrics``, summed."""
    observation_tokens: int = 0
    error: str | None = None
    """The failure's message when the environment failed (finish reason ``"abort"``)."""
    episode: Any = None
    """The environment's episode object."""

    @property
    def finish_reason(self) -> str:
        return self.completion.finish_reason
