"""The README's 2-rank FSDP2 command, run end to end under ``torchrun`` (gloo, 2 CPU processes).

Every collective must be reached by every rank: a forward or a reduction behind a rank-local
condition (rank 0 alone has listeners; a rank's own count of kept episodes) deadlocks the run.
These runs use the default loggers, the traces logger and LoRA (async rollouts are refused on
every rank), each under a timeout, so that a hang fails the test instead of stalling CI. A rank that waits longer than
``model.collective_timeout_s`` in a collective stops the run with an error that names the rank,
the step and the call, and the run resumes from its last checkpoint.

Also (in one process): the per-sample traces reuse the update's own first forward, so a traced
step runs no more policy forwards than an untraced one, and the log-probs it records are those
of the policy before the update.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .tiny import TINY, overrides

README = Path(__file__).resolve().parents[1] / "README.md"
COMMAND = "torchrun --nproc-per-node 2 -m rllab run model.strategy=fsdp2"
SMALL = {**TINY, "model.strategy": "fsdp2", "train.steps": 3, "train.eval_size": 8}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], *, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_port()), "-m", "rllab", "run", *args]
    try:
        return subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:  # the hang this file exists to catch
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"`torchrun ... rllab run {' '.join(args)}` did not finish in {timeout:.0f} s (a rank waits in a collective "
                    f"another never reached):\n{out[-3000:]}")


@pytest.fixture(scope="module")
def warm(model_cache, tmp_path_factory):
    """The warm start built once, in one process, so the 2-rank runs below load it from the cache
    (building the trainer builds it; no step is run)."""
    from rllab.config import load_config
    from rllab.training.trainer import Trainer

    run_dir = tmp_path_factory.mktemp("warm") / "run"
    Trainer(load_config(None, [*overrides(TINY), "train.steps=1", "train.eval_size=4"]), run_dir=run_dir, progress=False).close()


def test_the_readme_shows_the_command_these_tests_run():
    assert COMMAND in README.read_text()


def test_the_readme_command_finishes_with_the_default_loggers_and_traces(warm, tmp_path):
    run_dir = tmp_path / "run"
    # the default loggers (console, jsonl, ...) plus per-sample traces: rank 0 alone listens
    done = _torchrun([*overrides(SMALL), "--run-dir", str(run_dir)], timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads((run_dir / "final.json").read_text())["steps"] == 3
    traced = tmp_path / "traced"
    done = _torchrun([*overrides(SMALL), 'loggers=["jsonl", {name="traces", per_step=2}]', "--run-dir", str(traced), "-q"], timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (traced / "traces.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 1, 2, 2, 3, 3]
    assert all(r["trainer_logprobs"] is not None and abs(r["mismatch"][0]) < 1e-3 for r in train)

    # deterministic on 2 ranks, and tracing changes nothing the run learns: the two runs log the same values
    def learned(path):
        rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "memory/"))} for r in rows]

    assert learned(traced) == learned(run_dir) and len(learned(run_dir)) >= 5


def test_the_readme_command_finishes_with_lora(warm, tmp_path):
    run_dir = tmp_path / "run"
    done = _torchrun([*overrides(SMALL), "model.lora.r=4", "train.lr=2e-3", 'loggers=["jsonl", "traces"]', "--run-dir", str(run_dir), "-q"],
                     timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads((run_dir / "final.json").read_text())["steps"] == 3
    assert (run_dir / "traces.jsonl").is_file() and (run_dir / "adapter").is_dir()


def test_async_rollouts_on_two_ranks_are_refused_by_every_rank_not_left_waiting(warm, tmp_path):
    done = _torchrun([*overrides(SMALL), "rollout.max_staleness=2", "--run-dir", str(tmp_path / "run"), "-q"], timeout=120)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    # Refused at load, by each process before any process group exists: no rank waits on another.
    # torchrun stops the other process once the first exits, so its own message may not be printed.
    assert 1 <= out.count("error: rollout.max_staleness = 2 with model.strategy = 'fsdp2' is not supported") <= 2, out[-3000:]
    assert not list((tmp_path / "run").glob("**/checkpoint*")), "a refused run must not train"


SKIPPER = '''
"""Rank 1 skips the all-reduce of the second step's update, as a rank-local condition would."""
import os
from rllab.parallel.reducer import Reducer

_sum = Reducer.sum
_calls = {"n": 0}


def _skipping_sum(self, value):
    if self.world_size > 1 and self.rank == 1 and os.environ.get("SKIP_ONE_ALL_REDUCE") == "1":
        import inspect
        step = next((f.frame.f_locals["ctx"].step for f in inspect.stack() if "ctx" in f.frame.f_locals
                     and hasattr(f.frame.f_locals["ctx"], "step")), None)
        if step == 1 and any(f.function == "update" for f in inspect.stack()):
            return value
    return _sum(self, value)


