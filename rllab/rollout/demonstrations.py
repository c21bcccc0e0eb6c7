"""Demonstration episodes: an environment's demonstrations played as rollouts, for the tiny
model's supervised warm start (:mod:`rllab.models.tiny`) and the contract checks.

:func:`demonstration_episodes` plays each example's ``env.demonstration(example)`` model turns
against ``env.start(example)`` through the episode loop (:class:`ScriptedBackend` answers each
turn with the next demonstration turn), so a demonstration's ids are exactly those a rollout
would have and its observations are the environment's real answers; :func:`encode_episodes`
turns them into a supervised batch whose loss covers the model's tokens only;
:func:`episode_accuracy` plays greedy episodes of a model (the warm start's probe);
:func:`left_padded` batches prompt ids for ``generate`` (here and in :mod:`rllab.models.supervised`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rllab.rollout.chat import PromptRenderer, prompt_text
from rllab.rollout.episode_stats import ERROR_ADVICE
from rllab.rollout.episodes import EpisodeLimits, EpisodeResult, EpisodeRunner
from rllab.errors import EpisodeError, RllabError
from rllab.members import member
from rllab.rollout.accuracy import is_solved
from rllab.types import Completion, Example, SamplingParams


class ScriptedBackend:
    """A rollout backend that answers each episode with given model turns (texts), tokenized as
    a sampled turn ends (:meth:`rllab.rollout.chat.PromptRenderer.response_ids`, log-probs 0): the
    episode loop plays an environment's demonstrations through it, so a demonstration's ids are
    exactly those a rollout would have (its observations the environment's real answers).

    :param scripts: per prompt of the first ``generate`` call, its model turns.
    :param prompts: the prompts (strings or messages) the scripts answer, for the end token.
    """

    def __init__(self, renderer: PromptRenderer, scripts: Sequence[Sequence[str]], prompts: Sequence[Any]):
        self.renderer = renderer
        self.scripts = [list(s) for s in scripts]
        self.prompts = list(prompts)
        self.used = [0] * len(self.scripts)
        self.expect: list[tuple[int, ...] | None] = [None] * len(self.scripts)

    def _turn(self, k: int, index: int, prompt_ids: Sequence[int]) -> Completion:
        if self.used[k] >= len(self.scripts[k]):
            raise RllabError(
                f"the demonstration of example {prompt_text(self.prompts[k])!r} has {len(self.scripts[k])} model turn(s), "
                f"but its episode did not end after them"
            )
        ids = self.renderer.response_ids(self.scripts[k][self.used[k]], prompt=self.prompts[k])
        self.used[k] += 1
        self.expect[k] = tuple(prompt_ids) + tuple(ids)
        return Completion(prompt_ids=tuple(prompt_ids), token_ids=tuple(ids), log_probs=(0.0,) * len(ids),
                          finish_reason="stop", prompt_index=index)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        if all(e is None for e in self.expect):  # the first turn: prompt k answers script k
            return [self._turn(k, k, p) for k, p in enumerate(prompts) for _ in range(params.n)]
        out, taken = [], set()
        for i, p in enumerate(prompts):
            match = [k for k, e in enumerate(self.expect) if k not in taken and e is not None and tuple(p[: len(e)]) == e]
            # identical prompts and turns make several scripts match: an unfinished one first
            k = next((k for k in match if self.used[k] < len(self.scripts[k])), match[0] if match else None)
            if k is None:
                raise RllabError("ScriptedBackend: a request continues no scripted episode")
            taken.add(k)
            out.append(self._turn(k, i, p))
        return out

    def last_metrics(self) -> dict:
        return {}

    def update_weights(self, model: Any) -> None:
        return None

    def close(self) -> None:
        return None


def demonstration_episodes(env: Any, examples: Sequence[Example], renderer: PromptRenderer, *, name: str = "?",
                           max_turns: int | None = None) -> list[EpisodeResult]:
    """One demonstration episode per example: ``env.demonstration(example)``'s model turns
    played against ``env.start(example)`` through the episode loop (:class:`ScriptedBackend`).
    An environment that fails raises (its error names it, the example and the turn)."""
    scripts = []
    for ex in examples:
        turns = env.demonstration(ex)
        if isinstance(turns, str) or not all(isinstance(t, str) for t in turns) or not turns:
            raise RllabError(
                f"environment {name!r}: demonstration({prompt_text(ex.prompt)!r}) must return a non-empty list of model "
                f"turns (strings), got {turns!r}"
            )
        scripts.append(list(turns))
    turns = max_turns or max(1, member(env, "environment", "max_turns") or 1, max(len(s) for s in scripts))
    backend = ScriptedBackend(renderer, scripts, [e.prompt for e in examples])
    longest = max(len(renderer.response_ids(t, prompt=ex.prompt)) for s, ex in zip(scripts, examples) for t in s)
    runner = EpisodeRunner(env, name=name, backend=backend, renderer=renderer,
                           limits=EpisodeLimits(max_turns=turns, max_new_tokens=max(1, longest)))
    return runner.play(examples, SamplingParams(n=1, max_new_tokens=max(1, longest), temperature=0.0))


def encode_episodes(tokenizer, env, examples: list, *, renderer: PromptRenderer | None = None, name: str = "?"):
    """As :func:`encode_demonstrations` for an environment: each example's demonstration episode
    (its model turns played against the environment, :func:`rllab.rollout.episodes.demonstration_episodes`)
    as the right-padded row ``prompt ids + episode ids``, tokenized exactly as the episode loop
    does; ``loss_mask`` is True where the next token is one of the model's (observations carry no
    loss)."""
    renderer = renderer or PromptRenderer(tokenizer)
    episodes = demonstration_episodes(env, examples, renderer, name=name)
    rows = [list(e.completion.prompt_ids) + list(e.completion.token_ids) for e in episodes]
    B, L = len(rows), max(len(r) for r in rows)
    input_ids = torch.full((B, L), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.bool)
    target = torch.zeros(B, L, dtype=torch.bool)
    for i, (r, e) in enumerate(zip(rows, episodes)):
        input_ids[i, : len(r)] = torch.tensor(r)
        attention_mask[i, : len(r)] = True
        P = len(e.completion.prompt_ids)
        model = e.completion.model_mask or (True,) * len(e.completion.token_ids)
        target[i, P : len(r)] = torch.tensor(model, dtype=torch.bool)
    return input_ids, attention_mask, target[:, 1:]


def left_padded(rows: list[list[int]], pad: int) -> dict:
    """``input_ids`` / ``attention_mask`` (B, L) int64 of left-padded id rows."""
    L = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), L), pad, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, L - len(r) :] = torch.tensor(r, dtype=torch.long)
        attention_mask[i, L - len(r) :] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


class _GreedyBackend:
    """Greedy turns of ``model`` for the episode loop (log-probs not computed: 0)."""

    def __init__(self, model, tokenizer, renderer: PromptRenderer):
        self.model, self.tokenizer, self.renderer = model, tokenizer, renderer

    @torch.no_grad()
    def generate(self, prompts, params):
        stops = list(self.renderer.stop_ids)
        enc = left_padded([list(p) for p in prompts], self.tokenizer.pad_token_id)
        gen = self.model.generate(**enc, max_new_tokens=params.max_new_tokens, do_sample=False,
                                  eos_token_id=stops[0] if len(stops) == 1 else stops, pad_token_id=self.tokenizer.pad_token_id)
        out = []
        for i, row in enumerate(gen[:, enc["input_ids"].shape[1]:].tolist()):
            cut = self.renderer.cut(row)
            ids = row[: len(cut) + 1] if len(cut) < len(row) else row
            stopped = len(cut) < len(row)
            out += [Completion(prompt_ids=tuple(prompts[i]), token_ids=tuple(ids), log_probs=(0.0,) * len(ids),
                               finish_reason="stop" if stopped else "length", prompt_index=i)] * params.n
        return out

    def last_metrics(self):
        return {}


def episode_accuracy(model, tokenizer, env, examples, max_new_tokens: int, renderer: PromptRenderer) -> float:
    """The share of ``examples`` whose greedy episode is solved (:func:`rllab.rollout.accuracy.is_solved`:
    ``env.solved``, else total reward ≥ 1; a failed episode never is)."""
    was_training = model.training
    model.eval()
    limits = EpisodeLimits(max_turns=member(env, "environment", "max_turns") or 1, max_new_tokens=max_new_tokens,
                           context_tokens=getattr(getattr(model, "config", None), "max_position_embeddings", None))
    runner = EpisodeRunner(env, name=renderer.task_name, backend=_GreedyBackend(model, tokenizer, renderer), renderer=renderer,
                           limits=limits, on_error="zero")
    episodes = runner.play(examples, SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0))
    model.train(was_training)
    failed = [e for e in episodes if e.error is not None]
    if failed and len(failed) == len(episodes):  # an environment that always fails is broken: say so now, not 0%
        raise EpisodeError(
            f"every one of the {len(episodes)} greedy episodes the warm start measured its accuracy on failed; the first: "
            f"{failed[0].error} {ERROR_ADVICE}"
        )
    return sum(e.error is None and is_solved(env, e.example, e.reward) for e in episodes) / len(examples)
