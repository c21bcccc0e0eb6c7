"""The phases of a rollout step (:meth:`rllab.rollout.stage.RolloutStage.sample`), each a function
of the stage and the step's :class:`StepEpisodes`: the shapers (``rollout.random_reward``, DAPO's
overlong penalty), the filters (``reward_errors = "skip"``, ``rollout.dynamic_sampling``) and the
measures (the step's ``rollout/*`` metrics, then each feature's in use), chosen from ``[rollout]``
once, when the stage is built (:func:`shapers`, :func:`filters`, :func:`measures`); and
:func:`episode_batch`, the one place a :class:`~rllab.types.RolloutBatch` is built from episodes.
How the episodes are reported (:class:`Reporting`: as episodes of turns or as answers) is chosen
once too, from the environment's ``multi_turn`` trait (:func:`reporting`).

A step's rows are :class:`~rllab.rollout.episodes.EpisodeResult` records from sampling to batching:
each carries its ``reward`` (scalar), ``score`` (reward components) and ``token_rewards``
(placed per token), then the stage's ``shaping`` and ``keep``; :func:`episode_batch` pads the
kept ones into the :class:`~rllab.types.RolloutBatch`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs
import torch

from rllab import ops, sampling
from rllab.rollout.episode_stats import check_step, episode_metrics
from rllab.rollout.episodes import EpisodeResult
from rllab.members import member
from rllab.rollout.gate import group_means, played_feedback
from rllab.rollout.partial import PartialRollouts, for_stage, refused_over_turns
from rllab.rollout.rewards import on_last_model_token
from rllab.types import Completion, Example, RolloutBatch, SamplingParams


@attrs.define(kw_only=True, eq=False)
class StepEpisodes:
    """One step's episodes between the phases of :meth:`RolloutStage.sample`: drawn
    (``examples``), played (``episodes``, with each one's outcome as played: ``raw``, ``comps``,
    ``solved``), shaped (``rewards``, ``shaping``), filtered (``keep``) and measured (``metrics``)."""

    step: int
    prompts: int
    """The step's prompt count (over all data-parallel ranks)."""
    examples: list[Example]
    partial: Any = None
    """Partial rollouts: the step's stand-in backend (:mod:`rllab.rollout.partial`), else None."""
    params: SamplingParams | None = None
    episodes: list[EpisodeResult] = attrs.Factory(list)
    gated: Any = None
    """The sampler's gate's :class:`~rllab.rollout.gate.GateResult`, else None."""
    timings: dict = attrs.Factory(dict)
    """The episode loop's own seconds: ``rollout`` (sampling) and ``step`` (the environment's steps)."""
    backend_metrics: dict = attrs.Factory(dict)
    raw: list[float] = attrs.Factory(list)
    """Each episode's reward as played."""
    comps: list[list[float]] = attrs.Factory(list)
    """Each episode's reward components as played (zeros for a failed one)."""
    solved: list[bool] = attrs.Factory(list)
    rewards: torch.Tensor | None = None
    """(N,) float32 the rewards training sees (``rollout.random_reward``: the draws)."""
    shaping: torch.Tensor | None = None
    """(N,) float32 added to ``rewards`` (the overlong penalty; zeros without it)."""
    keep: torch.Tensor | None = None
    """(N,) bool the episodes the batch takes."""
    metrics: dict = attrs.Factory(dict)

    @property
    def completions(self) -> list[Completion]:
        return [e.completion for e in self.episodes]

    @property
    def scores(self) -> torch.Tensor:
        """(N,) float32 ``rewards + shaping``."""
        return self.rewards + self.shaping

    @property
    def index(self) -> torch.Tensor:
        """(N,) int64 each episode's prompt index."""
        return torch.tensor([e.completion.prompt_index for e in self.episodes])

    def played(self, names: Sequence[str], solved: Any, *, zero_failed: bool) -> None:
        """Record each episode's outcome as played; a failed one is kept only when it scores 0 (``zero_failed``)."""
        self.raw = [e.reward for e in self.episodes]
        self.comps = [list(e.score) or [0.0] * len(names) for e in self.episodes]
        self.solved = [e.error is None and solved(self.examples[e.completion.prompt_index], x, k)
                       for e, x, k in zip(self.episodes, self.raw, self.comps)]
        self.rewards = torch.tensor(self.raw, dtype=torch.float32)
        self.shaping = torch.zeros(len(self.raw), dtype=torch.float32)
        self.keep = torch.tensor([e.error is None or zero_failed for e in self.episodes], dtype=torch.bool)

    def final_episodes(self) -> list[EpisodeResult]:
        """The episodes with their ``shaping`` and ``keep`` (evolved only where they change, ~13 µs each)."""
        return [e if (x, k) == (e.shaping, e.keep) else attrs.evolve(e, shaping=x, keep=k)
                for e, x, k in zip(self.episodes, self.shaping.tolist(), self.keep.tolist())]


