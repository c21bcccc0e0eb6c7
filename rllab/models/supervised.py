"""Supervised demonstrations and greedy evaluation, for the tiny model's warm start
(:func:`rllab.models.tiny.warm_start`) and for measuring a model's greedy accuracy on a task.

:func:`encode_demonstrations` turns prompts and completions into right-padded rows with a mask
over the completion tokens; :func:`demonstration_loss` is the mean cross-entropy over that mask;
:func:`greedy_completions` decodes greedily up to the renderer's stop tokens; :func:`evaluate_greedy`
and :func:`greedy_accuracy` score those completions with the task (an environment plays greedy
episodes instead, :mod:`rllab.rollout.demonstrations`).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Mapping

import torch

from rllab.members import member
from rllab.rollout.chat import PromptRenderer
from rllab.rollout.demonstrations import (  # noqa: F401  (encode_demonstrations, greedy_completions re-exported: where they were)
    encode_demonstrations, episode_accuracy, greedy_completions, left_padded,
)
from rllab.rollout.rewards import scores_as_known
from rllab.rollout.environment import is_environment  # noqa: F401  (re-exported: where it was)
from rllab.rollout.single_turn import kind_of


def demonstration_loss(model, input_ids, attention_mask, loss_mask) -> torch.Tensor:
    """Mean next-token cross-entropy over the completion tokens (``loss_mask``)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask.long()).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
    return torch.where(loss_mask, nll, torch.zeros_like(nll)).sum() / loss_mask.sum().clamp(min=1)


def evaluate_greedy(
    model, tokenizer, task, *, limit: int | None = None, max_new_tokens: int = 16, renderer: PromptRenderer | None = None,
    examples: list | None = None,
) -> float:
    """Mean reward of greedy completions on (the first ``limit`` of) ``examples``, default
    ``task.eval_examples()``."""
    examples = (task.eval_examples() if examples is None else examples)[:limit]
    if not examples:
        return float("nan")
    return greedy_accuracy(model, tokenizer, task, examples, max_new_tokens, renderer)


def greedy_accuracy(model, tokenizer, task, examples, max_new_tokens: int, renderer: PromptRenderer | None = None, *,
                    scored: dict | None = None) -> float:
    """Mean solved rate of greedy completions of ``examples`` (for an environment: of greedy
    episodes, :func:`rllab.rollout.demonstrations.episode_accuracy`). The answers are scored as
    :func:`probe_rewards` says; ``scored``, kept between calls on the same ``examples``, remembers
    each (example, answer)'s reward, so that a probe scores only the answers that changed."""
    answers = greedy_answers(model, tokenizer, task, examples, max_new_tokens, renderer)
    return solved_rates(task, examples, [answers], scored, renderer)[0]


def greedy_answers(model, tokenizer, task, examples, max_new_tokens: int, renderer: PromptRenderer | None = None):
    """The model's greedy answers to ``examples`` (texts, which :func:`solved_rates` scores without
    the model: it may train meanwhile); for an environment, whose episodes score each turn as they
    are played, the solved rate itself."""
    return kind_of(task).greedy(model, tokenizer, task, examples, max_new_tokens, renderer)


def solved_rates(task, examples, answers: list, scored: dict | None = None, renderer: PromptRenderer | None = None) -> list[float]:
    """The solved rate of each of several probes of ``examples`` (``answers[k]``: probe k's texts,
    or an environment's solved rate, kept as it is). Every answer not yet in ``scored`` is scored
    in one call for all the probes (:func:`probe_rewards`: the same answer to the same example
    once), and a probe whose every answer failed raises :class:`~rllab.errors.RewardError`."""
    scored = {} if scored is None else scored
    _score_pairs(task, examples, [(i, t) for a in answers if isinstance(a, list) for i, t in enumerate(a)], scored)
    return [_solved_rate(task, examples, a, scored, renderer) if isinstance(a, list) else a for a in answers]


