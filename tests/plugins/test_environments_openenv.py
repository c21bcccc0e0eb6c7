"""The openenv environment against a real OpenEnv server (openenv-core's create_app) started locally."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("openenv.core.generic_client")

from rllab.types import Example  # noqa: E402
from rllab_tasks.environments.openenv import OpenEnvConfig, OpenEnvError, openenv_env  # noqa: E402

from .. import openenv_server  # noqa: E402


@pytest.fixture(scope="module")
def url():
    return openenv_server.ensure_started()


def _env(url, **knobs):
    return openenv_env(config=OpenEnvConfig(**{"url": url, "eval_size": 4, **knobs}))


def _play(env, example, turns):
    episode = env.start(example)
    return [asyncio.run(episode.step(t)) for t in turns]


def test_an_episode_is_a_session_reset_from_the_seed_with_the_servers_observations_and_rewards(url):
    env = _env(url)
    ex = env.eval_examples()[0]
    assert ex.prompt == "guess 1-8:" and env.max_turns == 8
    [secret] = env.demonstration(ex)
    wrong = "1" if secret != "1" else "2"
    first, last = _play(env, ex, [wrong, secret])
    assert first == type(first)(observation="higher" if int(wrong) < int(secret) else "lower", reward=0.0)
    assert (last.done, last.reward, last.observation) == (True, 1.0, None)
    (bad,) = _play(env, ex, ["no"])
    assert (bad.done, bad.reward) == (True, -0.5)


def test_turns_of_many_episodes_interleave_on_separate_sessions(url):
    env = _env(url, eval_size=6)
    exs = env.eval_examples()
    episodes = [env.start(e) for e in exs]

    async def turn(texts):
        return await asyncio.gather(*(ep.step(t) for ep, t in zip(episodes, texts)))

    demos = [env.demonstration(e)[0] for e in exs]
    out = asyncio.run(turn([str(9 - int(d)) if d != "4" and d != "5" else "1" for d in demos]))  # a wrong guess each
    assert all(not s.done for s in out)
    out = asyncio.run(turn(demos))  # a new event loop for the next turn, as in a run
    assert all(s.done and s.reward == 1.0 for s in out)
    with pytest.raises(OpenEnvError, match="step after the episode ended"):
        asyncio.run(episodes[0].step("1"))


def test_a_prompt_the_seed_does_not_open_with_is_refused(url):
    env = _env(url)
    with pytest.raises(OpenEnvError, match="not deterministic given reset"):
        _play(env, Example(prompt="something else", answer="", meta={"seed": 3}), ["1"])


def test_mistakes_are_named(url):
    with pytest.raises(ValueError, match="url = 'localhost:8000' is not an OpenEnv server's base URL"):
        OpenEnvConfig(url="localhost:8000")
    port = openenv_server._free_port()
    with pytest.raises(OpenEnvError, match=rf"no OpenEnv server answers at url = 'http://127.0.0.1:{port}'"):
        _env(f"http://127.0.0.1:{port}", timeout_s=5.0)
    with pytest.raises(OpenEnvError, match="no text field 'text' .*prompt"):
        _env(url, observation_field="text")


def test_registered_and_passing_the_environment_contract(url):
    import rllab
    from rllab.testing import run_contract

    failed = [(r.check, r.message) for r in run_contract(rllab.Lab(), "environment", "openenv", {"url": url, "eval_size": 4}) if not r.passed]
    assert failed == []


def test_rllab_run_trains_against_the_openenv_server(tmp_path, model_cache, url):
    from rllab.cli import main

    run = tmp_path / "run"
    rc = main(["run", "env=openenv", f"env.url={url}", "env.eval_size=4", "env.max_turns=3", "--steps", "2", "-q", "--run-dir", str(run),
               "rollout.prompts_per_step=2", "rollout.group_size=2", "train.eval_size=4", "model.warm_start.steps=5", "rollout.max_new_tokens=4"])
    assert rc == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["env/turns"] >= 1.0 for r in steps)
