"""Log-probs (+ entropy) on a CUDA GPU, forward + backward: dense vs rllab (torch / Triton) vs Liger.

Each (case, variant) runs in its own fresh process, so the peak-memory reading belongs to that
variant alone. Peak memory is ``torch.cuda.max_memory_allocated()`` during one forward + backward
minus the memory held just before it (the inputs), i.e. everything the variant allocates on top
of its inputs, the gradients included. Times are CUDA-event times of forward + backward, median
and [min, max] over ``--reps`` repeats after ``--warmup`` untimed ones.

Variants:
  dense   ``log_softmax(z / τ).gather()`` (and ``−Σ softmax·log_softmax``) with autograd; for the
          hidden cases ``z = hidden @ Wᵀ`` is materialised first
  torch   rllab's chunked torch path (``RLLAB_TRITON=0``)
  triton  rllab's Triton path (the default on CUDA)
  liger   Liger-Kernel's fused linear cross-entropy (hidden cases, log-prob only, τ = 1,
          reduction="sum")

    python benchmarks/bench_gpu_logprobs.py                 # every case, table at the end
    python benchmarks/bench_gpu_logprobs.py --only hidden   # cases whose name contains "hidden"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

V = 151_936
D = 896

# name: (path, dtype, N tokens)
CASES = {
    "hidden bf16 N=32768": ("hidden", "bfloat16", 32768),
    "hidden fp32 N=8192": ("hidden", "float32", 8192),
    "logits fp32 N=4096": ("logits", "float32", 4096),
    "logits bf16 N=16384": ("logits", "bfloat16", 16384),
}
VARIANTS = ["dense", "torch", "triton", "liger"]
MODES = ["lp", "lp+ent"]


def worker(case: str, variant: str, mode: str, reps: int, warmup: int, tile: str | None) -> dict:
    import torch

    path, dtype_name, N = CASES[case]
    dtype = getattr(torch, dtype_name)
    with_ent = mode == "lp+ent"
    os.environ["RLLAB_TRITON"] = "0" if variant == "torch" else "1"
    from rllab.models import forward as models
    from rllab.kernels import triton_impl as triton_kernels

    if tile:
        rows, cols = (int(x) for x in tile.split("x"))
        triton_kernels.TILE_ROWS, triton_kernels.TILE_BYTES = rows, rows * cols * (torch.finfo(dtype).bits // 8)
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    labels = torch.randint(0, V, (N,), device=dev, generator=g)
    g_lp = torch.randn(N, device=dev, generator=g)
    g_ent = torch.randn(N, device=dev, generator=g)
    if path == "hidden":
        x = torch.randn(N, D, device=dev, generator=g).to(dtype).requires_grad_()
        w = (torch.randn(V, D, device=dev, generator=g) * 0.02).to(dtype).requires_grad_()
        params = [x, w]
    else:
        x = (4 * torch.randn(N, V, device=dev, generator=g)).to(dtype).requires_grad_()
        params = [x]

    if variant == "liger":
        if path != "hidden" or with_ent:
            return {"skip": "Liger gives neither entropy nor a logits-only path"}
        from liger_kernel.ops import LigerFusedLinearCrossEntropyFunction
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss(reduction="sum")
        impl = LigerFusedLinearCrossEntropyFunction.__module__

        def step():
            liger(w, x, labels).backward()

    elif variant == "dense":
        impl = "torch autograd"

        def step():
            z = x @ w.t() if path == "hidden" else x
            log_p = torch.log_softmax(z.float(), -1)
            lp = log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            loss = (lp * g_lp).sum()
            if with_ent:
                loss = loss + (-(log_p.exp() * log_p).sum(-1) * g_ent).sum()
            loss.backward()

    else:
        impl = "rllab " + variant
        fn = models.logprobs_from_hidden if path == "hidden" else models.logprobs_from_logits
        args = (x, w, labels) if path == "hidden" else (x, labels)

        def step():
            out = fn(*args, with_entropy=with_ent)
            loss = (out[0] * g_lp).sum() + (out[1] * g_ent).sum() if with_ent else (out * g_lp).sum()
            loss.backward()

    def clear():
        for p in params:
            p.grad = None

    try:
        for _ in range(warmup):
            step()
            clear()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
            if i == 0:
                peak = torch.cuda.max_memory_allocated() - base
            clear()
    except torch.OutOfMemoryError:
        return {"oom": True, "impl": impl}
    return {
        "impl": impl,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "peak_gib": peak / 2**30,
        "device": torch.cuda.get_device_name(),
        "grad_hidden_fp32_mm": triton_kernels._MM_INTO_FP32,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tiles", default="", help="extra Triton tile shapes for hidden bf16, e.g. 8192x2048,2048x8192")
    ap.add_argument("--json", default="", help="also write the results to this file")
    ap.add_argument("--worker", nargs=4, metavar=("CASE", "VARIANT", "MODE", "TILE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        case, variant, mode, tile = a.worker
        print("RESULT " + json.dumps(worker(case, variant, mode, a.reps, a.warmup, tile if tile != "-" else None)))
        return
    jobs = []
    for case, (path, dtype, _) in CASES.items():
        if a.only not in case:
            continue
        for mode in MODES:
            for variant in a.variants.split(","):
                if variant == "liger" and (path != "hidden" or mode != "lp"):
                    continue
                jobs.append((case, variant, mode, "-"))
            if path == "hidden" and dtype == "bfloat16" and a.tiles:
                jobs += [(case, "triton", mode, t) for t in a.tiles.split(",")]
    results = []
    for case, variant, mode, tile in jobs:
        cmd = [sys.executable, __file__, "--reps", str(a.reps), "--warmup", str(a.warmup), "--worker", case, variant, mode, tile]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        r = json.loads(line[-1][7:]) if line else {"error": (proc.stderr or proc.stdout)[-600:]}
        r.update(case=case, variant=variant if tile == "-" else f"triton {tile}", mode=mode)
        results.append(r)
        print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    print("\n| case | output | variant | fwd+bwd ms, median [min, max] | peak extra GiB |")
    print("|---|---|---|---|---|")
    for r in results:
        if "median_ms" in r:
            t = f"{r['median_ms']:.1f} [{r['min_ms']:.1f}, {r['max_ms']:.1f}]"
            m = f"{r['peak_gib']:.2f}"
        else:
            t = "OOM" if r.get("oom") else ("—" if "skip" in r else "error")
            m = "—"
        print(f"| {r['case']} | {r['mode']} | {r['variant']} | {t} | {m} |")


if __name__ == "__main__":
    main()
