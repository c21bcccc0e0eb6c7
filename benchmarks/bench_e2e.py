"""End-to-end learning benchmark: does `rllab run` learn, and how fast?

For each seed it runs the default job (GRPO on two-digit addition) exactly as a user would,
``rllab run train.seed=S``, in a fresh process, and reports wall time (the first run of the
session includes the supervised warm start, built into an empty model cache), held-out greedy
accuracy before and after, and the gain. ``--presets`` runs the named presets the same way.

    python benchmarks/bench_e2e.py                         # default job, seeds 0 1 2
    python benchmarks/bench_e2e.py --presets ppo rloo dapo online_dpo --seeds 0

Goals (the project's issue): the default job finishes in ≤ 2 minutes, warm start included, and
gains ≥ 25 points of held-out accuracy for each of 3 seeds; PPO, RLOO, DAPO and online DPO also
improve within the same budget. The load average is printed before and after, because these two
cores are shared.
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


def run_one(args: list[str], run_dir: Path, env: dict) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rllab.cli", "run", *args, "--run-dir", str(run_dir), "-q"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"rllab run {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    final = json.loads((run_dir / "final.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r]
    return {
        "wall_s": wall,
        "before": final["initial/accuracy"],
        "after": final["final/accuracy"],
        "gain": final["final/accuracy"] - final["initial/accuracy"],
        "train_s": sum(r["time/step"] for r in steps),
        "completions_per_s": statistics.median(r["perf/completions_per_s"] for r in steps if "perf/completions_per_s" in r) if steps and "perf/completions_per_s" in steps[0] else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--presets", nargs="*", default=[], help="presets to run instead of the default job")
    ap.add_argument("--keep-cache", action="store_true", help="reuse ~/.cache/rllab (skip timing the warm start)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()

    env = dict(os.environ)
    tmp = Path(tempfile.mkdtemp(prefix="rllab-bench-e2e-"))
    if not args.keep_cache:
        env["RLLAB_CACHE"] = str(tmp / "cache")
    print(f"load average before: {os.getloadavg()}")
    jobs = [(p, ["--preset", p]) for p in args.presets] or [("default", [])]
    rows = []
    for name, extra in jobs:
        for seed in args.seeds:
            r = run_one([*extra, f"train.seed={seed}"], tmp / f"{name}-{seed}", env)
            r.update(job=name, seed=seed)
            rows.append(r)
            print(
                f"{name:>12} seed {seed}: {r['before']:.1%} -> {r['after']:.1%} ({r['gain'] * 100:+.1f} points)  "
                f"wall {r['wall_s']:.1f}s (train {r['train_s']:.1f}s)  {r['completions_per_s']:.0f} completions/s",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()}")
    for name, _ in jobs:
        sel = [r for r in rows if r["job"] == name]
        walls = [r["wall_s"] for r in sel]
        gains = [r["gain"] * 100 for r in sel]
        print(
            f"{name}: gain median {statistics.median(gains):+.1f} points (min {min(gains):+.1f}, max {max(gains):+.1f}); "
            f"wall median {statistics.median(walls):.1f}s (min {min(walls):.1f}, max {max(walls):.1f})"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
