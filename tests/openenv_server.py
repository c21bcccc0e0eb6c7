"""A local OpenEnv server for tests: openenv-core's own ``create_app`` serving a small text game,
run by uvicorn in a daemon thread on 127.0.0.1 (no Docker, no hub).

The game (``GuessServer``): ``reset(seed)`` draws a secret in 1..8 from ``random.Random(seed)``
and asks ``"guess 1-8:"``; each action ``{"message": text}`` is answered ``"higher"`` /
``"lower"`` (reward 0) or ends the episode with reward 1 when ``text.strip()`` is the secret; a
non-number ends it with reward -0.5. The state carries ``demonstration``: the winning turn.
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

_started = threading.Lock()
_server = None


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
