"""Overhead of the sglang backend's client: building requests, parsing answers, assembling tensors.

Generation is stubbed: the stand-in server (tests/sglang_standin.py, ``--instant T``) runs in a
separate process and answers every row at once with T fixed tokens, so what is left is the
client's own work plus loopback HTTP. Per workload (P prompts × n samples × T tokens) it reports

- parsed completions per second of the client process's CPU time (``time.process_time``: the
  event-loop thread and the caller; the server's CPU is in another process), and per second of
  wall time (this includes the server's answers and the loopback round trips);
- the client's share of one training step of the embedded default — ``Trainer`` with the
  default config and the hf backend (16 prompts × 8 samples × ≤ 8 tokens), median of
  ``--steps`` steps after one warm-up step.

    python benchmarks/bench_sglang_client.py
    python benchmarks/bench_sglang_client.py --repeats 5 --steps 3 --per-request 1 4
    python benchmarks/bench_sglang_client.py --rounds 5 --per-request 16   # the share, in alternating rounds
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import rllab
from rllab.types import RolloutBatch, SamplingParams

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_standin(tokens: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, str(ROOT / "tests" / "sglang_standin.py"), "--instant", str(tokens), "--port", str(port),
           "--no-validate", "--lifetime-s", "600"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()  # "stand-in listening on ..."
    return proc, f"http://127.0.0.1:{port}"


def timed_step(backend, prompts, params):
    """One step's client work, timed in parts: ``generate`` (build, send, parse) and the padded
    batch (``RolloutBatch.from_completions``, which the embedded backend's step pays too).
    Returns the completions and (cpu generate, cpu assembly, wall generate, wall assembly)."""
    c0, w0 = time.process_time(), time.perf_counter()
    comps = backend.generate(prompts, params)
    c1, w1 = time.process_time(), time.perf_counter()
    RolloutBatch.from_completions(comps, [0.0] * len(comps), pad_token_id=0)
    c2, w2 = time.process_time(), time.perf_counter()
    return comps, (c1 - c0, c2 - c1, w1 - w0, w2 - w1)


def measure_client(lab, P, n, T, per_request, repeats):
    proc, url = start_standin(T)
    try:
        backend = lab.get("rollout_backend", "sglang", urls=url, prompts_per_request=per_request)()
        prompts = [[1] + [4 + (i % 10)] * 12 for i in range(P)]
        params = SamplingParams(n=n, max_new_tokens=T, seed=1)
        timed_step(backend, prompts, params)  # connections, warm-up
        parts = []
        for _ in range(repeats):
            comps, t = timed_step(backend, prompts, params)
            parts.append(t)
        assert len(comps) == P * n and all(len(c.token_ids) == T for c in comps)
        backend.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return [statistics.median(p[i] for p in parts) for i in range(4)]


def embedded_step_time(steps: int) -> float:
    from rllab.config import load_config
    from rllab.trainer import Trainer

    with tempfile.TemporaryDirectory() as d:
        tr = Trainer(load_config(None, ["train.checkpoint_every=0", "train.eval_size=16"]), run_dir=Path(d), progress=False)
        tr.train_step()  # warm-up
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            tr.train_step()
            times.append(time.perf_counter() - t0)
        tr.close()
    return statistics.median(times)


def share_rounds(lab, rounds: int, steps: int, repeats: int, per_request: int) -> None:
    """The client's share of the default step, measured in alternating rounds (the embedded step,
    then the client, in the same minute): this machine's speed drifts by up to 2x over minutes,
    so a ratio from one round is fairer than two numbers taken apart."""
    shares = []
    for r in range(rounds):
        step = embedded_step_time(steps)
        gcpu, acpu, _, _ = measure_client(lab, 16, 8, 8, per_request, repeats)
        shares.append(((gcpu + acpu) / step, gcpu / step))
        print(f"round {r + 1}: embedded step {step * 1e3:.1f} ms, client {gcpu * 1e3:.2f} ms + assembly "
              f"{acpu * 1e3:.2f} ms = {100 * shares[-1][0]:.2f}% ({100 * shares[-1][1]:.2f}% without assembly)", flush=True)
    both = sorted(s[0] for s in shares)
    print(f"share of the default step, client + assembly: median {100 * statistics.median(both):.2f}% "
          f"[{100 * both[0]:.2f}, {100 * both[-1]:.2f}] over {rounds} rounds")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="embedded default steps timed")
    ap.add_argument("--per-request", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--rounds", type=int, default=0, help="only the default workload's share, in this many alternating rounds")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lab = rllab.Lab()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    if args.rounds:
        share_rounds(lab, args.rounds, args.steps, args.repeats, args.per_request[-1])
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return
    step = embedded_step_time(args.steps)
    print(f"embedded default (hf backend, 16 prompts x 8 samples x <=8 tokens): {step * 1000:.1f} ms / step")
    print("generate = build + send + parse (CPU of this process, and wall); assembly = RolloutBatch.from_completions")
    head = ("P x n x T", "per req", "gen cpu ms", "gen wall ms", "asm ms", "compl/s cpu", "compl/s wall",
            "share gen", "share gen+asm", "share wall")
    print(" ".join(f"{h:>13}" for h in head))
    for P, n, T in ((16, 8, 8), (64, 8, 64)):
        for k in args.per_request:
            gcpu, acpu, gwall, awall = measure_client(lab, P, n, T, k, args.repeats)
            default = (P, n, T) == (16, 8, 8)
            share = lambda x: f"{100 * x / step:.2f}%" if default else "-"  # noqa: E731
            cells = (f"{P}x{n}x{T}", k, f"{gcpu * 1e3:.2f}", f"{gwall * 1e3:.2f}", f"{acpu * 1e3:.2f}",
                     f"{P * n / gcpu:.0f}", f"{P * n / gwall:.0f}", share(gcpu), share(gcpu + acpu), share(gwall + awall))
            print(" ".join(f"{c:>13}" for c in cells))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
