"""The trainer's wait before each weight push, ``backend.push = "drain"`` against ``"pause"``.

Asynchronous rollouts (``rollout.max_staleness = k``, ``--max-staleness``) against a stand-in SGLang server
(tests/sglang_standin.py, a separate process) that answers fixed tokens (``--instant T``, no model:
the server's own CPU stays out of the measurement) decoded one per ``--token-delay-s`` seconds,
as a GPU server would take time per token. With ``drain`` the trainer waits before each push until
the producer's batch in flight has finished (``time/push_wait``), and SGLang's update waits for its
requests; with ``pause`` the push pauses the server in place, loads, continues, and the batch in
flight goes on with the new weights (``sglang/mixed_version_samples``). Per push mode it reports,
over the steps of every seed (the first step left out: nothing is in flight before it), the
median [min, max] of ``time/push_wait``, ``time/sync`` (the push itself), ``time/rollout_wait``
(push wait and the wait for the step's batch), ``time/step``, and the mixed-version samples per
step and the mean staleness, with the load average before and after.

    python benchmarks/bench_sglang_push.py --steps 20 --seeds 0 1 2 --max-staleness 1 2 --token-delay-s 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

from rllab_backends.sglang.launch import free_port  # noqa: E402

KEYS = ("time/push_wait", "time/sync", "time/rollout_wait", "time/step", "sglang/mixed_version_samples", "async/staleness_mean")


def one_run(push: str, k: int, seed: int, steps: int, tokens: int, delay: float, work: Path) -> list[dict]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'plugins'}", "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "sglang_standin.py"), "--port", str(port), "--instant", str(tokens),
         "--token-delay-s", str(delay), "--lifetime-s", "3600", "--weight-version", "0"],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    run_dir = work / f"{push}-{k}-{seed}"
    try:
        server.stdout.readline()  # "stand-in listening on ..."
        proc = subprocess.run(
            [sys.executable, "-m", "rllab", "run", "backend=sglang", f"backend.urls=http://127.0.0.1:{port}",
             f"backend.push={push}", f"rollout.max_staleness={k}", f"rollout.max_new_tokens={tokens}",
             "model.warm_start.steps=0", f"train.steps={steps}", f"train.seed={seed}", "train.checkpoint_every=0",
             "train.eval_size=16", "train.eval_every=0", "-q", "--run-dir", str(run_dir)],
            capture_output=True, text=True, env=env,
        )
    finally:
        server.terminate()
        server.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{push} seed {seed} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "time/push_wait" in r][1:]


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tokens", type=int, default=6, help="tokens per completion (rollout.max_new_tokens)")
    p.add_argument("--max-staleness", type=int, nargs="+", default=[1, 2])
    p.add_argument("--token-delay-s", type=float, default=0.05, help="the stand-in's seconds per decoded token")
    args = p.parse_args()
    load0 = os.getloadavg()[0]
    results = {}
    with tempfile.TemporaryDirectory(prefix="rllab-push-") as tmp:
        os.environ.setdefault("RLLAB_CACHE", str(Path(tmp) / "cache"))
        for k in args.max_staleness:
            for push in ("drain", "pause"):
                results[push, k] = [row for seed in args.seeds
                                    for row in one_run(push, k, seed, args.steps, args.tokens, args.token_delay_s, Path(tmp))]
    print(f"{args.steps} steps x seeds {args.seeds}, {args.tokens} tokens at {args.token_delay_s} s each "
          f"(a request decodes in {args.tokens * args.token_delay_s:.2f} s); load {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    print("| max_staleness | push | steps | " + " | ".join(KEYS) + " |")
    print("|---|---|---|" + "---|" * len(KEYS))
    for (push, k), rows in results.items():
        print(f"| {k} | {push} | {len(rows)} | " + " | ".join(summary([r.get(key, 0.0) for r in rows]) for key in KEYS) + " |")


if __name__ == "__main__":
    main()
