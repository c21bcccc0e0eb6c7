"""Partial rollouts: over-sample a step's prompts, stop sampling once the batch is full.

With ``rollout.over_sample = f > 0`` a step draws ``ceil(P · (1 + f))`` prompts (P =
``prompts_per_step``) and asks the backend to stop as soon as **P groups are complete** — every
one of a group's G samples finished (a stop token or its length cap): GRPO-style estimators need
whole groups, so "full" counts groups, never samples. The backend's ``generate_until``
(:data:`rllab.members.MEMBERS`) does the stopping: ``hf`` checks the complete groups after every
token, ``sglang`` sends ``/abort_request`` for the outstanding requests. The batch takes every
group complete when sampling stopped (at least P; ``hf`` may complete several on the same token).

The groups left unfinished go by ``rollout.partial``:

- ``drop`` (verl's ``over_sample_rate``, APRIL): discarded; the next step draws fresh prompts.
- ``continue`` (slime's partial rollout): kept, and the next step resumes each sample from its
  prompt plus the tokens it has (``max_new_tokens`` minus those left to sample), with the weights of
  that step. Carried groups come first in the next step's draw (the oldest first), fresh prompts
  fill the rest. Each token keeps the step whose weights sampled it
  (:attr:`rllab.rollout.episodes.EpisodeResult.token_versions`), and its ``rollout_log_prob`` is
  the log-prob those weights gave it, so an importance correction (``correction = "tis"`` …)
  weighs an older token by π_train/π_that_step. ``rollout.mask_stale_tokens`` keeps the older
  tokens out of the loss altogether (context only, as slime's
  ``--mask-offpolicy-in-partial-rollout``).

Metrics: ``partial/groups_complete``, ``partial/groups_unfinished`` (stopped this step),
``partial/groups_carried`` (resumed this step), ``partial/stale_token_frac`` (share of the
batch's response tokens sampled at an earlier step) and ``partial/token_staleness`` (their mean
age in steps, over all the batch's response tokens).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import attrs

from rllab.errors import RllabError
from rllab.members import member
from rllab.settings import RolloutConfig
from rllab.types import Completion, Example, SamplingParams


@attrs.define
class Carried:
    """An unfinished group kept for the next step (``partial = "continue"``)."""

    example: Example
    rows: list[tuple[tuple[int, ...], tuple[float, ...], tuple[int, ...], str | None]]
    """Per sample: its tokens so far, their log-probs, the step that sampled each token, and its
    finish reason when it finished already (None: to be continued)."""


class PartialRollouts:
    """The run's partial-rollout state (see the module docstring): the carried groups, and one
    step's stand-in backend for the episode loop.

    :param backend: the run's rollout backend; it must have ``generate_until``.
    :param config: the run's :class:`rllab.settings.RolloutConfig` (``over_sample`` > 0).
    """

    def __init__(self, backend: Any, config: RolloutConfig):
        until = member(backend, "rollout_backend", "generate_until")
        if until is None:
            raise RllabError(
                f"rollout.over_sample = {config.over_sample!r} needs a backend that stops a batch early (generate_until): "
                f"the run's backend ({type(backend).__name__}) has none. Use backend 'hf' (process = false) or 'sglang', or set "
                f"rollout.over_sample = 0"
            )
        self.backend = backend
        self.config = config
        self.carried: list[Carried] = []

    def draws(self, prompts: int) -> int:
        """How many groups a step of ``prompts`` samples: ``ceil(P · (1 + over_sample))``."""
        return math.ceil(prompts * (1 + self.config.over_sample) - 1e-9)

    def examples(self, prompts: int, fresh: Callable[[int], list[Example]]) -> tuple[list[Example], list[Carried]]:
        """A step's examples: the carried groups first, then ``fresh(k)`` new draws."""
        total = self.draws(prompts)
        carried, self.carried = self.carried[:total], self.carried[total:]
        return [c.example for c in carried] + (fresh(total - len(carried)) if total > len(carried) else []), carried

    def state_dict(self) -> list[dict]:
        """The carried groups, for a checkpoint (plain data): a resumed run continues them."""
        return [{"prompt": c.example.prompt, "answer": c.example.answer, "meta": dict(c.example.meta),
                 "rows": [tuple(r) for r in c.rows]} for c in self.carried]

    def load_state_dict(self, state: Sequence[dict]) -> None:
        """Set back :meth:`state_dict`'s carried groups."""
        self.carried = [Carried(example=Example(prompt=g["prompt"], answer=g["answer"], meta=dict(g["meta"])),
                                rows=[tuple(r) for r in g["rows"]]) for g in state]

    def step_backend(self, step: int, prompts: int, carried: list[Carried]) -> "StepBackend":
        """The backend the step's episode loop samples through."""
        return StepBackend(self, step, prompts, carried)


