"""Verifiable toy tasks: addition, chain, countdown, sort, reverse, and prompts read from a JSONL file.

The plugin is split by role: ``tasks`` (environments of one turn), ``environments`` (of several
turns), the reward functions (``rewards``, ``remote_rewards`` + ``reward_service``) and ``samplers``;
``split`` is the held-out split they share.

Every task is an :class:`rllab.SingleTurn`: an environment of one turn, scored by its rubric. Rewards are exact and deterministic: 1.0 when the
decoded completion (the response up to, not including, the end-of-sequence token) is correct,
0.0 otherwise — never partial credit, never an exception on garbage.

Held-out split
--------------
An instance belongs to the evaluation split when a hash of its prompt, salted with the task's
``seed`` knob, falls below ``eval_fraction``::

    is_eval(prompt) = blake2b(f"{seed}\\0{prompt}") / 2**64 < eval_fraction

``train_examples`` draws from the generator it is given and rejects eval instances, so the two
splits are disjoint by construction, whatever the number of training draws. ``eval_examples``
draws with a generator seeded from ``seed`` and keeps the first ``eval_size`` distinct eval
instances (fewer when the instance space is small), so the split is fixed for a given config.

Prompt formats (the tiny character-level model of :mod:`rllab.models.tiny` covers every
character used)::

    addition   "12+34="              -> "46"
    chain      "3+8-5+7="            -> "13"      (a longer, sparser addition: every term must be right)
    countdown  "make 22 from 3 5 7:" -> "3*5+7"   (any expression using each number once; default: 2 numbers)
    sort       "sort 3a1:"           -> "13a"
    reverse    "reverse abc:"        -> "cba"
    jsonl      row["prompt"]         -> row["answer"], scored by ``exact`` / ``contains`` / ``numeric``
    dataset    a local data set (TRL or verl format) scored by reward functions (:mod:`rllab_tasks.tasks.dataset`)
    reasoning_gym  a reasoning-gym procedural data set, scored by its own ``score_answer``

Environments (multi-turn, :mod:`rllab.rollout.environment`, ``env = NAME``): the built-in ones the tiny
model learns (:mod:`rllab_tasks.environments.tools`)::

    calculator  "123*45="      -> <calc(123*45)>, then the product     (a tool the model must call)
    search      "pin of kqz?"  -> <find(kqz,pin)>, then the value      (a per-example key-value store)
    guess       "guess 1-16:"  -> guesses answered higher/lower         (fewer turns, more reward)

and ``textarena``, which plays a single-player textarena game (:mod:`rllab_tasks.environments.textarena`),
``gem``, an environment of the GEM hub by its id (:mod:`rllab_tasks.environments.gem`), ``openenv``, an
environment on an OpenEnv server (:mod:`rllab_tasks.environments.openenv`),
and ``reasoning_gym_retry``, which lets the model retry a reasoning-gym question after feedback
(:mod:`rllab_tasks.environments.reasoning_retry`).

The plugin also registers the built-in reward functions (:mod:`rllab_tasks.rewards`): ``exact``,
``contains``, ``numeric``, ``math_verify``, ``format`` and ``length_penalty``, and two that ask a
server (:mod:`rllab_tasks.remote_rewards`): ``remote`` (a reward service) and ``llm_judge``; and the
built-in prompt samplers (:mod:`rllab_tasks.samplers.pools`, :mod:`rllab_tasks.samplers.curriculum`): ``default``, ``difficulty_pool``,
``advantage_gate`` and ``reasoning_gym_curriculum``.

Several reward components
-------------------------
``addition`` with ``format_weight`` set scores each completion on two named components, as a
task with several reward functions does (see :class:`rllab.SingleTurn`)::

    correct  1.0 when the stripped completion equals the sum, else 0.0
    format   1.0 when the completion is digits only (no sign, space or other character), else 0.0

and its scalar reward is ``correct + format_weight·format`` (``reward_weights = (1,
format_weight)``); ``format_weight < 1`` keeps "solved" equal to "correct". ``gdpo`` and
``normalize_then_sum`` normalise the two components separately; every other estimator sees the
scalar.
"""

from __future__ import annotations

import rllab

from ._former import FORMER as _FORMER

_FORMER.install()  # rllab_tasks.arithmetic and the other module paths before the split: they warn and forward until 1.0

# --------------------------------------------------------------------------- registration


@rllab.hookimpl
def register_tasks(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from .tasks.arithmetic import COMPONENTS, AdditionConfig, ChainConfig, CountdownConfig, addition, chain, countdown
    from .tasks.files import JsonlConfig, jsonl
    from .tasks.dataset import DatasetConfig, dataset, dataset_components
    from .tasks.reasoning import ReasoningGymConfig, reasoning_gym
    from .tasks.strings import StringTaskConfig, reverse, sort

    register(
        "addition", addition, config=AdditionConfig,
        reward_components=lambda config: COMPONENTS if config.format_weight is not None else (),
    )
    register("chain", chain, config=ChainConfig, reward_components=())  # one reward
    register("countdown", countdown, config=CountdownConfig, reward_components=())  # one reward
    register("sort", sort, config=StringTaskConfig, reward_components=())  # one reward
    register("reverse", reverse, config=StringTaskConfig, reward_components=())  # one reward
    register("jsonl", jsonl, config=JsonlConfig, reward_components=())  # one reward
    register("dataset", dataset, config=DatasetConfig, reward_components=dataset_components)
    register("reasoning_gym", reasoning_gym, config=ReasoningGymConfig, reward_components=())  # one reward


@rllab.hookimpl
def register_environments(register):
    from .environments.tools import (
        CalculatorConfig, CalculatorEnvironment, GuessConfig, GuessEnvironment, SearchConfig, SearchEnvironment,
    )

    register("calculator", CalculatorEnvironment, config=CalculatorConfig)
    register("search", SearchEnvironment, config=SearchConfig)
    register("guess", GuessEnvironment, config=GuessConfig)
    # optional libraries: their packages are imported when an environment is built, not here
    from .environments.reasoning_retry import ReasoningGymRetryConfig, reasoning_gym_retry
    from .environments.textarena import TextArenaConfig, textarena_env
    from .environments.gem import GemConfig, gem_env
    from .environments.openenv import OpenEnvConfig, openenv_env

    register("textarena", textarena_env, config=TextArenaConfig)
    register("reasoning_gym_retry", reasoning_gym_retry, config=ReasoningGymRetryConfig)
    register("gem", gem_env, config=GemConfig)
    register("openenv", openenv_env, config=OpenEnvConfig)


@rllab.hookimpl
def register_reward_functions(register):
    from . import remote_rewards, rewards

    rewards.register(register)
    remote_rewards.register(register)


@rllab.hookimpl
def register_samplers(register):
    from .samplers import pools

    pools.register(register)
