"""On-policy distillation's estimators side by side: ``k1``, ``k3``, and the exact KL over the
teacher's top-k (``reverse_topk``, ``forward_topk``), on the tiny model.

The teacher is the warm-started tiny model; every student starts from the same untrained tiny
model (no warm start) and trains ``--steps`` steps at ``train.lr`` on its own samples, per seed. Reported per
estimator: ``distill/k1`` (the sampled reverse-KL estimate, the same measure for every
estimator) over the first and the last four steps, the held-out accuracy at the end, and the
median time of a step with its min and max, with the load average seen.

    python benchmarks/bench_opd.py --steps 24 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

SMALL = {
    "model.tiny.hidden_size": 64, "model.tiny.intermediate_size": 128, "model.warm_start.steps": 60, "model.warm_start.eval_limit": 0,
    "rollout.prompts_per_step": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 6, "rollout.temperature": 1.0,
    "train.eval_size": 64, "train.checkpoint_every": 0, "train.eval_every": 0,
}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--topk", type=int, default=32)
    p.add_argument("--default-model", action="store_true",
                   help="the default tiny model and warm start (a stronger teacher) instead of the test-sized one")
    args = p.parse_args()

    import torch

    from rllab.config import load_config
    from rllab.training.trainer import Trainer

    torch.set_num_threads(1)
    base = [f"{k}={v}" for k, v in SMALL.items() if not (args.default_model and k.startswith("model."))]
    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer(load_config(None, base), run_dir=Path(tmp) / "teacher", progress=False)
        teacher, teacher_acc = t.model_dir, t.evaluate()["eval/accuracy"]
        t.close()
        rows = []
        for est in ("k1", "k3", "reverse_topk", "forward_topk"):
            first, last, acc, times, loads = [], [], [], [], []
            for seed in args.seeds:
                knobs = [*base, "model.warm_start.steps=0", "algorithm=opd", f"algorithm.teacher={teacher}", f"algorithm.estimator={est}",
                         f"train.lr={args.lr}", f"train.steps={args.steps}", f"train.seed={seed}"]
                if est.endswith("topk"):
                    knobs.append(f"algorithm.topk={args.topk}")
                tr = Trainer(load_config(None, knobs), run_dir=Path(tmp) / f"{est}-{seed}", progress=False)
                ms = [tr.train_step() for _ in range(args.steps)]
                loads.append(os.getloadavg()[0])
                acc.append(tr.evaluate()["eval/accuracy"])
                tr.close()
                k1 = [m["distill/k1"] for m in ms]
                first.append(statistics.fmean(k1[:4]))
                last.append(statistics.fmean(k1[-4:]))
                times += [m["time/step"] for m in ms[1:]]
            rows.append((est, statistics.fmean(first), statistics.fmean(last), statistics.fmean(acc), statistics.median(times),
                         min(times), max(times), min(loads), max(loads)))
    print("| estimator | distill/k1, first 4 steps | last 4 steps | final accuracy | step s: median (min–max) | load |")
    print("|---|---:|---:|---:|---|---|")
    for est, f, l, a, med, lo, hi, l0, l1 in rows:
        print(f"| {est} | {f:.3f} | {l:.3f} | {100 * a:.1f}% | {med:.3f} ({lo:.3f}–{hi:.3f}) | {l0:.1f}–{l1:.1f} |")
    print(f"\n{len(args.seeds)} seeds × {args.steps} steps, lr {args.lr}, topk {args.topk}; means over seeds; "
          f"the teacher's held-out accuracy {100 * teacher_acc:.1f}%")


if __name__ == "__main__":
    main()