def for_stage(backend: Any, config: RolloutConfig, *, world: int, name: str) -> PartialRollouts:
    """A rollout stage's :class:`PartialRollouts` over episodes of one answer, refused under data
    parallelism (several ranks)."""
    if world > 1:
        raise RllabError(f"rollout.over_sample = {config.over_sample!r} is not supported under data parallelism "
                         f"({world} ranks): set rollout.over_sample = 0")
    return PartialRollouts(backend, config)


def refused_over_turns(backend: Any, config: RolloutConfig, *, world: int, name: str) -> PartialRollouts:
    """Partial rollouts of an environment whose episodes are reported as episodes of turns: refused
    (they stop and resume single-turn samples)."""
    raise RllabError(f"rollout.over_sample = {config.over_sample!r}: partial rollouts stop and resume single-turn samples; "
                     f"environment {name!r} plays episodes of several turns. Set rollout.over_sample = 0")


class StepBackend:
    """One step's sampling (what :class:`~rllab.rollout.episodes.EpisodeRunner` calls ``generate``
    on): the G rows of each example — a carried group's rows resume from their tokens — go to
    ``generate_until``; only the complete groups come back (the episode loop drops the others)."""

    def __init__(self, owner: PartialRollouts, step: int, prompts: int, carried: list[Carried]):
        self.owner, self.step, self.prompts, self.carried = owner, step, prompts, carried
        self.versions: dict[int, tuple[int, ...]] = {}
        """``id(completion)`` → the step of each of its tokens, for the completions returned."""
        self.metrics: dict[str, float] = {}

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        owner, G = self.owner, params.n
        if self.metrics:
            raise RllabError("partial rollouts sample one turn per episode: an environment of several turns is refused "
                             "with rollout.over_sample > 0")
        rows, caps, groups, prev = [], [], [], []
        for i, p in enumerate(prompts):
            old = self.carried[i].rows if i < len(self.carried) else [((), (), (), None)] * G
            for tokens, lps, steps, finish in old:
                prev.append((tokens, lps, steps, finish, None if finish is not None else len(rows)))
                if finish is None:  # a sample of a carried group that finished already is not sampled again
                    rows.append(tuple(p) + tokens)
                    caps.append(max(1, params.max_new_tokens - len(tokens)))
                    groups.append(i)
        got = owner.backend.generate_until(rows, attrs.evolve(params, n=1), caps=caps, groups=groups, needed=self.prompts)
        out, keep_back = [], []
        complete = 0
        for i, p in enumerate(prompts):
            group = []
            for tokens, lps, steps, finish, k in prev[i * G:(i + 1) * G]:
                if k is None:
                    group.append((tokens, lps, steps, finish, None, len(tokens)))
                    continue
                c = got[k]
                group.append((tokens + tuple(c.token_ids), lps + tuple(c.log_probs), steps + (self.step,) * len(c.token_ids),
                              c.finish_reason, c.weight_version, len(tokens)))
            if all(g[3] != "abort" for g in group):
                complete += 1
                for tokens, lps, steps, finish, version, old in group:
                    mask = (False,) * old + (True,) * (len(tokens) - old) if owner.config.mask_stale_tokens and old else None
                    done = Completion(prompt_ids=tuple(p), token_ids=tokens, log_probs=lps, finish_reason=finish,
                                      prompt_index=i, weight_version=version, model_mask=mask)
                    self.versions[id(done)] = steps
                    out.append(done)
            elif owner.config.partial == "continue":
                keep_back.append((i, [(t, lp, s, None if f == "abort" else f) for t, lp, s, f, _, _ in group]))
        self.unfinished = keep_back
        self.metrics = {"partial/groups_complete": float(complete), "partial/groups_unfinished": float(len(prompts) - complete),
                        "partial/groups_carried": float(len(self.carried))}
        return out

    def keep(self, examples: Sequence[Example]) -> None:
        """``partial = "continue"``: put the step's unfinished groups back, before those still waiting."""
        back = [Carried(example=examples[i], rows=rows) for i, rows in getattr(self, "unfinished", [])]
        self.owner.carried = back + self.owner.carried

    def last_metrics(self) -> dict[str, float]:
        inner = member(self.owner.backend, "rollout_backend", "last_metrics")
        return {**((inner() if inner is not None else None) or {}), **self.metrics}

    def token_metrics(self, completions: Sequence[Completion]) -> dict[str, float]:
        """``partial/stale_token_frac`` and ``partial/token_staleness`` over ``completions`` (the batch's)."""
        ages = [self.step - s for c in completions for s in self.versions.get(id(c), ())]
        n = max(1, len(ages))
        return {"partial/stale_token_frac": sum(a > 0 for a in ages) / n, "partial/token_staleness": sum(ages) / n}
