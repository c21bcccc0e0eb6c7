"""A launcher and a strategy that disagree, and two processes on one run directory.

- ``torchrun`` (``WORLD_SIZE > 1``) with ``model.strategy = "single"`` would train identical copies
  that all write one run directory: refused at config load, before any model is built.
- A run directory is written by one process at a time (:mod:`rllab.training.runlock`): a second ``rllab
  run --run-dir D`` / ``--resume D`` / ``--overwrite`` there is refused, naming the holder's pid; a
  holder killed with ``kill -9`` leaves a lock file that does not block.
- A run that stops on an error says whether it can be continued: from which checkpoint, or that
  nothing was saved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rllab.training.trainer
from rllab.training import runlock
from rllab.cli import main
from rllab.config import load_config
from rllab.checks.config import launcher_env
from rllab.errors import ConfigError, RllabError
from rllab.training.runs import prepare_run_dir
from tests.tiny import TINY, overrides

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    """The environment of a child ``rllab``: this checkout first on its path, one thread."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "plugins"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _flat(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------- WORLD_SIZE and strategy


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a trainer (and so a model) is ever built."""
    def built(*a, **k):
        raise AssertionError("a trainer was built")

    monkeypatch.setattr(rllab.training.trainer.Trainer, "__init__", built)


def test_torchrun_with_the_single_strategy_is_refused_before_any_model(tmp_path, monkeypatch, capsys, no_model):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    run = tmp_path / "run"
    assert main(["run", "--steps", "2", "--run-dir", str(run)]) == 1
    err = _flat(capsys.readouterr().err)
    assert "WORLD_SIZE=2" in err and "strategy = 'single'" in err and "Set model.strategy=fsdp2" in err
    assert not run.exists()
    # a config file that says so names its line; a resume and `rllab record` load configs the same way
    exp = tmp_path / "exp.toml"
    exp.write_text('[model]\nstrategy = "single"\n')
    with pytest.raises(ConfigError, match=r"strategy = 'single' \(line 2\).*model.strategy=fsdp2") as e:
        load_config(exp)
    assert e.value.key == "strategy"
    assert main(["record", "--out", str(tmp_path / "rec.pt"), "--steps", "1"]) == 1
    assert "Set model.strategy=fsdp2" in _flat(capsys.readouterr().err) and not (tmp_path / "rec.pt").exists()
    # fsdp2 is what WORLD_SIZE > 1 asks for; WORLD_SIZE=1 (torchrun --nproc-per-node 1) is one process
    assert load_config(None, ["model.strategy=fsdp2"]).model.strategy == "fsdp2"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert load_config(None).model.strategy == "single"


def test_torchrun_around_the_resume_of_a_one_process_run_is_refused(tmp_path, monkeypatch, capsys, no_model):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[model]\nstrategy = "single"\n[provenance]\nrllab = "0"\n')
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main(["run", "--resume", str(run)]) == 1
    err = _flat(capsys.readouterr().err)
    assert "WORLD_SIZE=2" in err and f"A resume cannot change model.strategy: continue {run} as one process, without torchrun" in err
    assert sorted(p.name for p in run.iterdir()) == ["config.toml"]


@pytest.mark.parametrize(
    "environ, match",
    [
        ({"WORLD_SIZE": "two"}, r"WORLD_SIZE='two' in the environment is not a whole number ≥ 1"),
        ({"WORLD_SIZE": "0"}, r"WORLD_SIZE='0' .* not a whole number ≥ 1"),
        ({"WORLD_SIZE": "2"}, r"WORLD_SIZE=2 in the environment but no RANK.*torchrun --nproc-per-node 2"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, r"WORLD_SIZE=2 in the environment but RANK=2.*\(0 … 1\)"),
        ({"WORLD_SIZE": "2", "RANK": "-1"}, r"RANK='-1' .* not a whole number ≥ 0"),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "x"}, r"LOCAL_RANK='x'"),
    ],
)
def test_a_malformed_torchrun_environment_is_refused(environ, match):
    with pytest.raises(ConfigError, match=match):
        launcher_env(environ)


def test_a_torchrun_environment_is_read():
    assert launcher_env({}) == (0, 1, 0)
    assert launcher_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}) == (3, 4, 1)
    # one process: a RANK or LOCAL_RANK another tool left behind is no reason to refuse it
    assert launcher_env({"RANK": "3", "LOCAL_RANK": "-1"}) == (0, 1, 0)
    assert launcher_env({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}) == (0, 1, 0)


def test_torchrun_with_two_processes_and_no_strategy_is_refused(tmp_path):
    """The real launcher: ``torchrun --nproc-per-node 2 -m rllab run`` (no model.strategy)."""
    run = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_port())]
    out = subprocess.run([*torchrun, "-m", "rllab", "run", "--steps", "2", "--run-dir", str(run)], env=_env(),
                         capture_output=True, text=True, timeout=120)
    text = _flat(out.stdout + out.stderr)
    assert out.returncode != 0 and "Set model.strategy=fsdp2" in text, text[-3000:]  # the rank torchrun stops may not get to say it
    assert not run.exists()


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- the run directory lock


def test_a_held_lock_refuses_another_taker_and_is_gone_once_released(tmp_path):
    run = tmp_path / "run"
    with runlock.acquire(run) as held:
        assert runlock.holder(run)["pid"] == os.getpid()
        with pytest.raises(runlock.RunDirInUseError, match=rf"{run} is in use by another rllab process \(pid {os.getpid()}"):
            runlock.acquire(run)  # another open file of the same lock: refused even within one process
        assert held.fd is not None
    assert not (run / runlock.LOCK_FILE).exists()
    runlock.acquire(run).release()  # free again


def test_a_lock_file_that_cannot_be_opened_is_refused_naming_it(tmp_path):
    run = tmp_path / "run"
    (run / runlock.LOCK_FILE).mkdir(parents=True)
    with pytest.raises(RllabError, match=rf"cannot open {run / runlock.LOCK_FILE}, the lock .*: remove that directory"):
        runlock.acquire(run)
    (tmp_path / "file").write_text("")
    with pytest.raises(RllabError, match=rf"cannot create the directory {tmp_path / 'file' / 'run'} \(Not a directory\)"):
        runlock.acquire(tmp_path / "file" / "run")  # was a traceback from the trainer


def test_a_stale_lock_file_does_not_block(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / runlock.LOCK_FILE).write_text('{"pid": 999999999}\n')  # its process is gone: no flock on it
    with runlock.acquire(run):
        assert runlock.holder(run)["pid"] == os.getpid()
    (run / runlock.LOCK_FILE).write_text("not json")
    runlock.acquire(run).release()


def test_overwrite_keeps_the_replacement_locked(tmp_path):
    """``--overwrite`` replaces the directory by renames: the new one carries the held lock."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('name = "old"\n[provenance]\nrllab = "0"\n')
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    with runlock.acquire(run) as held:
        prepare_run_dir(run, overwrite=True)
        assert sorted(p.name for p in run.iterdir()) == [runlock.LOCK_FILE]
        assert os.stat(run / runlock.LOCK_FILE).st_ino == os.fstat(held.fd).st_ino
        with pytest.raises(runlock.RunDirInUseError):
            runlock.acquire(run)
    assert not any(run.iterdir()) and not list(tmp_path.glob(".run.*"))


