"""``launch = true``: start ``python -m sglang.launch_server`` (``launch_command`` overrides it),
print the command, wait for ``/health``; stop the server (its whole process group) in ``close()``
or, if the run dies without it, at exit."""

from __future__ import annotations

import atexit
import functools
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

from .errors import SGLangUnavailableError


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM a launched server's process group, SIGKILL it if it has not exited in 30 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


class Launch:
    """A launched server of :class:`~rllab_backends.sglang.backend.SGLangBackend` (a part of it).
    Uses the backend's ``config``, ``_loop`` and ``_healthy``; sets ``_process`` and, when the
    config names none, ``urls`` and ``admin_urls``."""

    def launch_command(self, model_path: str, port: int, weight_version: str) -> list[str]:
        """The server command ``launch`` runs, as an argument list."""
        cmd = self.config.launch_command.format(
            python=shlex.quote(sys.executable),
            model_path=shlex.quote(model_path),
            host="127.0.0.1",
            port=port,
            weight_version=shlex.quote(weight_version),
        )
        return shlex.split(cmd) + shlex.split(self.config.launch_args)

    def _launch(self, model_path: str, version: str) -> None:
        port = free_port()
        cmd = self.launch_command(model_path, port, version)
        url = f"http://127.0.0.1:{port}"
        print(f"rllab sglang: launching {shlex.join(cmd)}", file=sys.stderr, flush=True)
        self._process = subprocess.Popen(cmd, start_new_session=True)
        self._atexit = functools.partial(stop, self._process)
        atexit.register(self._atexit)  # a run that dies without close() must not leave a GPU server behind
        deadline = time.monotonic() + self.config.launch_timeout_s
        while True:
            code = self._process.poll()
            if code is not None:
                atexit.unregister(self._atexit)
                self._process = None
                raise SGLangUnavailableError(f"sglang: the launched server exited with code {code} before answering /health: {shlex.join(cmd)}")
            if self._loop.run(self._healthy(url)):
                break
            if time.monotonic() > deadline:
                self._stop_process()
                raise SGLangUnavailableError(f"sglang: the launched server did not answer /health within {self.config.launch_timeout_s:g} s")
            time.sleep(0.2)
        if not self.config.urls:
            self.urls = [url]
        if not self.config.admin_urls:
            self.admin_urls = [url] if self.config.urls else []

    def _stop_process(self) -> None:
        proc, self._process = self._process, None
        if proc is not None:
            atexit.unregister(self._atexit)
            stop(proc)
