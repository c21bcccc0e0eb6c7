"""``openenv``: an environment served by an OpenEnv server, played through OpenEnv's own client
(``pip install rllab[openenv]``, tested with openenv-core 0.3.0).

``env.url`` is the server's base URL (``http://localhost:8000``: a server started with
``uvicorn``/``openenv serve``, a local container or a Space). Each episode is one OpenEnv session
(``GenericEnvClient``, a WebSocket the server gives its own environment instance):

- the opening prompt is the text of ``await client.reset(seed=example.meta["seed"], **reset_kwargs)``'s
  observation: its field ``observation_field`` (``""``: its only text field); ``reset_kwargs``
  (``env.reset_kwargs = {dataset_name = "leg_counting", size = 1000}``) carries the arguments a
  server's ``reset`` needs beside the seed (OpenEnv's reasoning-gym environment ignores the seed
  without them);
- each model turn is sent as the action ``{action_field: turn}`` (``await client.step(...)``); the
  observation's text is appended, the step's ``reward`` (None: 0) lands on the turn's last token,
  and the episode ends when the server says ``done`` (the session is then closed);
- an episode is solved when its total reward is ≥ 1.

OpenEnv's client is async and keeps its WebSocket on the event loop that opened it, while a run
awaits each turn's steps on a loop of its own: every client call therefore runs on one event loop
in a background thread of this module, and an episode's ``step`` awaits it from whatever loop
the caller has.

Examples are seeds (split as in :mod:`rllab_tasks.environments.textarena`); an example's prompt is what
the server answers to ``reset(seed)``, so the server must be deterministic given the seed (a
session whose opening differs is refused). Demonstrations (the tiny model's warm start, ``rllab
check``): a server that puts a list of model turns under ``demonstration_key`` in its state
(``await client.state()`` after the reset) has them; otherwise the warm start defaults to 0 steps.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import weakref

import attrs

import rllab
from rllab.rollout.environment import Step
from rllab.errors import NoDemonstrationError
from rllab.types import Example

from ..split import SeededExamples, eval_fraction_knob, eval_size_knob, seed_knob


class OpenEnvError(rllab.RllabError):
    """An OpenEnv server broke the environment protocol (no text in an observation, a bad reward)."""


MISSING = "the openenv environment needs the openenv-core package: pip install 'rllab[openenv]'"


def _installed() -> None:
    """Refuse, naming the ``pip install``, when openenv-core is not installed: asked before a run
    creates anything (:func:`rllab.training.parts.check_installed`)."""
    if importlib.util.find_spec("openenv") is None:
        raise rllab.MissingExtraError(MISSING)


def _client_class():
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as e:
        raise rllab.MissingExtraError(f"{MISSING} ({e})") from None
    return GenericEnvClient


def _reset_kwargs(inst, attribute, value):
    import json

    if "seed" in value:
        raise ValueError("reset_kwargs = {...seed...}: the seed is sent from each example (set env.seed to change the split), "
                         "leave it out of reset_kwargs")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"reset_kwargs = {value!r} cannot be sent to the server as JSON: {e}") from None


def _url(inst, attribute, value):
    if not value.startswith(("http://", "https://", "ws://", "wss://")):
        raise ValueError(f"url = {value!r} is not an OpenEnv server's base URL: give http://HOST:PORT (or ws://, https://)")


@attrs.frozen
class OpenEnvConfig:
    """Knobs of the openenv environment."""

    url: str = rllab.knob(help="the OpenEnv server's base URL, e.g. http://localhost:8000 (required)", validator=_url)
    action_field: str = rllab.knob("message", help="the action's field that carries the model's turn: the action sent is {action_field: turn}")
    observation_field: str = rllab.knob("", help="the observation's field holding its text; '' = its only text field")
    demonstration_key: str = rllab.knob(
        "demonstration", help="the server state's field with a demonstration (a list of model turns) after reset; absent: none"
    )
    reset_kwargs: dict = rllab.knob(
        factory=dict, validator=_reset_kwargs,
        help="more arguments of every reset, beside the example's seed: a table, e.g. {dataset_name = 'leg_counting', "
        "size = 1000} (a server whose reset honours the seed only with them); the seed is always sent",
    )
    max_turns: int = rllab.knob(8, help="the most model turns of an episode", ge=1)
    timeout_s: float = rllab.knob(60.0, help="seconds to wait for the server's answer to one message", gt=0.0)
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = eval_size_knob()
    seed: int = seed_knob()


class _Loop:
    """The event loop, in a daemon thread, on which every OpenEnv client of the process runs."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="rllab-openenv", daemon=True).start()
                cls._loop = loop
            return cls._loop

    @classmethod
    def run(cls, coro, timeout: float):
        """Run ``coro`` on the client loop and wait for it (from code that is not a coroutine)."""
        return asyncio.run_coroutine_threadsafe(coro, cls.get()).result(timeout)

    @classmethod
    async def wait(cls, coro):
        """Run ``coro`` on the client loop and await it from the caller's own loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, cls.get()))


def _close_later(box: list) -> None:
    """Close the session in ``box`` (an episode dropped before its end), without waiting."""
    client, box[:] = (box[0] if box else None), []
    if client is not None and _Loop._loop is not None:
        asyncio.run_coroutine_threadsafe(client.close(), _Loop._loop)


class OpenEnvEpisode:
    """One OpenEnv session, reset from the example's seed at the first step."""

    def __init__(self, env: "OpenEnvEnvironment", example: Example):
        self.env, self.example = env, example
        self.name = f"openenv {env.config.url} seed {example.meta['seed']}"
        self.done = False
        self._box: list = []  # the client, once connected
        weakref.finalize(self, _close_later, self._box)

    async def _open(self):
        client = _client_class()(base_url=self.env.config.url, message_timeout_s=self.env.config.timeout_s)
        self._box.append(client)
        result = await client.reset(seed=self.example.meta["seed"], **self.env.config.reset_kwargs)
        if self.env.text(result.observation, self.name) != self.example.prompt:
            given = ", ".join(f"{k}={v!r}" for k, v in self.env.config.reset_kwargs.items())
            raise OpenEnvError(
                f"{self.name}: the server opened with a different prompt than when the example was drawn "
                f"(it is not deterministic given reset(seed=...{', ' + given if given else ''})); a server whose reset "
                "honours the seed only with more arguments takes them from env.reset_kwargs"
            )
        return client

    async def _step(self, text: str) -> Step:
        client = self._box[0] if self._box else await self._open()
        result = await client.step({self.env.config.action_field: text})
        reward = _reward(result.reward, self.name)
        if result.done:
            self.done = True
            _close_later(self._box)
            return Step(reward=reward, done=True)
        return Step(observation=self.env.text(result.observation, self.name) or None, reward=reward)

    async def step(self, text: str) -> Step:
        if self.done:
            raise OpenEnvError(f"{self.name}: step after the episode ended")
        return await _Loop.wait(self._step(text))

    def close(self) -> None:
        """Close the session (an episode cut by a limit before the server said done)."""
        _close_later(self._box)