Reducer.sum = _skipping_sum
'''


def test_a_rank_stuck_in_a_collective_stops_the_run_naming_rank_step_and_call_and_it_resumes(warm, tmp_path):
    plugin = tmp_path / "skip_one_all_reduce.py"
    plugin.write_text(SKIPPER)
    run_dir = tmp_path / "run"
    settings = {**SMALL, "train.checkpoint_every": 1, "model.collective_timeout_s": 5}
    args = [*overrides(settings), f'plugins=["{plugin}"]', "--run-dir", str(run_dir), "-q"]
    stuck = _torchrun(args, timeout=180, env={"SKIP_ONE_ALL_REDUCE": "1"})
    out = stuck.stdout + stuck.stderr
    assert stuck.returncode != 0, out[-3000:]
    assert "waited more than 5 s (model.collective_timeout_s)" in out, out[-3000:]
    assert "at step 2" in out and "RL.update" in out, out[-3000:]  # the step and the call that waited
    # rank 1 skipped the all-reduce and waits in the next collective, the update's FSDP forward: both are named
    assert "rank 0 of 2: waited more than 5 s" in out and "RL.update → Reducer.sum → all_reduce" in out, out[-3000:]
    assert "rank 1 of 2:" in out and "all_gather" in out, out[-3000:]
    assert "--resume" in out, out[-3000:]  # rank 0 says how to continue
    assert (run_dir / "checkpoints" / "step_000001").is_dir() and not (run_dir / "final.json").exists()
    resumed = _torchrun(["--resume", str(run_dir), "-q"], timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert json.loads((run_dir / "final.json").read_text())["steps"] == 3


def test_the_timeout_is_a_knob_of_the_data_parallel_strategy_only():
    from rllab.config import load_config
    from rllab.errors import ConfigError

    assert load_config(None, ["model.strategy=fsdp2", "model.collective_timeout_s=30"]).model.collective_timeout_s == 30
    with pytest.raises(ConfigError, match=r"collective_timeout_s = 30.*strategy = 'fsdp2'"):
        load_config(None, ["model.collective_timeout_s=30"])
    with pytest.raises(ConfigError, match="collective_timeout_s"):
        load_config(None, ["model.strategy=fsdp2", "model.collective_timeout_s=0"])


def test_a_traced_step_reuses_the_updates_forward_and_records_the_policy_before_the_update(model_cache, tmp_path, monkeypatch):
    """The traces logger's trainer log-probs equal a separate no-grad forward of the policy taken
    before the update (computed here, in the test only), and tracing adds no policy forward."""
    import rllab_algorithms.rl as rl
    from rllab.config import load_config
    from rllab.training.trainer import run_experiment

    calls = {"n": 0}
    real = rl._logprobs

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(rl, "_logprobs", counting)
    # random rewards: every step has signal, so the update moves the policy (checked below)
    args = [*overrides(TINY), "train.steps=2", "task.digits=1", "train.eval_every=0", "rollout.random_reward=given", "train.lr=1e-2"]
    run_experiment(load_config(None, args), run_dir=tmp_path / "plain", progress=False)
    plain = calls["n"]
    calls["n"] = 0
    # the reference values: the policy's no-grad forward after prepare(), before the update
    before: list[torch.Tensor] = []
    prepare = rl.RL.prepare

    def spying(self, ctx, batch, extra=None):
        out = prepare(self, ctx, batch, extra)
        with torch.no_grad():
            before.append(real(ctx, ctx.policy, batch).float())
        last.update(ctx=ctx, batch=batch)
        return out

    monkeypatch.setattr(rl.RL, "prepare", spying)
    seen: list[torch.Tensor] = []
    after: list[torch.Tensor] = []
    last: dict = {}
    listener = type("Listener", (), {})()

    from rllab.hookspecs import hookimpl

    @hookimpl
    def on_step_samples(step, episodes, batch, advantages, trainer_log_prob, tokenizer, run_dir):
        seen.append(trainer_log_prob.detach().clone())
        with torch.no_grad():  # the event comes after the update: the policy has moved
            after.append(real(last["ctx"], last["ctx"].policy, last["batch"]).float())

    listener.on_step_samples = on_step_samples
    from rllab.lab import Lab

    lab = Lab()
    lab.pm.register(listener, name="test-samples-listener")
    run_experiment(load_config(None, args, lab=lab), lab=lab, run_dir=tmp_path / "traced", progress=False)
    assert calls["n"] == plain  # no extra forward for the samples (the spy's calls go to the unwrapped function)
    assert len(seen) == len(before) == 2
    for got, want in zip(seen, before):
        assert got.shape == want.shape and not got.isnan().any()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    mask = last["batch"].response_mask
    assert (seen[-1] - after[-1])[mask].abs().max() > 1e-3  # so the check above tells the two apart


def test_only_a_collective_that_timed_out_or_lost_its_peer_is_explained():
    from rllab.errors import RllabError
    from rllab.parallel import distributed
    from rllab.parallel.reducer import Reducer

    two = Reducer(rank=1, world_size=2)

    def raised(exc, fn):
        try:
            fn(exc)
        except BaseException as e:  # noqa: BLE001
            return e

    def plain(exc):
        raise exc

    # not from torch.distributed: left as it is, whatever its text
    assert distributed.collective_error(raised(RuntimeError("Timed out waiting 5000ms"), plain), reducer=two, where="at step 1", limit_s=5) is None
    assert distributed.collective_error(raised(RllabError("x"), plain), reducer=two, where="at step 1", limit_s=5) is None
    # one process: nothing to wait for
    assert distributed.collective_error(raised(RuntimeError("Timed out waiting"), plain), reducer=Reducer(), where="", limit_s=5) is None
