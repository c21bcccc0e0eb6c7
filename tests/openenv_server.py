"""A local OpenEnv server for tests: openenv-core's own ``create_app`` serving a small text game,
run by uvicorn in a daemon thread on 127.0.0.1 (no Docker, no hub).

The game (``GuessServer``): ``reset(seed)`` draws a secret in 1..8 from ``random.Random(seed)``
and asks ``"guess 1-8:"``; each action ``{"message": text}`` is answered ``"higher"`` /
``"lower"`` (reward 0) or ends the episode with reward 1 when ``text.strip()`` is the secret; a
non-number ends it with reward -0.5. The state carries ``demonstration``: the winning turn.

A second server (:func:`ensure_started_sized`, at :data:`SIZED_URL`) stands in for environments
whose ``reset`` needs arguments to honour the seed, as OpenEnv's reasoning-gym environment does:
``reset(seed, dataset_name, size)`` opens with ``"<dataset_name> item <k> of <size>: answer?"``, k
drawn from ``random.Random(seed)``; without ``dataset_name`` and ``size`` it ignores the seed and
draws k at random. The answer is ``k``.
"""

from __future__ import annotations

import random
import socket
import threading
import time

URL_HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((URL_HOST, 0))
        return s.getsockname()[1]


PORT = _free_port()
URL = f"http://{URL_HOST}:{PORT}"
"""The server's base URL (fixed when this module is imported; the server starts on :func:`ensure_started`)."""

SIZED_PORT = _free_port()
SIZED_URL = f"http://{URL_HOST}:{SIZED_PORT}"
"""The base URL of the server whose reset needs arguments (:func:`ensure_started_sized`)."""

_started = threading.Lock()
_server = None
_servers: dict = {}


def build_app():
    from openenv.core.env_server import Action, Environment, Observation, State, create_app

    class GuessAction(Action):
        message: str

    class GuessObservation(Observation):
        prompt: str = ""

    class GuessServer(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State()
            self.secret = 0

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.secret = random.Random(seed).randint(1, 8)
            self._state = State(episode_id=episode_id, step_count=0, demonstration=[str(self.secret)])
            return GuessObservation(prompt="guess 1-8:", done=False, reward=0.0)

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            text = action.message.strip()
            if not text.isdigit():
                return GuessObservation(prompt="", done=True, reward=-0.5)
            if int(text) == self.secret:
                return GuessObservation(prompt="", done=True, reward=1.0)
            return GuessObservation(prompt="higher" if int(text) < self.secret else "lower", done=False, reward=0.0)

        @property
        def state(self):
            return self._state

    return create_app(GuessServer, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=256)


def build_sized_app():
    from openenv.core.env_server import Action, Environment, Observation, State, create_app

    class SizedAction(Action):
        message: str

    class SizedObservation(Observation):
        prompt: str = ""

    class SizedServer(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State()
            self.answer = -1

        def reset(self, seed=None, episode_id=None, dataset_name=None, size=None, **kwargs):
            if dataset_name is None or size is None:  # the seed is ignored: a fresh draw every time
                name, n, k = "default", 1000, random.SystemRandom().randrange(1000)
            else:
                name, n, k = dataset_name, int(size), random.Random(seed).randrange(int(size))
            self.answer = k
            self._state = State(episode_id=episode_id, step_count=0, demonstration=[str(k)])
            return SizedObservation(prompt=f"{name} item {k} of {n}: answer?", done=False, reward=0.0)

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            right = action.message.strip() == str(self.answer)
            return SizedObservation(prompt="", done=True, reward=1.0 if right else 0.0)

        @property
        def state(self):
            return self._state

    return create_app(SizedServer, SizedAction, SizedObservation, env_name="sized", max_concurrent_envs=256)


def ensure_started_sized() -> str:
    """Start the server whose reset needs arguments (once per process) and return its URL."""
    with _started:
        if "sized" not in _servers:
            import uvicorn

            server = uvicorn.Server(uvicorn.Config(build_sized_app(), host=URL_HOST, port=SIZED_PORT, log_level="critical"))
            threading.Thread(target=server.run, name="openenv-test-sized-server", daemon=True).start()
            _servers["sized"] = server
        deadline = time.monotonic() + 30
        while not _servers["sized"].started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test OpenEnv server did not start on {SIZED_URL}")
            time.sleep(0.05)
    return SIZED_URL


def ensure_started() -> str:
    """Start the server (once per process) and return its URL when it accepts connections."""
    global _server
    with _started:
        if _server is None:
            import uvicorn

            _server = uvicorn.Server(uvicorn.Config(build_app(), host=URL_HOST, port=PORT, log_level="critical"))
            threading.Thread(target=_server.run, name="openenv-test-server", daemon=True).start()
        deadline = time.monotonic() + 30
        while not _server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test OpenEnv server did not start on {URL}")
            time.sleep(0.05)
    return URL
