"""How far a result moves with the torch thread count or the CPU kernels, from one pinned start.

A different thread count splits torch's CPU reductions differently (the same sums in another
order); a CPU with another vector ISA runs other kernels (AVX2 instead of AVX-512). Both are what
another machine does to a run. This script is that stand-in: the default job (GRPO on two-digit
addition, the tiny model's default warm start) for each seed under two conditions — 2 torch
threads against 1 (``--vary threads``, ``OMP_NUM_THREADS``), or this CPU's own kernels against
AVX2 ones (``--vary isa``, ``ATEN_CPU_CAPABILITY=avx2``, on a CPU that has AVX-512) — every run
pinned to the same starting model (``model.sha256``), each in a fresh process. It reports, per seed:
whether the start's evaluation (step 0) is the same value for value, the first step and metric
at which the two runs differ, and held-out greedy accuracy at each evaluation under either
count; then the mean over seeds with its range, and whether "GRPO beats the start" holds under
both.

    python benchmarks/bench_threads.py                        # seeds 0 1 2, 60 steps, 2 threads vs 1
    python benchmarks/bench_threads.py --vary isa             # this CPU's kernels vs AVX2's
    python benchmarks/bench_threads.py --seeds 0 --steps 20   # quicker

The run directories stay under ``--out`` (default: a temporary directory), so that
``rllab provenance A B`` and ``rllab reproduce A`` can be tried on them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rllab.training.reproduce import first_difference, read_metrics


CONDITIONS = {
    "threads": (("2 threads", {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}), ("1 thread", {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})),
    "isa": (("own kernels", {}), ("AVX2 kernels", {"ATEN_CPU_CAPABILITY": "avx2"})),
}
"""The two conditions compared, by ``--vary``: a label and the environment variables of each."""


def run(run_dir: Path, extra_env: dict, args: list[str]) -> float:
    env = {**os.environ, **extra_env}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rllab.cli", "run", *args, "-q", "--run-dir", str(run_dir)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"run {run_dir} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0


def evals(run_dir: Path) -> dict[int, float]:
    return {step: row["eval/accuracy"] for step, row in read_metrics(run_dir / "metrics.jsonl").items() if "eval/accuracy" in row}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--eval-size", type=int, default=100)
    p.add_argument("--vary", choices=tuple(CONDITIONS), default="threads")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    (la, ea), (lb, eb) = CONDITIONS[a.vary]
    out = Path(a.out or tempfile.mkdtemp(prefix="rllab-threads-"))
    out.mkdir(parents=True, exist_ok=True)
    common = [f"train.steps={a.steps}", f"train.eval_every={a.eval_every}", f"train.eval_size={a.eval_size}", "train.checkpoint_every=0"]
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores; runs in {out}")
    pin: list[str] = []
    finals: dict[str, list[float]] = {la: [], lb: []}
    starts: dict[str, list[float]] = {la: [], lb: []}
    for seed in a.seeds:
        dirs = {}
        for label, env in ((la, ea), (lb, eb)):
            d = out / f"seed{seed}-{label.replace(' ', '-')}"
            wall = run(d, env, [*common, f"train.seed={seed}", *pin])
            rec = json.loads((d / "provenance.json").read_text())
            torch_rec = rec["machine"]["torch"]
            print(f"  {label}: torch threads {torch_rec['threads']}, CPU kernels {torch_rec['cpu_capability']}")
            if not pin:  # the first run builds (or finds) the start; every other run is pinned to it
                sha = rec["hashes"]["start"]["sha256"]
                pin = [f"model.sha256={sha}"]
                print(f"pinned start: sha256 {sha}")
            dirs[label] = d
            print(f"seed {seed}, {label}: {wall:.0f} s", flush=True)
        m2, m1 = read_metrics(dirs[la] / "metrics.jsonl"), read_metrics(dirs[lb] / "metrics.jsonl")
        at_start, _ = first_difference(m2, m1, steps=[0])
        first, n = first_difference(m2, m1)
        e2, e1 = evals(dirs[la]), evals(dirs[lb])
        starts[lb].append(e1[0])
        starts[la].append(e2[0])
        finals[lb].append(e1[max(e1)])
        finals[la].append(e2[max(e2)])
        print(f"seed {seed}: start's evaluation {'identical' if at_start is None else 'DIFFERS: ' + at_start.describe()}; "
              f"first difference ({la} → {lb}): {first.describe() if first else f'none in {n} values'}")
        differ = sorted({k for s in m2 for k in m2[s] if not k.startswith(("time/", "perf/")) and m2[s].get(k) != m1.get(s, {}).get(k)})
        print(f"  metrics that differ at some step: {', '.join(differ) or 'none'}")
        print("  eval accuracy by step: " + ", ".join(f"{s}: {e2[s]:.1%} / {e1.get(s, float('nan')):.1%}" for s in sorted(e2))
              + f"  ({la} / {lb})")
    for label in (la, lb):
        f = finals[label]
        gain = [x - s for x, s in zip(f, starts[label])]
        print(f"{label}: start {statistics.mean(starts[label]):.1%}, final mean {statistics.mean(f):.1%} "
              f"[{min(f):.1%}, {max(f):.1%}] over seeds {a.seeds}; gain over the start {statistics.mean(gain):+.1%} "
              f"(every seed {'above' if all(g > 0 for g in gain) else 'NOT all above'} its start)")
    moved = [abs(x - y) for x, y in zip(finals[la], finals[lb])]
    print(f"|final({la}) − final({lb})| per seed: {', '.join(f'{m:.1%}' for m in moved)}; "
          f"difference of the means {statistics.mean(finals[la]) - statistics.mean(finals[lb]):+.1%}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