def _reward(value, name: str) -> float:
    if value is None:
        return 0.0
    if not isinstance(value, (bool, int, float)):
        raise OpenEnvError(f"{name}: the server sent the reward {value!r}, not a number")
    return float(value)


class OpenEnvEnvironment(SeededExamples, rllab.Environment):
    """An environment on an OpenEnv server: an example is a seed, an episode is one session."""

    name = "openenv"

    def __init__(self, config: OpenEnvConfig):
        _client_class()
        self.config = config
        self.max_turns = config.max_turns
        self._probe: list = []  # one session for drawing examples (reset after reset), closed with the environment
        self._probe_lock = threading.Lock()
        weakref.finalize(self, _close_later, self._probe)
        self._eval: list[Example] | None = None
        first = self._opening(0)
        self._has_demos = isinstance(first[1].get(config.demonstration_key), (list, tuple))
        if not self._has_demos:
            self.warm_start_defaults = {"steps": 0}

    def text(self, observation, name: str) -> str:
        """The observation's text: its ``observation_field``, else its only text field."""
        if not isinstance(observation, dict):
            raise OpenEnvError(f"{name}: the observation {observation!r} is not an object")
        field = self.config.observation_field
        if not field:
            texts = [k for k, v in observation.items() if isinstance(v, str)]
            if len(texts) != 1:
                raise OpenEnvError(
                    f"{name}: the observation has {len(texts)} text fields ({', '.join(texts) or 'none'}; all fields: "
                    f"{', '.join(observation) or 'none'}): set env.observation_field to the one the model reads"
                )
            field = texts[0]
        value = observation.get(field)
        if not isinstance(value, str):
            raise OpenEnvError(f"{name}: the observation has no text field {field!r} (its fields: {', '.join(observation) or 'none'})")
        return value

    def _opening(self, seed: int) -> tuple[str, dict]:
        """The prompt and the state of the server's ``reset(seed)``, on the environment's own session."""

        async def reset():
            if not self._probe:
                self._probe.append(_client_class()(base_url=self.config.url, message_timeout_s=self.config.timeout_s))
            result = await self._probe[0].reset(seed=seed, **self.config.reset_kwargs)
            state = await self._probe[0].state()
            return result.observation, state if isinstance(state, dict) else {}

        try:
            with self._probe_lock:
                observation, state = _Loop.run(reset(), timeout=self.config.timeout_s + 15.0)
        except (ConnectionError, OSError, TimeoutError) as e:
            raise OpenEnvError(f"environment 'openenv': no OpenEnv server answers at url = {self.config.url!r}: {e}") from e
        return self.text(observation, f"openenv {self.config.url} seed {seed}"), state

    def example(self, seed: int) -> Example:
        return Example(prompt=self._opening(seed)[0], answer="", meta={"seed": seed})

    def start(self, example: Example) -> OpenEnvEpisode:
        """An episode whose session opens (and resets from the example's seed) at its first step."""
        return OpenEnvEpisode(self, example)

    def demonstration(self, example: Example) -> list[str]:
        """The turns the server's state holds under ``demonstration_key`` after ``reset(seed)``."""
        prompt, state = self._opening(example.meta["seed"])
        turns = state.get(self.config.demonstration_key)
        if not isinstance(turns, (list, tuple)) or not all(isinstance(t, str) for t in turns):
            raise NoDemonstrationError(
                f"environment 'openenv': the server at {self.config.url} has no demonstration in its state's "
                f"{self.config.demonstration_key!r} field; set model.warm_start.steps=0 or train a model of your own (model.path=...)"
            )
        return list(turns)

    def __repr__(self):
        return f"<environment {self.name!r} {self.config!r}>"


def openenv_env(*, config: OpenEnvConfig) -> OpenEnvEnvironment:
    """An environment on an OpenEnv server (openenv-core's client), one session per episode."""
    return OpenEnvEnvironment(config)


openenv_env.check_installed = _installed