# -- shape: chosen from [rollout] once (shapers), each a function of (stage, step)


def shapers(stage: Any) -> list:
    """shape: ``rollout.random_reward`` (the spurious-rewards control: training sees draws blind
    to the answers), then DAPO's overlong penalty (``rollout.overlong_buffer``)."""
    r = stage.config
    return [f for on, f in ((r.random_reward != "off", random_reward), (r.overlong_buffer > 0, overlong)) if on]


def random_reward(stage: Any, s: StepEpisodes) -> None:
    """``rollout.random_reward``: the rewards training sees, the stage's Bernoulli draws."""
    rank, world = stage.shard
    rate = stage.reporting.base_rate(s)
    s.rewards = stage.random_rewards(s.step, s.completions, rate, s.keep.tolist(), rank * s.prompts // world)
    s.episodes = [attrs.evolve(e, reward=x, score=(), token_rewards=on_last_model_token(e, x))
                  for e, x in zip(s.episodes, s.rewards.tolist())]


def overlong(stage: Any, s: StepEpisodes) -> None:
    """``rollout.overlong_buffer``: DAPO's overlong penalty as the step's shaping."""
    s.shaping = stage.overlong_penalty(s.completions)


# -- filter


def filters(config: Any) -> list:
    """filter (after the failed samples, left out unless ``reward_errors = "zero"``):
    ``reward_errors = "skip"`` drops a failed sample's whole group; ``rollout.dynamic_sampling``
    the groups whose scores are all equal (DAPO)."""
    return [f for on, f in ((config.reward_errors == "skip", skip_failed_groups),
                            (config.dynamic_sampling, drop_flat_groups)) if on]


def skip_failed_groups(stage: Any, s: StepEpisodes) -> None:
    """``reward_errors = "skip"``: drop the whole group of a failed sample."""
    if not s.keep.all():
        index = s.index
        s.keep &= ~torch.isin(index, index[~s.keep].unique())


def drop_flat_groups(stage: Any, s: StepEpisodes) -> None:
    """``rollout.dynamic_sampling``: drop the groups (of more than one sample) whose scores are all equal."""
    count, _, std = ops.group_stats(s.scores, s.index)
    s.keep &= ~((std == 0) & (count > 1))


# -- measure


def measures(stage: Any) -> list:
    """measure: the step's ``rollout/*`` metrics, then those of the features in use."""
    r = stage.config
    return [f for on, f in (
        (True, measure),
        (r.random_reward != "off", true_reward),
        (stage.partial is not None, partial_tokens),
        (bool(stage.component_names), component_metrics),
        *((True, f) for f in stage.reporting.measures),
        (stage.sampler is not None, feed_sampler),
        (True, kept_frac),
    ) if on]


def measure(stage: Any, s: StepEpisodes) -> dict:
    """The ``rollout/*``, ``time/*`` and backend metrics of a step."""
    completions, episodes, world = s.completions, s.episodes, stage.shard[1]
    lengths = torch.tensor([c.model_tokens for c in completions], dtype=torch.float32)
    count, _, std = ops.group_stats(s.scores, torch.tensor([c.prompt_index for c in completions]))
    health = check_step(episodes, kind=stage.kind, name=stage.task_name, policy=stage.config.reward_errors, limits=stage.limits,
                        total=stage.reducer.sum if world > 1 else None, failure=stage.source_kind.failure,
                        culprit=stage.source_kind.culprit)
    return {
        "rollout/reward": s.rewards.mean().item(),
        "rollout/score": s.scores.mean().item(),
        "rollout/accuracy": sum(s.solved) / len(s.solved),
        "rollout/response_length": lengths.mean().item(),
        "rollout/tokens": lengths.sum().item(),
        **lengths_by_outcome(lengths, s.solved),
        "rollout/empty_frac": (lengths == 0).float().mean().item(),
        "rollout/stop_frac": sum(c.finish_reason == "stop" for c in completions) / len(completions),
        "rollout/truncated_frac": sum(truncated(e) for e in episodes) / len(episodes),
        "rollout/reward_errors": float(sum(e.error is not None for e in episodes)),
        **health,
        "rollout/groups_all_equal": ((std == 0) & (count > 1)).float().sum().item() / max(1, s.params.n),
        "time/rollout": s.timings["rollout"],
        "time/reward": s.timings["step"],
        "perf/completions_per_s": len(completions) / max(s.timings["rollout"], 1e-9),
        **{k: float(v) for k, v in s.backend_metrics.items()},
    }


def true_reward(stage: Any, s: StepEpisodes) -> dict:
    """``rollout/true_reward``: the mean reward as played, under ``rollout.random_reward``."""
    return {"rollout/true_reward": torch.tensor(s.raw, dtype=torch.float32).mean().item()}


def partial_tokens(stage: Any, s: StepEpisodes) -> dict:
    """Partial rollouts: the step's ``partial/*`` token metrics."""
    return s.partial.token_metrics(s.completions)


def component_metrics(stage: Any, s: StepEpisodes) -> dict:
    """``reward/<name>``: each reward component's mean as played (the task's, whatever trains)."""
    names = stage.component_names
    comps = torch.tensor(s.comps, dtype=torch.float32).reshape(len(s.comps), len(names))
    return {f"reward/{name}": comps[:, k].mean().item() for k, name in enumerate(names)}


def turn_metrics(stage: Any, s: StepEpisodes) -> dict:
    """``env/*``: an environment's episodes as episodes of turns."""
    return episode_metrics(s.episodes)


def feed_sampler(stage: Any, s: StepEpisodes) -> dict:
    """The sampler's feedback (each prompt's mean reward, the gate's replacements too) and metrics."""
    fed, means = list(s.examples), group_means(s.episodes, len(s.examples))
    if s.gated is not None:
        more, more_means = played_feedback(s.gated.played)
        fed, means = fed + more, means + more_means
    sampling.feedback(stage.sampler, step=s.step, examples=fed, rewards=means)
    return {**(s.gated.metrics if s.gated is not None else {}), **sampling.metrics(stage.sampler, name=stage.sampler_name)}


def kept_frac(stage: Any, s: StepEpisodes) -> dict:
    """``rollout/kept_frac``: the fraction of the step's episodes the batch takes."""
    return {"rollout/kept_frac": s.keep.float().mean().item()}


# -- how the episodes are reported: as episodes of turns or as answers, chosen once (reporting)


@attrs.frozen(kw_only=True)
class Reporting:
    """How a stage reports its episodes, chosen once from its environment's ``multi_turn`` trait
    (:func:`reporting`): as episodes of turns (:data:`AS_TURNS`) or as one answer each (:data:`AS_ANSWERS`)."""

    base_rate: Callable[[StepEpisodes], Sequence[float]]
    """``rollout.random_reward``'s base rate per episode: the solved fraction for episodes of turns (whose per-turn
    rewards are of any scale), the reward as played for answers."""
    measures: tuple
    """The measures (functions of the stage and the step) each step adds: ``env/*`` for episodes of turns."""
    evaluated: Callable[..., dict]
    """``evaluated(episodes, reducer, n)``: what an evaluation adds over its ``n`` greedy episodes (all ranks):
    ``eval/turns`` for episodes of turns."""
    partial: Callable[..., PartialRollouts]
    """``partial(backend, config, world=, name=)``: the stage's partial rollouts (``rollout.over_sample > 0``),
    refused for episodes of turns."""


def mean_turns(episodes: Sequence[EpisodeResult], reducer: Any, n: float) -> dict:
    """``eval/turns``: the mean turns of an evaluation's greedy episodes (summed over the ranks)."""
    return {"eval/turns": reducer.sum(float(sum(e.turns for e in episodes))) / n}


AS_TURNS = Reporting(base_rate=lambda s: s.solved, measures=(turn_metrics,), evaluated=mean_turns,
                     partial=refused_over_turns)
AS_ANSWERS = Reporting(base_rate=lambda s: s.raw, measures=(), evaluated=lambda episodes, reducer, n: {},
                       partial=for_stage)


def reporting(env: Any) -> Reporting:
    """How ``env``'s episodes are reported (its ``multi_turn`` trait, asked once when the stage is built)."""
    return AS_TURNS if member(env, "environment", "multi_turn") else AS_ANSWERS


def lengths_by_outcome(lengths: torch.Tensor, solved: Sequence[bool]) -> dict[str, float]:
    """``rollout/response_length_correct`` / ``_incorrect``: the mean response length (tokens) of
    the solved and of the unsolved samples, each logged when the step has one."""
    mask = torch.tensor(list(solved), dtype=torch.bool)
    out = {}
    for name, m in (("correct", mask), ("incorrect", ~mask)):
        if m.any():
            out[f"rollout/response_length_{name}"] = lengths[m].mean().item()
    return out


# -- the batch


def shaped(episodes: Sequence[EpisodeResult]) -> torch.Tensor:
    return torch.tensor([e.reward for e in episodes], dtype=torch.float32) + torch.tensor(
        [e.shaping for e in episodes], dtype=torch.float32)


TRUNCATED = ("length", "overflow")
"""Finish reasons of a cut-off sample: stopped by ``max_new_tokens`` (an episode: its last turn), or an
episode that outgrew its token budget."""


def truncated(episode: EpisodeResult) -> bool:
    """Whether ``episode`` was cut off (``rollout.mask_truncated`` leaves it out of the loss)."""
    return episode.finish_reason in TRUNCATED


def episode_batch(episodes: Sequence[EpisodeResult], *, pad_token_id: int, component_names: Sequence[str] = (),
                  component_weights: Sequence[float] | None = None) -> RolloutBatch:
    """The padded :class:`RolloutBatch` of ``episodes`` (the kept ones of a step): rows in their
    order, ``index`` the prompt index, ``rewards`` each episode's reward plus its shaping (float32),
    ``reward_components`` their ``score`` (zeros for a failed episode) with the K names and
    weights, ``turns``, ``staleness`` and (partial rollouts) ``token_versions``.

    Placed rewards: a row of one turn has its reward on its last model token (the batch's
    default placement); when some row took several turns, every row's are given
    (``turn_rewards``): each turn's reward on its last model token, the shaping added to the
    last one."""
    rewards = shaped(episodes)
    names = tuple(component_names)
    comps = None
    if names:
        comps = torch.tensor([list(e.score) or [0.0] * len(names) for e in episodes], dtype=torch.float32)
        comps = comps.reshape(len(episodes), len(names))
    placed = None
    if any(e.turns > 1 for e in episodes):
        raw = torch.tensor([e.reward for e in episodes], dtype=torch.float32)
        placed = []
        for e, extra, total in zip(episodes, (rewards - raw).tolist(), rewards.tolist()):
            row = list(e.token_rewards)
            model = e.completion.model_mask or (True,) * len(row)
            last = max((i for i, m in enumerate(model) if m), default=-1)
            if last >= 0 and e.turns > 1:
                row[last] += extra
            elif last >= 0:  # one turn: the row's reward, as the default placement has it
                row = [0.0] * len(row)
                row[last] = total
            placed.append(row)
    staleness = [e.staleness for e in episodes]
    versions = None  # partial rollouts: each token's step (a row without them: all the newest step's)
    if any(e.token_versions is not None for e in episodes):
        newest = max((v for e in episodes for v in e.token_versions or ()), default=0)
        versions = [e.token_versions or (newest,) * len(e.completion.token_ids) for e in episodes]
    return RolloutBatch.from_completions(
        [e.completion for e in episodes], rewards, pad_token_id=pad_token_id, reward_components=comps,
        reward_component_names=names, reward_component_weights=None if comps is None else component_weights,
        turn_rewards=placed, turns=[e.turns for e in episodes], staleness=None if None in staleness else staleness,
        token_versions=versions,
    )
