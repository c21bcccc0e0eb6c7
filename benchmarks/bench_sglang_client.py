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
    python benchmarks/bench_sglang_client.py --rounds 3 --steps 40 --per-request 16   # the share, side by side
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
    from rllab.training.trainer import Trainer

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
    """The client's share of the default step, measured side by side: each round builds the
    embedded default trainer and an sglang backend on the stand-in, then alternates one training
    step and one client step (``generate`` + the padded batch), ``steps`` pairs, so every ratio
    compares two things timed within the same ~0.1 s (this machine's speed drifts by up to 2x
    over minutes). The client step runs right after a training step, cache-cold, as it does in
    a real run."""
    from rllab.config import load_config
    from rllab.training.trainer import Trainer

    ratios, per_round = [], []
    for r in range(rounds):
        proc, url = start_standin(8)
        try:
            backend = lab.get("rollout_backend", "sglang", urls=url, prompts_per_request=per_request)()
            prompts = [[1] + [4 + (i % 10)] * 12 for i in range(16)]
            params = SamplingParams(n=8, max_new_tokens=8, seed=1)
            with tempfile.TemporaryDirectory() as d:
                tr = Trainer(load_config(None, ["train.checkpoint_every=0", "train.eval_size=16"]), run_dir=Path(d), progress=False)
                tr.train_step()  # warm-up
                timed_step(backend, prompts, params)
                rows = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    tr.train_step()
                    step = time.perf_counter() - t0
                    _, (gcpu, acpu, _, _) = timed_step(backend, prompts, params)
                    rows.append((step, gcpu, acpu))
                tr.close()
            backend.close()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        mine = [(g + a) / s for s, g, a in rows]
        ratios += mine
        med = lambda i: statistics.median(x[i] for x in rows)  # noqa: E731
        per_round.append(statistics.median(mine))
        print(f"round {r + 1}: {steps} pairs, embedded step {med(0) * 1e3:.1f} ms, client {med(1) * 1e3:.2f} ms + assembly "
              f"{med(2) * 1e3:.2f} ms; share median {100 * per_round[-1]:.2f}% "
              f"({100 * statistics.median(g / s for s, g, _ in rows):.2f}% without assembly)", flush=True)
    ratios.sort()
    print(f"share of the default step, client + assembly: median {100 * statistics.median(ratios):.2f}% "
          f"[{100 * ratios[0]:.2f}, {100 * ratios[-1]:.2f}] over {len(ratios)} pairs in {rounds} rounds; "
          f"round medians {', '.join(f'{100 * x:.2f}%' for x in per_round)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="embedded default steps timed")
    ap.add_argument("--per-request", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--rounds", type=int, default=0, help="only the default workload's share: this many rounds of --steps pairs")
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
