"""The openenv environment's ``reset_kwargs``: arguments every reset gets beside the example's seed
(a server whose reset honours the seed only with them), with the determinism check kept. Against a
fake client always; against the local OpenEnv stand-in server when openenv-core is installed."""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import random
import types

import pytest

from rllab.config import load_config
from rllab.errors import ConfigError
from rllab_tasks.environments import openenv as oe


class FakeClient:
    """openenv-core's GenericEnvClient as the adapter uses it, on a server like OpenEnv's
    reasoning-gym environment: with ``dataset_name`` and ``size`` the seed picks the item, without
    them the seed is ignored. Every reset's arguments are recorded."""

    resets: list[dict] = []

    def __init__(self, base_url, message_timeout_s):
        self.answer = None

    async def reset(self, **kwargs):
        FakeClient.resets.append(dict(kwargs))
        if "dataset_name" in kwargs and "size" in kwargs:
            k = random.Random(kwargs["seed"]).randrange(kwargs["size"])
        else:
            k = random.SystemRandom().randrange(10**6)
        self.answer = k
        return types.SimpleNamespace(observation={"prompt": f"item {k}: answer?"}, reward=None, done=False)

    async def state(self):
        return {"demonstration": [str(self.answer)]}

    async def step(self, action):
        return types.SimpleNamespace(observation={"prompt": ""}, reward=float(action["message"] == str(self.answer)), done=True)

    async def close(self):
        pass


@pytest.fixture
def fake(monkeypatch):
    FakeClient.resets = []
    monkeypatch.setattr(oe, "_client_class", lambda: FakeClient)
    return FakeClient


def test_every_reset_gets_the_seed_and_the_reset_arguments(fake):
    env = oe.openenv_env(config=oe.OpenEnvConfig(url="http://x:1", eval_size=3, reset_kwargs={"dataset_name": "legs", "size": 50}))
    exs = env.eval_examples()
    # each example's prompt is the item its seed picks among 50, as the server draws it
    assert [e.prompt for e in exs] == [f"item {random.Random(e.meta['seed']).randrange(50)}: answer?" for e in exs]
    assert all(r == {"seed": r["seed"], "dataset_name": "legs", "size": 50} for r in fake.resets)
    fake.resets.clear()
    ex = exs[0]
    [answer] = env.demonstration(ex)
    step = asyncio.run(env.start(ex).step(answer))
    assert (step.done, step.reward) == (True, 1.0)
    # the episode's own session was reset with the same seed and arguments (and the opening checked against the example)
    assert {"seed": ex.meta["seed"], "dataset_name": "legs", "size": 50} in fake.resets
    assert all(set(r) == {"seed", "dataset_name", "size"} for r in fake.resets)


def test_without_them_a_server_that_ignores_the_seed_is_refused_naming_the_knob(fake):
    env = oe.openenv_env(config=oe.OpenEnvConfig(url="http://x:1", eval_size=2))
    ex = env.eval_examples()[0]
    assert fake.resets[0] == {"seed": fake.resets[0]["seed"]}  # only the seed was sent
    with pytest.raises(oe.OpenEnvError, match=r"not deterministic given reset\(seed=\.\.\.\)\); .* env.reset_kwargs"):
        asyncio.run(env.start(ex).step("1"))


def test_reset_arguments_are_checked_when_the_config_loads():
    base = ["env=openenv", "env.url=http://127.0.0.1:9"]
    cfg = load_config(None, [*base, 'env.reset_kwargs={dataset_name="leg_counting", size=1000}'])
    assert cfg.components["env"].config.reset_kwargs == {"dataset_name": "leg_counting", "size": 1000}
    assert load_config(None, [*base, "env.reset_kwargs.size=10"]).components["env"].config.reset_kwargs == {"size": 10}
    with pytest.raises(ConfigError, match="the seed is sent from each example"):
        load_config(None, [*base, "env.reset_kwargs={seed=3}"])
    with pytest.raises(ConfigError, match=r"reset_kwargs = 'dataset_name=x' has the wrong type: .*expected a table"):
        load_config(None, [*base, "env.reset_kwargs=dataset_name=x"])
    with pytest.raises(ValueError, match="cannot be sent to the server as JSON"):
        oe.OpenEnvConfig(url="http://x:1", reset_kwargs={"when": datetime.date(2025, 1, 1)})


@pytest.mark.skipif(importlib.util.find_spec("openenv") is None, reason="openenv-core is not installed (pip install 'rllab[openenv]')")
def test_against_a_local_server_whose_reset_needs_arguments():
    from .. import openenv_server

    url = openenv_server.ensure_started_sized()
    env = oe.openenv_env(config=oe.OpenEnvConfig(url=url, eval_size=4, reset_kwargs={"dataset_name": "legs", "size": 50}))
    exs = env.eval_examples()
    assert [e.prompt for e in exs] == [f"legs item {random.Random(e.meta['seed']).randrange(50)} of 50: answer?" for e in exs]
    for ex in exs[:2]:
        [answer] = env.demonstration(ex)
        assert asyncio.run(env.start(ex).step(answer)).reward == 1.0
    plain = oe.openenv_env(config=oe.OpenEnvConfig(url=url, eval_size=2))
    with pytest.raises(oe.OpenEnvError, match="not deterministic given reset"):
        asyncio.run(plain.start(plain.eval_examples()[0]).step("1"))