def _solved_rate(task, examples, texts: list[str], scored: dict | None, renderer: PromptRenderer | None) -> float:
    from rllab.rollout.accuracy import is_solved, scalar_reward

    outs = probe_rewards(task, examples, texts, scored)
    failed = [(e, t, out) for e, t, out in zip(examples, texts, outs) if isinstance(out, Exception)]
    if failed and len(failed) == len(examples):  # a reward that always fails is broken: say so now, not 0%
        from rllab.rollout.chat import prompt_text
        from rllab.rollout.episode_stats import ERROR_ADVICE
        from rllab.errors import RewardError

        e, t, err = failed[0]
        name = getattr(renderer, "task_name", None) or type(task).__name__
        raise RewardError(
            f"reward of task {name!r} failed on every one of the {len(examples)} examples the warm start measured its "
            f"greedy accuracy on; the first, prompt {prompt_text(e.prompt)!r} with completion {t!r}: "
            f"{type(err).__name__}: {err}. {ERROR_ADVICE}"
        ) from err
    solved = (not isinstance(out, Exception) and is_solved(task, e, scalar_reward(task, out), out if isinstance(out, Mapping) else None)
              for e, out in zip(examples, outs))
    return sum(solved) / len(examples)


def probe_rewards(task, examples: list, texts: list[str], scored: dict | None = None) -> list:
    """What ``task.reward`` gives each of ``examples`` answered by ``texts`` — or the exception it
    raised (a failed answer is not solved): the task's ``reward_batch``, when it has one, called
    once for every answer (so that a reward that asks a server sends them together, each distinct
    one once), each answer alone when that call raises. ``scored`` maps ``(index, text)`` to a
    reward already known (a probe of the same examples before): those are not scored again, and
    the new ones are added."""
    return _score_pairs(task, examples, list(enumerate(texts)), {} if scored is None else scored)


def _score_pairs(task, examples: list, pairs: list[tuple[int, str]], scored: dict, said: dict | None = None) -> list:
    """Per ``(index, text)`` of ``pairs``, its reward (see :func:`probe_rewards`), each distinct
    pair not in ``scored`` scored in one call and added to it. ``said``, when given, receives each
    pair's reward as soon as the reward function says it (:func:`rllab.rollout.rewards.scores_as_known`),
    before the call returns; when that call raises, a pair said keeps its reward and the others
    are scored alone."""
    todo = [k for k in dict.fromkeys(pairs) if k not in scored]
    batch = member(task, "task", "reward_batch") if todo else None
    got = None
    said = {} if said is None else said
    if batch is not None:
        try:
            with scores_as_known(lambda row, value: said.setdefault(todo[row], value) if 0 <= row < len(todo) else None):
                got = list(batch([examples[i] for i, _ in todo], [t for _, t in todo], completion_ids=None))
        except Exception:
            got = None
        if got is not None and len(got) != len(todo):
            got = None
    if got is None:
        with scores_as_known(None):  # one answer a call: its row 0 is not the batch's
            got = [said[k] if k in said else _probe_reward(task, examples[k[0]], k[1]) for k in todo]
    scored.update(zip(todo, got))
    return [scored[k] for k in pairs]


class ProbeScores:
    """The warm start's probes of ``examples`` scored in threads of their own, each (example,
    answer) once over all of them, so that the warm start learns whether a probe reaches a
    target accuracy without waiting for its slowest answer.

    :meth:`submit` starts scoring a probe's answers that no probe before has scored or is
    scoring; :meth:`Probe.verdict` waits until it is sure, from the rewards said so far (a reward
    service says each as its answer comes, :func:`rllab.rollout.rewards.report_score`), that the
    probe's solved rate is below the target or reaches it — so that the next probe's answers can be
    sent while this one's slowest are still out, and none is sent of a probe after the one that ends
    the warm start. Each probe's rate is the one :func:`solved_rates` gives it.

    A probe is scored in the caller's thread, one at a time, until a reward has been said: a
    reward that says nothing gains nothing from a thread, and may need the main one (a timeout by
    signal, as math-verify's). A task whose ``rewards`` (a :class:`rllab.rollout.rewards.RewardSet`,
    as the dataset task's) declares that they say their scores from any thread
    (:attr:`~rllab.rollout.rewards.RewardSet.says_scores`) has even its first probe scored in a
    thread of its own."""

    def __init__(self, task, examples: list, renderer: PromptRenderer | None = None):
        self.task, self.examples, self.renderer = task, examples, renderer
        self.scored: dict = {}  # (index, text) → reward, or the exception it ended in
        self.said: dict = {}  # (index, text) → reward said before its call returned
        self.asking: set = set()  # (index, text) being scored by a probe's thread
        self.changed = threading.Condition()
        self.threads = getattr(getattr(task, "rewards", None), "says_scores", False) is True
        """Whether a probe is scored in a thread of its own from the first."""

    def submit(self, answers) -> "Probe":
        """Start scoring a probe's answers (texts, or an environment's solved rate, kept as it is)."""
        return Probe(self, answers)