def test_a_second_process_on_a_run_directory_is_refused_and_a_killed_holder_does_not_block(tmp_path, model_cache, capsys):
    """Two real processes: ``rllab run --run-dir D`` runs in a child; in this one, a second ``rllab run
    --run-dir D``, a ``--resume D`` and an ``--overwrite`` are refused naming its pid; after ``kill -9`` of the first,
    ``--resume D`` continues it from its last checkpoint (the dead holder's lock file left behind)."""
    run = tmp_path / "run"
    settings = {**TINY, "train.checkpoint_every": 1, "train.eval_every": 0, "train.steps": 400}
    first = subprocess.Popen([sys.executable, "-m", "rllab", "run", *overrides(settings), "--run-dir", str(run), "-q"],
                             env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        latest = run / "checkpoints" / "latest"
        deadline = time.time() + 240
        while not latest.is_file() and first.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert latest.is_file(), first.communicate()[0][-3000:] if first.poll() is not None else "no checkpoint in time"
        assert runlock.holder(run)["pid"] == first.pid
        # the second taker is this process (rllab.cli.main), as in the loop below
        code = main(["run", *overrides(TINY), "--steps", "2", "--run-dir", str(run), "-q"])
        err = _flat(capsys.readouterr().err)
        assert code == 1 and f"{run} is in use by another rllab process (pid {first.pid}" in err, err[-2000:]
        assert f"kill {first.pid}" in err and f"rllab run --resume {run}" in err
        for args in (["--resume", str(run)], [*overrides(TINY), "--steps", "2", "--run-dir", str(run), "--overwrite"]):
            assert main(["run", *args, "-q"]) == 1
            assert f"is in use by another rllab process (pid {first.pid}" in _flat(capsys.readouterr().err)
        assert (run / "config.toml").is_file() and first.poll() is None  # --overwrite removed nothing
    finally:
        first.kill()  # SIGKILL: no cleanup runs, the kernel drops its lock
        first.communicate()
    assert runlock.holder(run)["pid"] == first.pid  # its lock file is still there, stale
    step = int(latest.read_text().strip().split("_")[1])
    assert main(["run", "--resume", str(run), f"train.steps={step + 1}", "-q"]) == 0, capsys.readouterr().err[-3000:]
    assert json.loads((run / "final.json").read_text())["steps"] == step + 1
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "rollout/reward" in r]
    assert steps == list(range(1, step + 2))  # each step's row once
    assert not (run / runlock.LOCK_FILE).exists()


