"""The contract checks of environments (``rllab check ENV``), registered with
:mod:`rllab.testing.checks`'s registry (see :mod:`rllab.testing`).

Episodes are played through the real episode loop (:mod:`rllab.rollout.episodes`) with the
environment's demonstrations as the model turns, tokenized by the tiny model's tokenizer (the
character one for string prompts, the chat one for chat prompts): no model is needed.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from rllab.testing.checks import ContractSkip, _check, _gen
from rllab.members import member


class _Recorder:
    """The environment, with every step's answer recorded per episode (in turn order)."""

    def __init__(self, env: Any, fail_at: int | None = None):
        self.env = env
        self.fail_at = fail_at
        self.max_turns = member(env, "environment", "max_turns")
        self.steps: list[list] = []

    def __getattr__(self, name):  # train_examples, eval_examples, demonstration, solved, tools
        if name == "step_batch":
            raise AttributeError(name)
        return getattr(self.env, name)

    def start(self, example):
        inner = _episode(self.env, example)
        log: list = []
        self.steps.append(log)
        outer = self

        class Recorded:
            def step(self, text):
                if outer.fail_at is not None and len(log) + 1 >= outer.fail_at:
                    raise RuntimeError("contract probe: a failing step")
                out = inner.step(text)
                if inspect.isawaitable(out):  # async def step: awaited by the episode loop, as in a run
                    return _recorded(out, log)
                log.append(out)
                return out

        return Recorded()


def _episode(env: Any, example: Any) -> Any:
    """``env.start(example)``, refused when it is an awaitable: the episode loop starts episodes
    synchronously (only an episode's ``step`` may be ``async def``)."""
    episode = env.start(example)
    if inspect.isawaitable(episode):
        close = getattr(episode, "close", None)
        if close is not None:
            close()  # a coroutine never awaited: no "never awaited" warning on top of the error
        raise AssertionError(
            f"start(example) returned an awaitable ({type(episode).__name__}): start must return the "
            "episode itself (make start a plain def; only an episode's step may be async def, so do the "
            "waiting in the first step)"
        )
    return episode


async def _recorded(awaitable: Any, log: list) -> Any:
    """``awaitable``'s step, appended to ``log`` once it is there."""
    out = await awaitable
    log.append(out)
    return out


def _setup(comp):
    from rllab.rollout.chat import PromptRenderer
    from rllab.models.tokenizer import build_chat_tokenizer, build_tokenizer

    env = comp()
    examples = env.train_examples(4, _gen(0))
    if not examples:
        raise AssertionError("train_examples(4, rng) returned no examples")
    _episode(env, examples[0])
    chat = any(not isinstance(e.prompt, str) for e in examples)
    tok = build_chat_tokenizer() if chat else build_tokenizer()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return env, examples, tok, PromptRenderer(tok, task_name=comp.name, model_name="the tiny model's tokenizer")


def _demos(comp, env, examples, renderer, **kw):
    from rllab.rollout.demonstrations import demonstration_episodes

    rec = _Recorder(env)
    eps = demonstration_episodes(rec, examples, renderer, name=comp.name, **kw)
    return rec, eps


@_check("environment", "deterministic examples and episodes given a seed")
def _env_deterministic(comp):
    env, examples, tok, renderer = _setup(comp)
    again = env.train_examples(4, _gen(0))
    if [e.prompt for e in examples] != [e.prompt for e in again]:
        raise AssertionError("train_examples is not deterministic given the generator state")
    if not env.eval_examples():
        raise AssertionError("eval_examples is empty")
    _, a = _demos(comp, env, examples, renderer)
    _, b = _demos(comp, comp(), again, renderer)
    for x, y in zip(a, b):
        if x.completion.token_ids != y.completion.token_ids or x.token_rewards != y.token_rewards:
            raise AssertionError(f"two plays of the demonstration of {x.example.prompt!r} differ")


