"""Partial rollouts (``rollout.over_sample``): step time and accuracy at equal steps, off vs drop vs continue.

The task has long-tailed response lengths: ``tailed_reverse`` (registered by this file, loaded with
``--plugin``) reverses a digit string whose length is short (1–4) for 80 % of the prompts and long
(2/3 of ``max_length`` up to ``max_length``) for the rest, so a step's sampling waits for its few
longest answers. Each configuration is ``rllab run`` in a fresh process (the tiny model's warm start on
this task is cached after the first run), for each backend:

- ``hf``: in-process sampling (``generate_until`` stops the batch after the token that completes
  the P-th group);
- ``sglang``: the stand-in server (tests/sglang_standin.py, launched by the backend with the run's
  model) sampling with the real weights and decoding one token per ``--token-delay-s`` seconds, as
  a GPU server takes time per token; ``generate_until`` sends ``/abort_request`` for the rows still
  running once P groups are complete.

Reported per backend and mode, over the seeds: the mean ``time/step`` and ``time/rollout`` over
the steps (the first left out), the mean response length trained on, and held-out greedy accuracy
before → after. Baseline and feature run in the same invocation, alternating per seed.

    python benchmarks/bench_partial.py --steps 8 --seeds 0 1 2 --token-delay-s 0.1
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

import torch

import rllab

ROOT = Path(__file__).resolve().parents[1]
MODES = {"off": [], "drop": ["rollout.over_sample=0.5"], "continue": ["rollout.over_sample=0.5", "rollout.partial=continue"]}


def tailed_reverse(*, config):
    """Reverse a digit string; lengths long-tailed (see the module docstring)."""
    from rllab_tasks.tasks.strings import _ALPHABETS, ReverseTask
    from rllab.types import Example

    class TailedReverse(ReverseTask):
        name = "tailed_reverse"

        def draw(self, gen, k):
            c = self.config
            chars = _ALPHABETS[c.alphabet]
            long = (torch.rand(k, generator=gen) < 0.2).tolist()
            short = torch.randint(c.min_length, min(4, c.max_length) + 1, (k,), generator=gen).tolist()
            tail = torch.randint(max(c.min_length, 2 * c.max_length // 3), c.max_length + 1, (k,), generator=gen).tolist()
            idx = torch.randint(0, len(chars), (k, c.max_length), generator=gen).tolist()
            out = []
            for is_long, a, b, row in zip(long, short, tail, idx):
                s = "".join(chars[i] for i in row[:b if is_long else a])
                out.append(Example(prompt=f"{self.verb} {s}:", answer=self.transform(s), meta={"input": s}))
            return out

    return TailedReverse(config)


@rllab.hookimpl
def register_tasks(register):
    from rllab_tasks.tasks.strings import StringTaskConfig

    register("tailed_reverse", tailed_reverse, config=StringTaskConfig, reward_components=())


def one_run(backend: str, mode: str, seed: int, args, work: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'plugins'}", "OMP_NUM_THREADS": "1"}
    extra = ["backend=hf"]
    if backend == "sglang":
        cmd = (f"{sys.executable} {ROOT / 'tests' / 'sglang_standin.py'} --model-path {{model_path}} --port {{port}} "
               f"--weight-version {{weight_version}} --lifetime-s 1200 --token-delay-s {args.token_delay_s}")
        extra = ["backend=sglang", "backend.launch=true", f"backend.launch_command={json.dumps(cmd)}",
                 "backend.launch_timeout_s=120"]
    run_dir = work / f"{backend}-{mode}-{seed}"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "rllab", "run", "--plugin", str(Path(__file__).resolve()), "task=tailed_reverse",
         "task.min_length=1", f"task.max_length={args.max_length}", f"rollout.max_new_tokens={args.max_length + 4}",
         f"rollout.prompts_per_step={args.prompts}", "rollout.group_size=4", *extra, *MODES[mode],
         f"train.steps={args.steps}", f"train.seed={seed}", "train.checkpoint_every=0", "train.eval_size=64",
         "-q", "--run-dir", str(run_dir)],
        capture_output=True, text=True, env=env,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{backend} {mode} seed {seed} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r][1:]
    final = json.loads((run_dir / "final.json").read_text())
    return {"step": statistics.mean(r["time/step"] for r in steps), "rollout": statistics.mean(r["time/rollout"] for r in steps),
            "length": statistics.mean(r["rollout/response_length"] for r in steps),
            "before": final["initial/accuracy"], "after": final["final/accuracy"], "wall": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--backends", nargs="+", default=["hf", "sglang"], choices=("hf", "sglang"))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=tuple(MODES))
    p.add_argument("--prompts", type=int, default=16, help="rollout.prompts_per_step (P)")
    p.add_argument("--max-length", type=int, default=24, help="the longest string (rollout.max_new_tokens = it + 4)")
    p.add_argument("--token-delay-s", type=float, default=0.1, help="the stand-in's seconds per decoded token")
    args = p.parse_args()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="rllab-partial-") as tmp:
        out = {(b, m): [] for b in args.backends for m in args.modes}
        for seed in args.seeds:
            for b in args.backends:
                for m in args.modes:
                    out[b, m].append(one_run(b, m, seed, args, Path(tmp)))
                    print(f"  {b} {m} seed {seed}: {out[b, m][-1]}", file=sys.stderr)
    print(f"{args.steps} steps x seeds {args.seeds}, P = {args.prompts}, G = 4, max_length {args.max_length}, "
          f"stand-in {args.token_delay_s} s/token; load {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    print("| backend | mode | time/step (s) | time/rollout (s) | response length | accuracy before → after |")
    print("|---|---|---|---|---|---|")
    for (b, m), rs in out.items():
        mean = lambda k: statistics.mean(r[k] for r in rs)  # noqa: E731
        print(f"| {b} | {m} | {mean('step'):.3f} | {mean('rollout'):.3f} | {mean('length'):.1f} | "
              f"{mean('before'):.3f} → {mean('after'):.3f} |")


if __name__ == "__main__":
    main()