class Probe:
    """One probe being scored (:class:`ProbeScores`)."""

    def __init__(self, scores: ProbeScores, answers):
        self.scores = scores
        self.rate = None if isinstance(answers, list) else answers
        self.pairs = list(enumerate(answers)) if isinstance(answers, list) else []
        self.error: BaseException | None = None
        self.solved: dict = {}  # (index, text) → whether its reward solves it
        with scores.changed:
            self.todo = [k for k in dict.fromkeys(self.pairs) if k not in scores.scored and k not in scores.asking]
            scores.asking.update(self.todo)
        self.thread = None
        if self.todo and not (scores.said or scores.threads):  # nothing said yet: in this thread
            self._score()
            if self.error is not None and not isinstance(self.error, Exception):
                raise self.error  # an interruption: at once
        elif self.todo:
            context = contextvars.copy_context()
            self.thread = threading.Thread(target=context.run, args=(self._score,), name="warm-start-probe", daemon=True)
            self.thread.start()

    def _score(self) -> None:
        s = self.scores

        class Said(dict):  # what the reward says of a pair, heard by whoever waits on the probes
            def setdefault(self, key, value):
                with s.changed:
                    out = super().setdefault(key, value)
                    s.said.setdefault(key, value)
                    s.changed.notify_all()
                return out

        scored: dict = {}
        try:
            _score_pairs(s.task, s.examples, self.todo, scored, Said())
        except BaseException as e:
            self.error = e
        finally:
            with s.changed:
                s.scored.update(scored)
                s.asking.difference_update(self.todo)
                if self.error is not None:  # the pairs left unscored count as failed, so that nobody waits for them
                    s.scored.update((k, self.error) for k in self.todo if k not in scored)
                s.changed.notify_all()

    def _is_solved(self, pair, out) -> bool:
        from rllab.rollout.accuracy import is_solved, scalar_reward

        if pair not in self.solved:
            e = self.scores.examples[pair[0]]
            self.solved[pair] = not isinstance(out, Exception) and is_solved(
                self.scores.task, e, scalar_reward(self.scores.task, out), out if isinstance(out, Mapping) else None)
        return self.solved[pair]

    def verdict(self, target: float | None) -> str:
        """``"done"`` once every answer is scored; before that, ``"reached"`` when the rewards
        known already put its solved rate at ``target`` or above, ``"below"`` when even every
        answer still out solved would leave it under ``target`` (with ``target`` None: never
        reached) and some answer has not failed (a probe whose every answer fails stops the warm
        start). Waits until one of those holds."""
        s = self.scores
        missing = object()
        with s.changed:
            while True:
                if self.rate is not None or all(k in s.scored for k in self.pairs):
                    return "done"
                solved = out_still = 0
                answered = False
                for k in self.pairs:
                    out = s.scored.get(k, s.said.get(k, missing))
                    if out is missing:
                        out_still += 1
                    elif not isinstance(out, Exception):
                        answered = True
                        solved += self._is_solved(k, out)
                n = len(self.pairs)
                if target is not None and solved / n >= target:
                    return "reached"
                if answered and (target is None or (solved + out_still) / n < target):
                    return "below"
                s.changed.wait()

    @property
    def finished(self) -> bool:
        return self.thread is None or not self.thread.is_alive()

    def accuracy(self) -> float:
        """Its solved rate, as :func:`solved_rates` gives it, once every answer is scored (waits)."""
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error
        if self.rate is not None:
            return self.rate
        s = self.scores
        with s.changed:  # answers another probe scored: wait for them
            s.changed.wait_for(lambda: all(k in s.scored for k in self.pairs))
            scored = dict(s.scored)
        return _solved_rate(s.task, s.examples, [t for _, t in self.pairs], scored, s.renderer)


def _probe_reward(task, example, text: str):
    """``task.reward(example, text)``, or the exception it raised (a failed answer is not solved)."""
    try:
        return task.reward(example, text)
    except Exception as e:
        return e
