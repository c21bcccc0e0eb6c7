"""The episode loop: every rollout of a step, single-turn or multi-turn, as episodes.

:class:`EpisodeRunner` plays one episode per sample of an environment (:mod:`rllab.rollout.environment`)
— a task is an environment of one turn (:class:`rllab.rollout.single_turn.SingleTurn`), so there is one rollout path.

**All episodes of a step are in flight together.** The first turn samples G completions per
prompt with one ``backend.generate`` call (``n = G``); each later turn is *one*
``backend.generate`` call over every live episode's full current ids (``n = 1``), so the ``hf``
backend batches them and ``sglang`` receives them concurrently (its prefix cache holds each
episode's history). Between two turns every live episode's ``step`` is called; steps that are
coroutines are awaited together (one event loop per turn), so a tool that waits does not stall
the batch.

A backend's ``last_metrics`` after each call are summed over the step's calls (a key ending in
``_total`` is a running total: its last value); a completion the backend drops (SGLang's
``stale = "drop"``) drops its episode from the step, as it drops a single-turn sample.

**Token-in/token-out.** An episode's ids are its prompt ids, then each turn's sampled ids (the
stop token included), then each observation's ids — never a re-tokenisation of decoded text:

- with a string prompt, an observation is tokenized as it is (no special tokens);
- with a chat prompt, an observation is a message of ``Step.role`` appended with the chat
  template's own tokens for it: the template renders the history (the prompt's messages and every
  turn so far, as text) with and without the new message, and the difference is appended
  (after the template's end-of-turn glue when the model's turn did not write it). A template
  that rewrites earlier turns (as thinking templates that strip old reasoning do) makes the
  shorter render not a prefix of the longer one: the loop then refuses with an error naming
  the model (give the environment's prompts as strings, or use another template).

A model turn is decoded up to its first stop token; that text is what ``step`` sees.

**Limits and finish reasons.** ``max_turns`` bounds the turns (reaching it without the
environment ending the episode: finish reason ``"max_turns"``, plus ``turn_limit_reward``);
``max_episode_tokens`` — and, for an environment, what the prompt leaves of the model's context
(``context_tokens``) — bounds the response-side tokens (model turns and observations): each turn
samples at most ``min(max_new_tokens, what remains)`` tokens, and an observation that would leave
no token for the next turn ends the episode with ``"overflow"`` (plus ``overflow_reward``) — a
trajectory is never silently truncated. An episode the environment ends finishes with its last
turn's own reason, ``"stop"`` or ``"length"``; one the backend gave up on, or whose step failed
under ``reward_errors = "skip"/"zero"``, with ``"abort"``. The limit rewards sit on the episode's
last model token, like its last turn's reward.

**Errors.** An environment whose ``start`` or ``step`` raises, or whose ``step`` returns
something that is not a :class:`~rllab.rollout.environment.Step` (``Step``'s own validators refuse a
non-string observation or a non-finite reward), raises an :class:`~rllab.errors.EpisodeError`
naming the environment, the example and the turn (``on_error = "raise"``), or ends that episode
with finish reason ``"abort"`` and its ``error`` set (``"skip"``, ``"zero"``: the rollout stage
drops its group or scores it 0).
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Callable, Sequence

import attrs

from rllab.algorithm import seed_for
from rllab.rollout.chat import PromptRenderer, _ids, prompt_text
from rllab.rollout.environment import Step
from rllab.rollout.episode_records import FINISH_REASONS, EpisodeLimits, EpisodeResult  # noqa: F401  (re-exported)
from rllab.rollout.episode_stats import ERROR_ADVICE
from rllab.rollout.stepping import _run_coroutines, one_turn  # noqa: F401  (one_turn: re-exported)
from rllab.errors import EpisodeError, MissingExtraError, PromptError, RllabError
from rllab.members import member
from rllab.types import Completion, Example, SamplingParams


@attrs.define
class _State:
    index: int
    example: Example
    prompt_ids: list[int]
    messages: tuple | None
    """The chat history so far (None: a string prompt)."""
    episode: Any = None
    ids: list[int] = attrs.Factory(list)
    mask: list[bool] = attrs.Factory(list)
    log_probs: list[float] = attrs.Factory(list)
    rewards: list[float] = attrs.Factory(list)
    texts: list[str] = attrs.Factory(list)
    total: float = 0.0
    turns: int = 0
    observation_tokens: int = 0
    last_model: int = -1
    finish: str | None = None
    error: str | None = None
    metrics: dict = attrs.Factory(dict)
    score: tuple = ()
    """The reward components of its last step that gave them (``Step.score``)."""
    weight_version: str | None = None
    single: Completion | None = None
    """The first turn's completion, kept as it is for an episode that ends after it."""
    dropped: bool = False
    budget: int | None = None
    """Its response-side token budget (None: none)."""
    """The backend returned no completion for it (a stale sample dropped): left out of the step."""

    def add(self, ids: Sequence[int], *, model: bool, log_probs: Sequence[float] | None = None) -> None:
        self.ids.extend(ids)
        self.mask.extend([model] * len(ids))
        self.log_probs.extend(log_probs if log_probs is not None else [0.0] * len(ids))
        self.rewards.extend([0.0] * len(ids))
        if model and ids:
            self.last_model = len(self.ids) - 1

    def reward(self, value: float) -> None:
        self.total += value
        if self.last_model >= 0:  # else no model token carries it (a turn that sampled nothing): in the total only
            self.rewards[self.last_model] += value