# --------------------------------------------------------------------------- whether a stopped run can be continued


def test_a_server_that_fails_before_the_first_step_says_nothing_was_saved(tmp_path, model_cache, capsys):
    """backend = sglang with no server: the run stops at its first use of the server, before any
    step; nothing can be resumed, so no --resume is offered and no run directory is left."""
    from rllab_backends.sglang.launch import free_port

    run = tmp_path / "run"
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    args = [*overrides({**TINY, "backend": "sglang", "backend.urls": url, "backend.retries": 0}), "--steps", "2"]
    assert main(["run", *args, "-q", "--run-dir", str(run)]) == 1
    err = _flat(capsys.readouterr().err)
    assert "sglang:" in err and "cannot connect" in err and "the run stops here" in err
    assert "nothing was saved and there is no checkpoint to resume from" in err and "start the run again" in err
    assert "--resume" not in err and "can resume" not in err and not run.exists()


class _ServerGone(RllabError):
    pass


@pytest.mark.parametrize("checkpoint_every", [1, 0])
def test_a_run_that_fails_after_its_first_step_says_how_it_continues(tmp_path, monkeypatch, capsys, model_cache, checkpoint_every):
    run = tmp_path / "run"
    train_step = rllab.training.trainer.Trainer.train_step

    def fails_in_the_third(self):
        if self.step == 2:
            raise _ServerGone("sglang: no server answered (the run stops here)")
        return train_step(self)

    monkeypatch.setattr(rllab.training.trainer.Trainer, "train_step", fails_in_the_third)
    settings = {**TINY, "train.checkpoint_every": checkpoint_every, "train.eval_every": 0}
    assert main(["run", *overrides(settings), "--steps", "4", "-q", "--run-dir", str(run)]) == 1
    err = _flat(capsys.readouterr().err)
    if checkpoint_every:
        assert f"{run} keeps its last checkpoint (step_000002); continue it with: rllab run --resume {run}" in err
        # a resume told to stop before that checkpoint: not "already finished", which it is not
        assert main(["run", "--resume", str(run), "train.steps=1", "-q"]) == 1
        err = _flat(capsys.readouterr().err)
        assert f"train.steps = 1, but {run} is already past it: its last checkpoint (step_000002)" in err
        assert "already finished" not in err
    else:
        assert f"{run} has no checkpoint yet" in err and "starts the run over from step 0" in err
    assert not (run / runlock.LOCK_FILE).exists()  # released on the way out


