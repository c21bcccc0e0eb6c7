"""Calling an environment's steps: answers sampled apart scored as the one turn of their episodes
(:func:`one_turn`, the rollout stage's), and steps that are coroutines awaited together
(:func:`_run_coroutines`, the episode loop's too). :mod:`rllab.rollout.episodes` publishes these
names too."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, Sequence

from rllab.errors import MissingExtraError
from rllab.members import member
from rllab.rollout.environment import Step
from rllab.types import Example


def _run_coroutines(awaitables: list) -> list:
    """Await ``awaitables`` together on a fresh event loop (in a thread when this one already
    runs a loop); exceptions are returned in place of results."""

    async def together():
        return await asyncio.gather(*awaitables, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(together())
    out: list = []
    thread = threading.Thread(target=lambda: out.append(asyncio.run(together())))
    thread.start()
    thread.join()
    return out[0]


def one_turn(env: Any, examples: Sequence[Example], texts: Sequence[str], completion_ids: Sequence[list[int]]) -> list:
    """Each answer ``texts[i]`` (sampled as ``completion_ids[i]``) as the one turn of an episode of
    ``examples[i]``: the :class:`~rllab.rollout.environment.Step` it gets, or the exception its
    start or step raised (``step_batch`` when the environment has one; steps that are coroutines
    awaited together)."""
    episodes: list = []
    for ex in examples:
        try:
            episodes.append(env.start(ex))
        except MissingExtraError:
            raise
        except Exception as e:
            episodes.append(e)
    live = [i for i, ep in enumerate(episodes) if not isinstance(ep, BaseException)]
    out: list = list(episodes)
    batch = member(env, "environment", "step_batch")
    if batch is not None:
        steps = list(batch([episodes[i] for i in live], [texts[i] for i in live], completion_ids=[list(completion_ids[i]) for i in live]))
    else:
        steps = []
        for i in live:
            try:
                steps.append(episodes[i].step(texts[i]))
            except MissingExtraError:
                raise
            except Exception as e:
                steps.append(e)
        waiting = [k for k, st in enumerate(steps) if inspect.isawaitable(st)]
        for k, st in zip(waiting, _run_coroutines([steps[k] for k in waiting])):
            steps[k] = st
    for i, st in zip(live, steps):
        out[i] = st if isinstance(st, (Step, BaseException)) else TypeError(f"step returned {type(st).__name__}, not a Step")
    return out
