"""What a step's episodes add up to: their counters, and whether there was anything to learn from.

:func:`episode_metrics` gives an environment's per-step counters (``env/…``).

Under ``rollout.reward_errors = "skip"`` or ``"zero"`` a reward function (or an environment's
step) that raises drops its sample's group or scores it 0, so that a run continues past the
occasional failure. A reward that *always* fails would then train on nothing (or on zeros) and
end with a flat "0.0% → 0.0%" that looks like a result; an environment whose every episode
outgrows its token budget (finish reason ``"overflow"``) likewise. :func:`check_step` stops the
run on such a step with an error naming the cause — the task or environment and its first error
message, or the budget settings — and returns the step's failure shares
(``rollout/error_frac``, ``rollout/overflow_frac``), which a listener reads to say once when
*most* of a step failed.
"""

from __future__ import annotations

from typing import Any, Sequence

from rllab.errors import ConfigError, RewardError

ERROR_ADVICE = (
    "Fix the reward function (or environment) first. rollout.reward_errors = \"skip\" or \"zero\" "
    "only carries a run past occasional failures; a step whose every sample fails stops the run anyway."
)
"""What a failed reward's or environment's error message ends with under ``reward_errors = "raise"``."""


def budget_text(limits: Any) -> str:
    """The token budget of an episode, in settings: ``rollout.max_episode_tokens`` and the model's context."""
    parts = [f"rollout.max_episode_tokens = {getattr(limits, 'max_episode_tokens', None)!r}"]
    context = getattr(limits, "context_tokens", None)
    if context is not None:
        parts.append(f"the model's context of {context} tokens (less the prompt)")
    parts.append(f"rollout.max_new_tokens = {getattr(limits, 'max_new_tokens', None)!r} per turn")
    return ", ".join(parts)


def _budget_fix(limits: Any) -> str:
    """What to change when every episode overflowed: the setting that bounds them, else the context."""
    room = "or make the environment's observations shorter (or its episodes end sooner: rollout.max_turns)."
    if getattr(limits, "max_episode_tokens", None) is not None:
        return f"Raise rollout.max_episode_tokens (or unset it), {room}"
    return f"The model's context bounds them: use a model with a longer context, {room}"


def check_step(episodes: Sequence[Any], *, kind: str, name: str, policy: str, limits: Any, total: Any = None,
               failure: type[RewardError] = RewardError, culprit: str = "reward function") -> dict[str, float]:
    """The step's failure shares; raises when none of its ``episodes`` gave anything to learn from.

    :param episodes: the step's :class:`rllab.rollout.episodes.EpisodeResult` (``error`` set on a failed
        sample, ``finish_reason`` ``"overflow"`` on one that outgrew its token budget).
    :param kind: ``"task"`` or ``"environment"``, and ``name`` its registered name (for messages).
    :param policy: ``rollout.reward_errors``.
    :param limits: the stage's :class:`rllab.rollout.episodes.EpisodeLimits` (named in the overflow message).
    :param total: the counts summed over data-parallel ranks (:meth:`rllab.parallel.distributed.Reducer.sum`),
        so that every rank decides alike; None: one process.
    :param failure: the error raised when every sample failed (the source's:
        :class:`~rllab.errors.EpisodeError` for an environment), and ``culprit`` what to fix then.
    :raises RewardError: (``failure``) every sample failed; the message names the task or
        environment and the first failure.
    :raises ConfigError: every episode overflowed its budget (``key`` ``rollout.max_episode_tokens``).
    """
    failed = [e for e in episodes if e.error is not None]
    local = [len(episodes), len(failed), sum(e.error is None and e.finish_reason == "overflow" for e in episodes)]
    n, n_failed, overflow = (int(total(x)) for x in local) if total is not None else local
    if n == 0:
        return {}
    who = f"{kind} {name!r}"
    first = failed[0].error if failed else "(on another rank)"
    if n_failed == n:
        raise failure(
            f"every one of this step's {n} samples failed (rollout.reward_errors = {policy!r}), so there is nothing to "
            f"learn from: {who} is broken, not unlucky. The first failure: {first} Fix the "
            f"{culprit} (run with rollout.reward_errors = \"raise\" "
            f"to stop at the first failure)."
        )
    if overflow + n_failed == n:
        also = f" ({n_failed} more failed: {first})" if n_failed else ""
        raise ConfigError(
            f"every episode of {who} in this step ended by overflowing its token budget (finish reason 'overflow', "
            f"{overflow} of {n}){also}: no episode reached its end, so there is nothing to learn from. The budget: "
            f"{budget_text(limits)}. {_budget_fix(limits)}",
            key="rollout.max_episode_tokens",
        )
    return {"rollout/error_frac": n_failed / n, "rollout/overflow_frac": overflow / n}


def episode_metrics(episodes: Sequence[Any]) -> dict[str, float]:
    """A step's episode counters: ``env/turns`` and ``env/observation_tokens`` (means per
    episode), ``env/context_overflows`` and ``env/turn_limits`` (episodes that ended so), and each
    ``Step.metrics`` key summed over the episodes as ``env/<key>``."""
    n = max(1, len(episodes))
    out = {
        "env/turns": sum(e.turns for e in episodes) / n,
        "env/observation_tokens": sum(e.observation_tokens for e in episodes) / n,
        "env/context_overflows": float(sum(e.finish_reason == "overflow" for e in episodes)),
        "env/turn_limits": float(sum(e.finish_reason == "max_turns" for e in episodes)),
    }
    for e in episodes:
        for k, v in e.metrics.items():
            out[f"env/{k}"] = out.get(f"env/{k}", 0.0) + float(v)
    return out
