"""A short run of the default job against a stand-in SGLang server that aborts a share of samples.

The stand-in (tests/sglang_standin.py) runs as a separate process with ``--abort-rate P``: each
sample is finished with ``finish_reason`` ``abort`` (its output cut where it stopped) with
probability P, as SGLang reports a preempted or evicted request. The run is the default job
(``rllab run backend=sglang backend.urls=...``) for ``--steps`` steps, its evaluation included.
Per seed of the stand-in's abort draws it reports whether the run finished, the steps completed,
the aborted samples it resubmitted (``sglang/aborted_total`` of the last step: the first
evaluation and every step's rollout; the final evaluation is not in a step's row), whole-request
retries, and the wall time of the run.

    python benchmarks/bench_sglang_aborts.py --steps 10 --seeds 0 1 2
    python benchmarks/bench_sglang_aborts.py --steps 10 --seeds 0 --code /path/to/other/checkout   # another version
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(code: Path, steps: int, rate: float, seed: int, work: Path) -> dict:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{code / 'plugins'}", "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "sglang_standin.py"), "--port", str(port), "--abort-rate", str(rate),
         "--abort-seed", str(seed), "--lifetime-s", "3600"],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        server.stdout.readline()  # "stand-in listening on ..."
        run_dir = work / f"run-{seed}"
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "rllab", "run", "backend=sglang", f"backend.urls=http://127.0.0.1:{port}",
             f"train.steps={steps}", "train.checkpoint_every=0", "-q", "--run-dir", str(run_dir)],
            capture_output=True, text=True, env=env,
        )
        wall = time.perf_counter() - t0
    finally:
        server.terminate()
        server.wait()
    rows = []
    if (run_dir / "metrics.jsonl").exists():
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    done = [r for r in rows if "rollout/reward" in r]
    last_error = (proc.stderr.strip().splitlines() or [""])[-1]
    return {
        "seed": seed,
        "finished": proc.returncode == 0,
        "steps": len(done),
        "aborted": done[-1].get("sglang/aborted_total", float("nan")) if done else float("nan"),
        "retries": sum(r.get("sglang/retries", 0.0) for r in done),
        "wall_s": wall,
        "error": "" if proc.returncode == 0 else last_error[:160],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--abort-rate", type=float, default=0.06)
    p.add_argument("--code", type=Path, default=ROOT, help="the checkout whose rllab runs (default: this one)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="rllab-aborts-") as tmp:
        os.environ.setdefault("RLLAB_CACHE", str(Path(tmp) / "cache"))  # the warm start is built once, shared
        results = [one_run(args.code.resolve(), args.steps, args.abort_rate, s, Path(tmp)) for s in args.seeds]
    print(f"abort rate {args.abort_rate}, {args.steps} steps, code {args.code}, load {os.getloadavg()[0]:.2f}")
    print("| seed | finished | steps | aborted samples resubmitted | whole-request retries | wall (s) | error |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['seed']} | {r['finished']} | {r['steps']} | {r['aborted']:g} | {r['retries']:g} | {r['wall_s']:.1f} | {r['error']} |")
    walls = [r["wall_s"] for r in results if r["finished"]]
    if walls:
        print(f"wall of finished runs: median {statistics.median(walls):.1f} s [{min(walls):.1f}, {max(walls):.1f}]")


if __name__ == "__main__":
    main()
