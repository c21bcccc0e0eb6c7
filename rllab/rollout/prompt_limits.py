"""Prompts against the model's context, checked when a run is built (before the first step).

A prompt as long as the model's context (``max_position_embeddings``) leaves no position for the
response; a single-turn prompt plus ``rollout.max_new_tokens`` beyond it samples and trains past
the positions the model was built for. Once the tokenizer exists, :class:`PromptLimits` encodes
the source's prompts as the rollouts will (chat template and system prompt included):

- the held-out examples (``eval_examples()``) and the training rows — every row of a source that
  keeps them in a list ``train`` (the data-set tasks), else a probe of :data:`PROBE` training draws;
- every prompt drawn later, as it is drawn (a generated task's instances are not all known at load).

Without ``rollout.max_prompt_tokens``, a prompt of ``context`` tokens or more is refused
(:class:`~rllab.errors.PromptError`, naming the example, its length, the context and the fix), and
so is a task whose longest prompt plus ``rollout.max_new_tokens`` exceeds the context. An
environment's episodes need no such bound: each turn samples at most what is left of the context
and an episode that would outgrow it ends with ``overflow`` (:mod:`rllab.rollout.episodes`).

With ``rollout.max_prompt_tokens = N``, prompts longer than ``N`` tokens are dropped from training
draws (drawn again: :meth:`PromptLimits.draw`) and from the held-out examples (:meth:`PromptLimits.held_out`); the counts over the rows checked at load are
printed once and recorded in the run's ``final.json`` (``prompts/dropped_train``,
``prompts/dropped_eval``). ``N`` itself must leave room: ``N < context``, and for a task
``N + max_new_tokens ≤ context``.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Sequence

import torch

from rllab.rollout.chat import PromptRenderer, prompt_key, prompt_text
from rllab.errors import ConfigError, PromptError, RllabError
from rllab.members import member
from rllab.rollout.single_turn import kind_of
from rllab.settings import RolloutConfig
from rllab.types import Example

PROBE = 256
"""Training draws checked at load for a source without a ``train`` list."""
REDRAWS = 100
"""Rounds of redrawing a training request whose prompts were dropped before giving up."""
_CACHE = 1 << 16


def _where(ex: Example, index: int, split: str) -> str:
    row = ex.meta.get("row") if isinstance(ex.meta, dict) else None
    head = prompt_text(ex.prompt)[:60]
    return f"{row or ('training draw' if split == 'train' else 'held-out example') + f' {index}'} (prompt {head!r}…)"


class PromptLimits:
    """The prompt-length check and filter of one run (see the module docstring).

    :param source: the run's task or environment.
    :param tokenizer: the run's tokenizer; prompts are encoded as the rollouts encode them, with
        ``rollout.system_prompt`` (``rollout`` is the run's ``[rollout]`` config).
    :param context_tokens: the model's context length; None: no check.
    :param name: the source's registered name.
    :param model_name: the model, for messages (its path, or the tiny model).
    :param announce: print the drop counts (the main rank of a data-parallel run).
    """

    def __init__(self, source: Any, *, tokenizer: Any, rollout: RolloutConfig, context_tokens: int | None, name: str,
                 model_name: str = "the model", announce: bool = True):
        self.source = source
        self.source_kind = kind_of(source)
        self.kind = self.source_kind.name
        self.renderer = PromptRenderer(tokenizer, system_prompt=rollout.system_prompt, task_name=name,
                                       model_name=model_name)
        self.context_tokens = context_tokens
        self.name = name
        self.announce = announce
        self._lengths: dict[str, int] = {}
        self._lock = threading.Lock()  # an asynchronous rollout draws in its own thread
        self._announced: str | None = None
        self.limit: int | None = None
        """The longest prompt kept or allowed (tokens), once :meth:`check` found one; None: no limit."""
        self.drop = False
        """Whether a longer prompt is dropped (``rollout.max_prompt_tokens``) rather than refused."""
        self._new = 0
        self._eval: list[Example] | None = None
        self.counts: dict[str, int] = {}
        """What the last :meth:`check` found with ``rollout.max_prompt_tokens`` set (else {}):
        ``prompts/dropped_train``, ``prompts/dropped_eval`` of ``prompts/checked_train``,
        ``prompts/checked_eval`` rows, and ``prompts/longest_kept`` (tokens)."""

    def length(self, prompt: Any) -> int:
        """The token count of ``prompt`` as the rollouts encode it (cached)."""
        key = prompt_key(prompt)
        with self._lock:
            n = self._lengths.get(key)
            if n is None:
                n = len(self.renderer.encode(prompt))
                if len(self._lengths) >= _CACHE:
                    self._lengths.clear()
                self._lengths[key] = n
        return n

    def _rows(self) -> tuple[list[Example], bool, list[Example]]:
        """(training rows, whether they are all of them, held-out rows)."""
        train = member(self.source, "task", "train")  # a task that holds every row in a list
        if isinstance(train, list) and all(isinstance(e, Example) for e in train):
            return list(train), True, list(self.source.eval_examples())
        probe = list(self.source.train_examples(PROBE, torch.Generator().manual_seed(0)))
        return probe, False, list(self.source.eval_examples())

    def check(self, rollout: RolloutConfig) -> PromptLimits:
        """Check the source's prompts under ``rollout`` (a ``[rollout]`` config) and set the limit
        :meth:`draw` and :meth:`held_out` apply (none when there is no context to check). Raises
        :class:`~rllab.errors.PromptError` / :class:`~rllab.errors.ConfigError` as the module
        docstring says. Returns itself."""
        ctx = self.context_tokens
        cap = rollout.max_prompt_tokens
        self.limit, self.drop, self._eval = None, False, None
        if ctx is None and cap is None:
            return self
        new = rollout.max_new_tokens
        task = self.source_kind.one_response  # a response of up to max_new_tokens follows the prompt
        if task and ctx is not None and new >= ctx:
            raise ConfigError(
                f"rollout.max_new_tokens = {new} is {self.renderer.model_name}'s whole context ({ctx} tokens) or more: a "
                f"response could not follow any prompt; lower it to the context minus the longest prompt, or use a model "
                f"with a longer context (the tiny model: model.tiny.max_position_embeddings)",
                key="max_new_tokens",
            )
        if cap is not None and ctx is not None and (cap >= ctx or (task and cap + new > ctx)):
            need = ctx - new if task else ctx - 1
            raise ConfigError(
                f"rollout.max_prompt_tokens = {cap} leaves no room for the response: the model's context is {ctx} tokens"
                + (f" and rollout.max_new_tokens = {new}" if task else "")
                + f"; set rollout.max_prompt_tokens ≤ {need}" + (" or lower rollout.max_new_tokens" if task else ""),
                key="max_prompt_tokens",
            )
        limit = cap if cap is not None else (ctx - new if task else ctx - 1)
        train, every, evals = self._rows()
        dropped = {"train": 0, "eval": 0}
        longest = 0
        for split, rows in (("train", train), ("eval", evals)):
            for i, ex in enumerate(rows):
                n = self.length(ex.prompt)
                if n <= limit:
                    longest = max(longest, n)
                elif cap is not None:
                    dropped[split] += 1
                else:
                    raise self.too_long(ex, i, split, n, new)
        self.counts = {} if cap is None else {
            "prompts/checked_train": len(train), "prompts/checked_eval": len(evals),
            "prompts/dropped_train": dropped["train"], "prompts/dropped_eval": dropped["eval"], "prompts/longest_kept": longest,
        }
        for split, label, rows in (("train", "training", train), ("eval", "held-out", evals)):
            if rows and dropped[split] == len(rows):
                raise ConfigError(
                    f"rollout.max_prompt_tokens = {cap} drops every one of the {len(rows)} {label} prompts of {self.kind} "
                    f"{self.name!r} checked (the shortest is {min(self.length(e.prompt) for e in rows)} tokens); raise it"
                    + (f" or use a model with a longer context than {ctx}" if ctx is not None else ""),
                    key="max_prompt_tokens",
                )
        if cap is not None:
            self._say(
                f"{self.kind} {self.name!r}: rollout.max_prompt_tokens = {cap} drops {dropped['train']} of {len(train)} "
                f"training prompts{'' if every else ' (a probe of draws)'} and {dropped['eval']} of {len(evals)} held-out "
                f"prompts, those longer than {cap} tokens"
            )
        self.limit, self.drop, self._new = limit, cap is not None, new
        return self

    def _keep(self, rows: Sequence[Example], split: str) -> list[Example]:
        out = []
        for i, ex in enumerate(rows):
            n = self.length(ex.prompt)
            if n <= self.limit:
                out.append(ex)
            elif not self.drop:
                raise self.too_long(ex, i, split, n, self._new)
        return out

    def draw(self, n: int, rng: torch.Generator) -> list[Example]:
        """``n`` training examples of the source drawn with ``rng``, those longer than the limit
        dropped and drawn again (or refused, without ``rollout.max_prompt_tokens``)."""
        if self.limit is None:
            return self.source.train_examples(n, rng)
        out = self._keep(self.source.train_examples(n, rng), "train")
        for _ in range(REDRAWS):
            if len(out) >= n:
                return out[:n]
            out += self._keep(self.source.train_examples(n - len(out), rng), "train")
        if len(out) >= n:
            return out[:n]
        raise RllabError(
            f"{self.kind} {self.name!r}: after {REDRAWS} redraws only {len(out)} of {n} training prompts "
            f"are at most rollout.max_prompt_tokens = {self.limit} tokens; raise it"
        )

    def held_out(self) -> list[Example]:
        """The source's held-out examples that fit the limit (fixed)."""
        if self.limit is None:
            return self.source.eval_examples()
        if self._eval is None:
            self._eval = self._keep(self.source.eval_examples(), "eval")
        return list(self._eval)

    def too_long(self, ex: Example, index: int, split: str, n: int, new: int) -> PromptError:
        """The error for a prompt of ``n`` tokens that does not fit (no ``max_prompt_tokens``)."""
        ctx = self.context_tokens
        model = self.renderer.model_name
        fix = (
            "set rollout.max_prompt_tokens = N to drop longer prompts, or use a model with a longer context (the tiny "
            "model: model.tiny.max_position_embeddings)"
        )
        if n >= ctx:
            what = f"is {n} tokens, and {model} has a context of {ctx}: nothing is left for the response"
        else:
            what = (
                f"is {n} tokens; with rollout.max_new_tokens = {new} a response would run to {n + new} tokens, past the "
                f"context of {model} ({ctx})"
            )
            fix = f"lower rollout.max_new_tokens to {ctx - n} or less, " + fix
        return PromptError(f"{self.kind} {self.name!r}: the prompt of {_where(ex, index, split)} {what}. Fix: {fix}")

    def _say(self, message: str) -> None:
        if self.announce and message != self._announced:
            print(message, file=sys.stderr)
        self._announced = message

    def summary(self) -> dict[str, int]:
        """The counts of the last check for ``final.json`` (empty without ``rollout.max_prompt_tokens``)."""
        return dict(self.counts)