def _describe(kind: str, name: str, state: _State, turn: int, text: str | None, e: BaseException) -> str:
    seen = f" (model turn {text!r})" if text is not None else ""
    when = f"at turn {turn}" if turn else "when starting its episode"
    return (
        f"{kind} {name!r} failed on example {prompt_text(state.example.prompt)!r} {when}{seen}: "
        f"{type(e).__name__}: {e}."
    )


class EpisodeRunner:
    """Plays a step's episodes of one environment (see the module docstring).

    :param env: the environment (:class:`rllab.rollout.environment.Environment`).
    :param name: its registered name, for messages.
    :param backend: a :class:`rllab.types.RolloutBackend`.
    :param renderer: the run's :class:`rllab.rollout.chat.PromptRenderer` (prompts, stop tokens, decoding).
    :param limits: the :class:`EpisodeLimits`.
    :param on_error: ``rollout.reward_errors``: ``raise``, ``skip`` or ``zero``.
    :param kind: what ``name`` is, for messages (``"environment"``, or ``"task"`` for a :class:`~rllab.rollout.single_turn.SingleTurn`).

    An environment may define ``step_batch(episodes, texts, *, completion_ids) -> list`` (one
    :class:`Step` or exception per live episode): the runner then calls it once per turn instead
    of each episode's ``step`` (batched reward functions), and ``describe_error(example, text,
    turn, error) -> str`` for its failures' messages.
    """

    def __init__(self, env: Any, *, name: str, backend: Any, renderer: PromptRenderer, limits: EpisodeLimits,
                 on_error: str = "raise", kind: str = "environment"):
        self.env = env
        self.name = name
        self.backend = backend
        self.renderer = renderer
        self.limits = limits
        self.on_error = on_error
        self.kind = kind
        self.components = tuple(member(env, "environment", "reward_components"))
        """The reward components each step's ``score`` gives (empty: one reward)."""
        self.timings = {"generate": 0.0, "step": 0.0, "rollout": 0.0}
        """The last :meth:`play`'s seconds: ``generate`` (the backend's calls), ``step`` (the
        environment's steps: scoring) and ``rollout`` (the rest of the play: sampling, decoding)."""
        self.backend_metrics: dict = {}

    # -- the loop

    def play(self, examples: Sequence[Example], params: SamplingParams) -> list[EpisodeResult]:
        """Play ``params.n`` episodes per example, prompt-major (example 0's first); the first
        turn samples with ``params`` (its cap lowered to the token budget), later turns with
        ``n = 1`` and a seed derived from ``params.seed`` and the turn."""
        t_play = time.perf_counter()
        states, pairs = self._first_turn(examples, params)
        return self._rest(states, pairs, params, t_play)

    def play_sampled(self, examples: Sequence[Example], params: SamplingParams) -> Callable[[], list[EpisodeResult]]:
        """:meth:`play` of an environment of one turn in two parts: the answers are sampled and
        decoded now, in the caller's thread; the returned function steps them (a task: scores
        them) and gives what :meth:`play` would have, value for value. It touches neither the
        backend nor the tokenizer, so it may run in another thread while the caller samples on
        (the environment's ``step`` must allow that, as a reward service's does)."""
        if self.limits.max_turns != 1:
            raise RllabError(f"{self.kind} {self.name!r} plays up to {self.limits.max_turns} turns: only an environment of one turn "
                             f"is sampled before it is stepped")
        t_play = time.perf_counter()
        states, pairs = self._first_turn(examples, params)
        texts = self._turn_texts(pairs, 1)
        sampled = time.perf_counter() - t_play

        def finish() -> list[EpisodeResult]:
            t0 = time.perf_counter()
            answers = self._steps(pairs, texts)
            self.timings["step"] += time.perf_counter() - t0
            self._settle_turn(pairs, 1, texts, answers)
            self.timings["rollout"] = sampled
            return [self._result(s) for s in states if not s.dropped]

        return finish

    def _first_turn(self, examples: Sequence[Example], params: SamplingParams) -> tuple[list[_State], list[tuple[_State, Completion]]]:
        """The episodes started and their first turn sampled: (every state, the live ones with their completion)."""
        self.timings = {"generate": 0.0, "step": 0.0}
        self.backend_metrics = {}
        lim = self.limits
        G = params.n
        prompts = [self.renderer.encode(e.prompt) for e in examples]
        if lim.context_tokens is not None:
            for ex, ids in zip(examples, prompts):
                if len(ids) >= lim.context_tokens:
                    raise PromptError(
                        f"{self.kind} {self.name!r}: the prompt of example {prompt_text(ex.prompt)[:80]!r} is {len(ids)} tokens, "
                        f"and {self.renderer.model_name} has a context of {lim.context_tokens}: nothing is left for the "
                        f"model's turns. Use a model with a longer context (the tiny model: model.tiny.max_position_embeddings)"
                    )
        states = []
        for i, ex in enumerate(examples):
            msgs = self.renderer.messages(ex.prompt)
            for _ in range(G):
                states.append(_State(index=i, example=ex, prompt_ids=list(prompts[i]), messages=msgs))
        for s in states:
            try:
                s.episode = self.env.start(s.example)
            except MissingExtraError:
                raise  # the environment's package is not installed: one error naming the install
            except Exception as e:
                self._fail(s, 0, None, e)
            if inspect.isawaitable(s.episode):  # every episode would fail alike: a contract error, whatever reward_errors says
                if hasattr(s.episode, "close"):
                    s.episode.close()  # a coroutine never awaited: no "never awaited" warning on top of the error
                raise EpisodeError(
                    f"{self.kind} {self.name!r}: start(example) returned an awaitable ({type(s.episode).__name__}); start must "
                    f"return the episode itself. Make start a plain def (only an episode's step may be async def: do the "
                    f"waiting in the first step)"
                )
        for s in states:
            s.budget = self._budget(s)
        caps = [self._cap(s) for s in states[::G]]
        first = params if max(caps, default=1) >= params.max_new_tokens else attrs.evolve(params, max_new_tokens=max(caps))
        t0 = time.perf_counter()
        comps = self.backend.generate(prompts, first)
        self.timings["generate"] += time.perf_counter() - t0
        self._collect_metrics()
        pairs = [(s, self._cut(c, self._cap(s)))
                 for s, c in self._match([states[i * G:(i + 1) * G] for i in range(len(examples))], comps) if s.finish is None]
        return states, pairs

    def _rest(self, states: list[_State], pairs: list[tuple[_State, Completion]], params: SamplingParams, t_play: float) -> list[EpisodeResult]:
        """Every turn from the first (sampled) on, until no episode is live."""
        turn = 1
        while pairs:
            self._take_turn(pairs, turn)
            live = [s for s, _ in pairs if s.finish is None]
            if not live:
                break
            turn += 1
            caps = [self._cap(s) for s in live]
            later = attrs.evolve(
                params, n=1, max_new_tokens=max(caps),
                seed=None if params.seed is None else seed_for(params.seed, turn, 3),
            )
            t0 = time.perf_counter()
            comps = self.backend.generate([s.prompt_ids + s.ids for s in live], later)
            self.timings["generate"] += time.perf_counter() - t0
            self._collect_metrics()
            cap_of = {id(s): cap for s, cap in zip(live, caps)}
            pairs = [(s, self._cut(c, cap_of[id(s)])) for s, c in self._match([[s] for s in live], comps)]
        self.timings["rollout"] = time.perf_counter() - t_play - self.timings["step"]  # the play but the environment's steps
        return [self._result(s) for s in states if not s.dropped]

    @staticmethod
    def _match(groups: list[list[_State]], comps: Sequence[Completion]) -> list[tuple[_State, Completion]]:
        """Each completion with the next episode of its prompt (``groups[prompt_index]``); an
        episode left without one (a backend that drops stale samples) is dropped from the step."""
        slots = [list(g) for g in groups]
        out = []
        for c in comps:
            if not 0 <= c.prompt_index < len(slots) or not slots[c.prompt_index]:
                raise RllabError(
                    f"rollout backend returned more completions for prompt {c.prompt_index} than were asked "
                    f"({len(comps)} completions for {sum(map(len, groups))} episodes)"
                )
            out.append((slots[c.prompt_index].pop(0), c))
        for rest in slots:
            for s in rest:
                s.dropped = True
                s.finish = "abort"
        return out

        return [self._result(s) for s in states]

    def _collect_metrics(self) -> None:
        metrics = member(self.backend, "rollout_backend", "last_metrics")
        for k, v in ((metrics() if metrics is not None else None) or {}).items():
            # a step's counters: summed over its turns' calls, but for running totals (``*_total``)
            self.backend_metrics[k] = float(v) + (0.0 if k.endswith("_total") else self.backend_metrics.get(k, 0.0))

    def _budget(self, s: _State) -> int | None:
        """The episode's response-side budget: ``max_episode_tokens``, and what its prompt leaves
        of the model's context (at least 1)."""
        lim = self.limits
        out = lim.max_episode_tokens
        if lim.context_tokens is not None:
            room = max(1, lim.context_tokens - len(s.prompt_ids))
            out = room if out is None else min(out, room)
        return out

    def _cap(self, s: _State) -> int:
        """This turn's most tokens: ``max_new_tokens``, and what the budget leaves."""
        cap = self.limits.max_new_tokens
        return cap if s.budget is None else max(1, min(cap, s.budget - len(s.ids)))

    @staticmethod
    def _cut(c: Completion, cap: int) -> Completion:
        """A turn sampled with a larger cap than its episode's budget leaves, cut to it (the
        first ``cap`` tokens are drawn as a call with that cap would draw them)."""
        if len(c.token_ids) <= cap:
            return c
        return attrs.evolve(c, token_ids=c.token_ids[:cap], log_probs=c.log_probs[:cap], finish_reason="length")

    def _take_turn(self, pairs: list[tuple[_State, Completion]], turn: int) -> None:
        texts = self._turn_texts(pairs, turn)
        t0 = time.perf_counter()
        answers = self._steps(pairs, texts)
        self.timings["step"] += time.perf_counter() - t0
        self._settle_turn(pairs, turn, texts, answers)

    def _turn_texts(self, pairs: list[tuple[_State, Completion]], turn: int) -> list[str]:
        """Each live episode's turn recorded (its sampled tokens) and decoded: the texts its step sees."""
        texts = []
        for s, c in pairs:
            if turn == 1:
                s.single = c
            if s.weight_version is None:  # the first turn's: the oldest weights in the episode (pushes may land between turns)
                s.weight_version = c.weight_version
            s.add(c.token_ids, model=True, log_probs=c.log_probs)
            text = self.renderer.decode(c.token_ids)
            s.texts.append(text)
            texts.append(text)
        return texts

    def _settle_turn(self, pairs: list[tuple[_State, Completion]], turn: int, texts: list[str], answers: list) -> None:
        """Each live episode's step taken: its reward, metrics, and whether and how it ends."""
        lim = self.limits
        for (s, c), text, step in zip(pairs, texts, answers):
            s.turns = turn
            if isinstance(step, BaseException) or not isinstance(step, Step):
                err = step if isinstance(step, BaseException) else TypeError(
                    f"step returned {type(step).__name__} {step!r}, not an rllab.rollout.environment.Step")
                self._fail(s, turn, text, err)
                continue
            try:
                counts = {str(k): float(v) for k, v in dict(step.metrics).items()}
                if step.score and len(step.score) != len(self.components):
                    raise ValueError(f"the step's score has {len(step.score)} values; the environment's reward_components are "
                                     f"{self.components!r}")
                if not step.done and not step.observation and s.messages is not None and turn < lim.max_turns:
                    raise ValueError("the step neither ended the episode nor gave an observation; with a chat prompt the next "
                                     "turn needs a message to answer")
            except (TypeError, ValueError) as e:
                self._fail(s, turn, text, e)
                continue
            s.reward(float(step.reward))
            if step.score:
                s.score = step.score
            for k, v in counts.items():
                s.metrics[k] = s.metrics.get(k, 0.0) + v
            if step.done:
                s.finish = c.finish_reason if c.finish_reason in ("stop", "length") else "abort"
            elif c.finish_reason == "abort":
                s.finish = "abort"
            elif turn >= lim.max_turns:
                s.finish = "max_turns"
                s.reward(lim.turn_limit_reward)
            else:
                obs = self._observation_ids(s, text, c, step)
                if s.budget is not None and len(s.ids) + len(obs) + 1 > s.budget:
                    s.finish = "overflow"
                    s.reward(lim.overflow_reward)
                    continue
                s.add(obs, model=False)
                s.observation_tokens += len(obs)

    def _steps(self, pairs: list[tuple[_State, Completion]], texts: list[str]) -> list:
        """Each live episode's answer to its turn (a Step, or the exception it raised)."""
        batch = member(self.env, "environment", "step_batch")
        if batch is not None:
            try:
                out = list(batch([s.episode for s, _ in pairs], texts, completion_ids=[list(c.token_ids) for _, c in pairs]))
            except MissingExtraError:
                raise  # a package the step needs is not installed: not an episode's failure
            except Exception as e:
                return [e] * len(pairs)
            if len(out) != len(pairs):
                return [TypeError(f"step_batch returned {len(out)} steps for {len(pairs)} episodes")] * len(pairs)
            return out
        out: list = [None] * len(pairs)
        waiting: dict[int, Any] = {}
        for k, ((s, _), text) in enumerate(zip(pairs, texts)):
            try:
                r = s.episode.step(text)
            except MissingExtraError:
                raise  # a package the step needs is not installed: not an episode's failure
            except Exception as e:
                out[k] = e
                continue
            if inspect.isawaitable(r):
                waiting[k] = r
            else:
                out[k] = r
        if waiting:
            for k, r in zip(waiting, _run_coroutines(list(waiting.values()))):
                out[k] = r
        return out

    def _fail(self, s: _State, turn: int, text: str | None, e: BaseException) -> None:
        describe: Callable | None = member(self.env, "environment", "describe_error")
        msg = describe(s.example, text, turn, e) if describe is not None else _describe(self.kind, self.name, s, turn, text, e)
        if self.on_error == "raise":
            raise EpisodeError(f"{msg} {ERROR_ADVICE}") from None
        s.error = msg
        s.finish = "abort"
        s.total = 0.0
        s.rewards = [0.0] * len(s.rewards)
        s.score = ()

    # -- observations

    def _observation_ids(self, s: _State, text: str, c: Completion, step: Step) -> list[int]:
        """The ids appended for ``step``'s observation after the turn ``c`` (see the module docstring)."""
        if not step.observation:  # (a chat prompt's step without one failed in _take_turn)
            return []
        if s.messages is None:
            return list(self.renderer.tokenizer(step.observation, add_special_tokens=False).input_ids)
        tok = self.renderer.tokenizer
        history = (*s.messages, {"role": "assistant", "content": text})
        longer = (*history, {"role": step.role, "content": step.observation})
        try:
            base = _ids(tok.apply_chat_template([dict(m) for m in history], add_generation_prompt=False, tokenize=True))
            full = _ids(tok.apply_chat_template([dict(m) for m in longer], add_generation_prompt=True, tokenize=True))
        except Exception as e:
            raise PromptError(
                f"{self.kind} {self.name!r}: the chat template of {self.renderer.model_name} cannot render an observation "
                f"of role {step.role!r} (example {prompt_text(s.example.prompt)!r}, turn {s.turns}): {type(e).__name__}: {e}"
            ) from None
        if full[: len(base)] != base:
            raise PromptError(
                f"{self.kind} {self.name!r}: the chat template of {self.renderer.model_name} rewrites earlier turns (the render of "
                f"the history is not a prefix of the render with the next {step.role} message), so an episode's ids cannot "
                f"be the concatenation of its turns. Give the environment's prompts as strings (observations are then "
                f"appended as text) or use a model whose template keeps earlier turns as they are."
            )
        # the template's tokens after the assistant's text (its end-of-turn and what follows):
        # those the model did not sample itself lead the observation
        stops = set(self.renderer.stop_ids)
        end = max((i for i, t in enumerate(base) if t in stops), default=len(base))
        sampled_stop = bool(c.token_ids) and c.token_ids[-1] in stops
        glue = base[end + 1:] if sampled_stop else base[end:]
        s.messages = longer
        return glue + full[len(base):]

    # -- results

    def _result(self, s: _State) -> EpisodeResult:
        finish = s.finish or "abort"
        single = s.single is not None and s.turns == 1 and not s.error and finish in ("stop", "length") and len(s.ids) == len(s.single.token_ids)
        if single:
            comp = s.single
        else:
            comp = Completion(
                prompt_ids=tuple(s.prompt_ids), token_ids=tuple(s.ids), log_probs=tuple(s.log_probs), finish_reason=finish,
                prompt_index=s.index, weight_version=s.weight_version, model_mask=tuple(s.mask),
            )
        return EpisodeResult(
            example=s.example, completion=comp, token_rewards=tuple(s.rewards), reward=s.total, turns=s.turns,
            score=s.score,
            texts=tuple(s.texts), metrics=dict(s.metrics), observation_tokens=s.observation_tokens, error=s.error,
            episode=s.episode,
        )