@_check("environment", "ids are the concatenation of turns and observations; model tokens only in the loss mask; finite rewards")
def _env_ids(comp):
    from rllab.rollout.stage import episode_batch

    env, examples, tok, renderer = _setup(comp)
    rec, eps = _demos(comp, env, examples, renderer)
    for ep, steps in zip(eps, rec.steps):
        c = ep.completion
        model = c.model_mask or (True,) * len(c.token_ids)
        turns = [renderer.response_ids(t, prompt=ep.example.prompt) for t in ep.texts]
        got = [t for t, m in zip(c.token_ids, model) if m]
        if got != [t for ids in turns for t in ids]:
            raise AssertionError(f"the model tokens of the episode of {ep.example.prompt!r} are not its turns' ids")
        if isinstance(ep.example.prompt, str):
            want = []
            for k, ids in enumerate(turns):
                want += ids
                if k < ep.turns - 1 and steps[k].observation:
                    want += list(tok(steps[k].observation, add_special_tokens=False).input_ids)
            if list(c.token_ids) != want:
                raise AssertionError(f"the ids of the episode of {ep.example.prompt!r} are not turn + observation ids in order")
        if not all(math.isfinite(r) for r in ep.token_rewards) or not math.isfinite(ep.reward):
            raise AssertionError(f"a non-finite reward in the episode of {ep.example.prompt!r}")
        if abs(sum(ep.token_rewards) - ep.reward) > 1e-6:
            raise AssertionError(f"the placed rewards of {ep.example.prompt!r} do not add up to its total")
    batch = episode_batch(eps, pad_token_id=tok.pad_token_id)
    for i, e in enumerate(eps):
        model = list(e.completion.model_mask or (True,) * len(e.completion.token_ids))
        if batch.response_mask[i, : len(model)].tolist() != model or batch.response_mask[i, len(model):].any():
            raise AssertionError("the loss mask is not the episode's model tokens")
        if bool((batch.token_rewards[i] != 0).logical_and(~batch.response_mask[i]).any()):
            raise AssertionError("a reward sits on a token that is not the model's")


@_check("environment", "limits respected: max_turns and the token budget")
def _env_limits(comp):
    env, examples, tok, renderer = _setup(comp)
    turns = member(env, "environment", "max_turns")
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise AssertionError(f"max_turns = {turns!r}: an episode needs a bound on its turns, an integer ≥ 1 (a run refuses it)")
    _, eps = _demos(comp, env, examples, renderer, max_turns=1)
    for e in eps:
        if e.turns != 1 or e.finish_reason not in ("stop", "length", "max_turns"):
            raise AssertionError(f"with max_turns = 1 an episode took {e.turns} turns (finish {e.finish_reason!r})")
    from rllab.rollout.demonstrations import ScriptedBackend
    from rllab.rollout.episodes import EpisodeLimits, EpisodeRunner
    from rllab.types import SamplingParams

    scripts = [list(env.demonstration(e)) for e in examples]
    budget = max(len(renderer.response_ids(s[0], prompt=e.prompt)) for s, e in zip(scripts, examples)) + 1
    runner = EpisodeRunner(env, name=comp.name, backend=ScriptedBackend(renderer, scripts, [e.prompt for e in examples]),
                           renderer=renderer, limits=EpisodeLimits(max_turns=max(1, max(map(len, scripts))), max_new_tokens=budget,
                                                                   max_episode_tokens=budget))
    try:
        eps = runner.play(examples, SamplingParams(n=1, max_new_tokens=budget, temperature=0.0))
    except Exception as e:
        if "did not end after them" in str(e):
            raise ContractSkip("a demonstration cut by the budget cannot go on") from None
        raise
    for e in eps:
        if len(e.completion.token_ids) > budget:
            raise AssertionError(f"an episode has {len(e.completion.token_ids)} tokens over the budget of {budget}")


@_check("environment", "a raising environment is named with the example and turn, handled per reward_errors")
def _env_raises(comp):
    from rllab.rollout.demonstrations import ScriptedBackend
    from rllab.rollout.episodes import EpisodeLimits, EpisodeRunner
    from rllab.errors import EpisodeError
    from rllab.types import SamplingParams

    env, examples, tok, renderer = _setup(comp)
    ex = examples[:1]
    script = [list(env.demonstration(ex[0]))]

    def play(on_error):
        runner = EpisodeRunner(_Recorder(env, fail_at=1), name=comp.name, backend=ScriptedBackend(renderer, script, [ex[0].prompt]),
                               renderer=renderer, limits=EpisodeLimits(max_turns=1, max_new_tokens=64), on_error=on_error)
        return runner.play(ex, SamplingParams(n=1, max_new_tokens=64, temperature=0.0))

    try:
        play("raise")
    except EpisodeError as e:
        from rllab.rollout.chat import prompt_text

        for part in (repr(comp.name), repr(prompt_text(ex[0].prompt)), "turn 1"):
            if part not in str(e):
                raise AssertionError(f"the error does not name {part}: {e}") from None
    else:
        raise AssertionError("a step that raises did not stop the episode loop under reward_errors = 'raise'")
    (out,) = play("zero")
    if out.error is None or out.reward != 0.0 or out.finish_reason != "abort":
        raise AssertionError(f"under reward_errors = 'zero' a failed episode scored {out.reward} ({out.finish_reason})")
