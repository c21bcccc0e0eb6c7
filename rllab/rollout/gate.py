"""The sampler's gate: replacement prompts for the groups whose scores are all equal.

A sampler that declares ``gate_retries=k`` (:mod:`rllab.traits`, e.g. ``advantage_gate``) asks
the rollout stage, after a step's groups are played, to replace every *flat* group (all its
scores equal, so a group baseline gives each of its samples advantage 0 and it teaches nothing):
for at most ``k`` rounds, the stage draws one new prompt per flat group from the sampler, plays a
group for each and swaps in those that are not flat, each into the place of one flat group. The
step keeps its number of prompts and rows.

When the rounds run out, the groups still flat stay in the step as they are (a group baseline
gives them advantage 0). ``rollout.dynamic_sampling = true`` then drops them, as it drops any
flat group: together the two are DAPO's dynamic sampling with a bounded number of extra
generations. The counts are logged each step: ``sampler/gate_flat`` (flat groups before the
gate), ``sampler/gate_replaced``, ``sampler/gate_left`` (still flat after the last round),
``sampler/gate_rounds`` and ``sampler/gate_prompts`` (replacement prompts played).

Each round's prompts and samples are seeded from ``(seed, step, round)``, so a step's
replacements are the same in every run with that seed.
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs
import torch

from rllab.algorithm import seed_for
from rllab.rollout.episodes import EpisodeResult
from rllab.types import Example, SamplingParams

DRAW_SALT = 300
"""``seed_for(seed, step, DRAW_SALT + round)`` seeds a round's prompt draw; ``PLAY_SALT + round`` its samples."""
PLAY_SALT = 400


def flat_groups(episodes: Sequence[EpisodeResult], scores: Sequence[float]) -> list[int]:
    """The prompt indices whose group has more than one sample and all scores equal, in order."""
    by_prompt: dict[int, list[float]] = {}
    for e, s in zip(episodes, scores):
        by_prompt.setdefault(e.completion.prompt_index, []).append(float(s))
    return [i for i, xs in sorted(by_prompt.items()) if len(xs) > 1 and max(xs) == min(xs)]


@attrs.frozen(kw_only=True)
class GateResult:
    examples: list[Example]
    """The step's examples, flat groups replaced where a round found a replacement."""
    episodes: list[EpisodeResult]
    """Prompt-major again, each replacement's episodes carrying the index of the group it replaced."""
    played: list[tuple[Example, list[EpisodeResult]]]
    """Every replacement group played (kept or not), for the sampler's feedback."""
    metrics: dict[str, float]


def gate(*, examples: Sequence[Example], episodes: Sequence[EpisodeResult], retries: int, step: int, seed: int,
         params: SamplingParams, draw: Callable[[int, torch.Generator], list[Example]],
         play: Callable[[Sequence[Example], SamplingParams], list[EpisodeResult]],
         score: Callable[[Sequence[EpisodeResult]], Sequence[float]]) -> GateResult:
    """Replace the flat groups of a step (see the module docstring).

    ``draw(n, rng)``: ``n`` replacement prompts from the sampler; ``play(examples, params)``: a
    group per example through the episode loop; ``score(episodes)``: the scores that decide
    flatness (the stage's: reward plus shaping)."""
    examples = list(examples)
    groups: dict[int, list[EpisodeResult]] = {}
    for e in episodes:
        groups.setdefault(e.completion.prompt_index, []).append(e)
    flat = flat_groups(episodes, score(episodes))
    metrics = {"sampler/gate_flat": float(len(flat)), "sampler/gate_replaced": 0.0, "sampler/gate_rounds": 0.0,
               "sampler/gate_prompts": 0.0}
    played: list[tuple[Example, list[EpisodeResult]]] = []
    for r in range(retries):
        if not flat:
            break
        rng = torch.Generator().manual_seed(seed_for(seed, step, DRAW_SALT + r))
        new = draw(len(flat), rng)
        if len(new) != len(flat):
            raise ValueError(f"the sampler returned {len(new)} replacement prompts for {len(flat)} flat groups")
        fresh = play(new, attrs.evolve(params, seed=seed_for(seed, step, PLAY_SALT + r)))
        still_flat = set(flat_groups(fresh, score(fresh)))
        by_new: dict[int, list[EpisodeResult]] = {}
        for e in fresh:
            by_new.setdefault(e.completion.prompt_index, []).append(e)
        metrics["sampler/gate_rounds"] += 1
        metrics["sampler/gate_prompts"] += len(new)
        left = []
        for j, slot in enumerate(flat):
            played.append((new[j], by_new.get(j, [])))
            if j in still_flat or j not in by_new:
                left.append(slot)
                continue
            examples[slot] = new[j]
            groups[slot] = [_moved(e, slot) for e in by_new[j]]
            metrics["sampler/gate_replaced"] += 1
        flat = left
    metrics["sampler/gate_left"] = float(len(flat))
    ordered = [e for i in sorted(groups) for e in groups[i]]
    return GateResult(examples=examples, episodes=ordered, played=played, metrics=metrics)


def _moved(e: EpisodeResult, slot: int) -> EpisodeResult:
    """``e`` as an episode of the step's prompt ``slot``."""
    return attrs.evolve(e, completion=attrs.evolve(e.completion, prompt_index=slot))


def group_means(episodes: Sequence[EpisodeResult], n_prompts: int) -> list[float | None]:
    """Each prompt's mean reward over its episodes that did not fail (None: every one failed)."""
    sums, counts = [0.0] * n_prompts, [0] * n_prompts
    for e in episodes:
        if e.error is None:
            sums[e.completion.prompt_index] += e.reward
            counts[e.completion.prompt_index] += 1
    return [s / c if c else None for s, c in zip(sums, counts)]


def played_feedback(played: Sequence[tuple[Example, list[EpisodeResult]]]) -> tuple[list[Example], list[float | None]]:
    """The replacement prompts played by the gate and each one's mean reward (for the sampler's feedback)."""
    examples, means = [], []
    for ex, eps in played:
        ok = [e.reward for e in eps if e.error is None]
        examples.append(ex)
        means.append(sum(ok) / len(ok) if ok else None)
    return examples, means


__all__ = ["GateResult", "flat_groups", "gate", "group_means", "played_feedback"]
