"""Demonstration episodes: an environment's demonstrations played as rollouts, for the tiny
model's supervised warm start (:mod:`rllab.models.tiny`) and the contract checks.

:func:`demonstration_episodes` plays each example's ``env.demonstration(example)`` model turns
against ``env.start(example)`` through the episode loop (:class:`ScriptedBackend` answers each
turn with the next demonstration turn), so a demonstration's ids are exactly those a rollout
would have and its observations are the environment's real answers; :func:`encode_episodes`
turns them into a supervised batch whose loss covers the model's tokens only;
:func:`episode_accuracy` plays greedy episodes of a model (the warm start's probe); a task's
demonstrations (:func:`encode_demonstrations`) and greedy answers (:func:`greedy_completions`) as
well, each kind's by the functions its :class:`~rllab.rollout.single_turn.SourceKind` names;
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


def encode_demonstrations(tokenizer, prompts: list, completions: list[str], *, renderer: PromptRenderer | None = None):
    """Right-padded ``prompt completion <end>`` rows and a mask over their targets.

    A string prompt is ``<bos> prompt`` and ``<end>`` is ``<eos>``; a chat prompt (or any prompt
    under a system prompt) is rendered by ``renderer`` (default: ``PromptRenderer(tokenizer)``)
    with the chat template and ``<end>`` is the template's end-of-turn token — the ids the
    rollout stage would sample from and stop at.

    :returns: ``input_ids`` (B, L) int64, ``attention_mask`` (B, L) bool, and ``loss_mask``
        (B, L − 1) bool — True where the next token (``input_ids[:, 1:]``) belongs to the
        completion or is its ``<end>``.
    """
    renderer = renderer or PromptRenderer(tokenizer)
    rows, starts = [], []
    for p, c in zip(prompts, completions):
        p_ids = renderer.encode(p)
        c_ids = renderer.response_ids(c, prompt=p)
        rows.append(p_ids + c_ids)
        starts.append(len(p_ids))
    B, L = len(rows), max(len(r) for r in rows)
    input_ids = torch.full((B, L), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.bool)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r)
        attention_mask[i, : len(r)] = True
    pos = torch.arange(1, L).unsqueeze(0)
    loss_mask = (pos >= torch.tensor(starts).unsqueeze(1)) & attention_mask[:, 1:]
    return input_ids, attention_mask, loss_mask


@torch.no_grad()
def greedy_completions(
    model, tokenizer, prompts: list, max_new_tokens: int, batch_size: int = 256, *, renderer: PromptRenderer | None = None
) -> list[str]:
    """Greedy completions (decoded up to the first stop token — ``<eos>``, or the chat template's
    end of turn — special tokens dropped) for each prompt (a string or chat messages, encoded by
    ``renderer``, default ``PromptRenderer(tokenizer)``)."""
    renderer = renderer or PromptRenderer(tokenizer)
    stops = list(renderer.stop_ids)
    out: list[str] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        if renderer.system_prompt is None and all(isinstance(p, str) for p in chunk):
            enc = dict(tokenizer(chunk, return_tensors="pt", padding=True))
        else:
            enc = left_padded([renderer.encode(p) for p in chunk], tokenizer.pad_token_id)
        gen = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stops[0] if len(stops) == 1 else stops,
            pad_token_id=tokenizer.pad_token_id,
        )
        for row in gen[:, enc["input_ids"].shape[1] :].tolist():
            out.append(renderer.decode(row))
    return out


def answer_demonstrations(tokenizer, task, examples: list, renderer: PromptRenderer):
    """A task's demonstrations as a supervised batch: each example's prompt and ``task.demonstration``
    (:func:`encode_demonstrations`)."""
    return encode_demonstrations(tokenizer, [e.prompt for e in examples], [task.demonstration(e) for e in examples],
                                 renderer=renderer)


def episode_demonstrations(tokenizer, env, examples: list, renderer: PromptRenderer):
    """An environment's demonstrations as a supervised batch: its demonstration episodes (:func:`encode_episodes`)."""
    return encode_episodes(tokenizer, env, examples, renderer=renderer, name=renderer.task_name)


def greedy_texts(model, tokenizer, task, examples, max_new_tokens: int, renderer: PromptRenderer | None = None) -> list[str]:
    """A task's greedy answers to ``examples`` (texts, scored later without the model: it may train meanwhile)."""
    was_training = model.training
    model.eval()
    texts = greedy_completions(model, tokenizer, [e.prompt for e in examples], max_new_tokens, renderer=renderer)
    model.train(was_training)
    return texts


def greedy_episodes(model, tokenizer, env, examples, max_new_tokens: int, renderer: PromptRenderer | None = None) -> float:
    """An environment's greedy episodes, which score each turn as they are played: their solved rate
    (:func:`episode_accuracy`)."""
    return episode_accuracy(model, tokenizer, env, examples, max_new_tokens, renderer or PromptRenderer(tokenizer))


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