# --------------------------------------------------------------------------- suites


class _HeldElsewhere:
    """``path``'s lock, held by another (small) process until the block ends."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> int:
        code = "import sys, time; from rllab.training import runlock; runlock.acquire(sys.argv[1]); print('held', flush=True); time.sleep(120)"
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(self.path)], env=_env(), stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"
        return self.proc.pid

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


def test_a_suite_directory_in_use_is_refused_and_so_is_a_cell_in_use(tmp_path, capsys):
    """Two ``rllab suite`` on one directory would run the same cells and rewrite its suite.json;
    a cell that another process (an ``rllab run --resume`` of it) is writing is left alone."""
    import textwrap

    from rllab_suite.executor import run_cell

    suite = tmp_path / "s.toml"
    suite.write_text(textwrap.dedent('''
        name = "m"
        steps = 2
        seeds = 1
        tasks = ["addition"]
        [variants]
        grpo = {}
    '''))
    out = tmp_path / "suite"
    with _HeldElsewhere(out) as pid:
        assert main(["suite", str(suite), "--dir", str(out), "--workers", "1", "-q"]) == 1
        err = _flat(capsys.readouterr().err)
        assert f"{out} is in use by another rllab process (pid {pid}" in err and f"continue it with: rllab suite {out}" in err
        assert sorted(p.name for p in out.iterdir()) == [runlock.LOCK_FILE]  # nothing of the suite written
        (out / "suite.json").write_text("{}")  # as a running suite has it
        assert main(["suite", "report", str(out)]) == 1  # its report would race the suite's own
        err = _flat(capsys.readouterr().err)
        assert f"{out} is in use by another rllab process (pid {pid}" in err and "Its report is written when it ends" in err
        assert sorted(p.name for p in out.iterdir()) == [runlock.LOCK_FILE, "suite.json"]
    cell = tmp_path / "cell"
    with _HeldElsewhere(cell) as pid:
        result = run_cell({"key": "k", "config": {}, "run_dir": str(cell)})
        assert result["status"] == "failed" and f"pid {pid}" in result["error"]
        assert sorted(p.name for p in cell.iterdir()) == [runlock.LOCK_FILE]  # no log.txt, no error.txt


def test_a_resume_whose_server_is_gone_names_the_checkpoint_it_can_continue_from(tmp_path, model_cache, capsys):
    """backend = sglang: two steps against the stand-in server (a checkpoint after each), then the
    server is gone; the resume fails at its first use of the server and says the checkpoint is
    kept and how to continue from it (on a server that came back, or moved: backend.urls=...)."""
    from tests.sglang_standin import StandIn

    run = tmp_path / "run"
    with StandIn(None, lifetime_s=300) as server:
        settings = {**TINY, "backend": "sglang", "backend.urls": server.url, "backend.backoff_s": 0.01,
                    "train.checkpoint_every": 1, "train.eval_every": 0, "train.eval_size": 4}
        assert main(["run", *overrides(settings), "--steps", "2", "-q", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", str(run), "train.steps=3", "backend.retries=0", "-q"]) == 1  # extend it by a step
    err = _flat(capsys.readouterr().err)
    assert "sglang:" in err and "the run stops here" in err and "can resume" not in err
    assert f"{run} keeps its last checkpoint (step_000002); continue it with: rllab run --resume {run}" in err
    assert not (run / runlock.LOCK_FILE).exists()
