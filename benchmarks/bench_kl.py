"""Full-vocabulary KL: rllab's chunked ``full`` penalty against the plain autograd formula.

The baseline is what one writes without thinking about memory::

    log_p = log_softmax(logits); log_q = log_softmax(ref_logits)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)

Autograd keeps several (B, T, V) float32 tensors of it alive for the backward. rllab's ``full``
keeps only its inputs and the (B, T) result, recomputing the softmaxes chunk by chunk in the
backward. The script times forward + backward of both side by side (median, min, max over
repeats, interleaved so load drifts hit both), reports the bytes each saves for the backward
(exact, from ``saved_tensors_hooks``), the peak CUDA memory when run on a GPU, and checks that
both give the same values and gradients.

    python benchmarks/bench_kl.py                        # CPU, B=4 T=128 V=32000
    python benchmarks/bench_kl.py --device cuda --B 8 --T 1024 --V 151936 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import rllab


def naive_full_kl(logits, ref_logits):
    log_p = torch.log_softmax(logits.float(), dim=-1)
    log_q = torch.log_softmax(ref_logits.float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def saved_bytes(fn, logits, ref_logits) -> int:
    """Bytes autograd saves for the backward, not counting tensors that alias the inputs."""
    inputs = {logits.data_ptr(), ref_logits.data_ptr()}
    seen: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in inputs:
            seen[t.data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(logits, ref_logits)
    return sum(seen.values())


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_once(fn, logits, ref_logits, weights, device):
    logits.grad = None
    sync(device)
    t0 = time.perf_counter()
    (fn(logits, ref_logits) * weights).sum().backward()
    sync(device)
    return time.perf_counter() - t0


def peak_cuda(fn, logits, ref_logits, weights, device):
    if device.type != "cuda":
        return None
    logits.grad = None
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    (fn(logits, ref_logits) * weights).sum().backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--V", type=int, default=32000)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--chunk-tokens", type=int, default=None)
    args = ap.parse_args()

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device="cpu").manual_seed(0)
    logits = (torch.randn(args.B, args.T, args.V, generator=g) * 2).to(device, dtype).requires_grad_(True)
    ref_logits = (logits.detach().float() + 0.5 * torch.randn(args.B, args.T, args.V, generator=g).to(device)).to(dtype)
    weights = torch.randn(args.B, args.T, generator=g).to(device)

    knobs = {"chunk_tokens": args.chunk_tokens} if args.chunk_tokens else {}
    full = rllab.Lab().get("kl_penalty", "full", **knobs)

    def rllab_full(z, y):
        return full(log_prob=None, ref_log_prob=None, logits=z, ref_logits=y)

    # correctness on the benchmark inputs
    a = rllab_full(logits, ref_logits)
    (a * weights).sum().backward()
    ga = logits.grad.clone()
    logits.grad = None
    b = naive_full_kl(logits, ref_logits)
    (b * weights).sum().backward()
    gb = logits.grad.clone()
    val_err = ((a - b).abs() / b.abs().clamp(min=1e-6)).max().item()
    grad_err = ((ga.float() - gb.float()).abs().max() / gb.float().abs().max()).item()
    del a, b, ga, gb

    print(f"device={device} B={args.B} T={args.T} V={args.V} dtype={args.dtype} threads={torch.get_num_threads()}")
    print(f"max relative value difference {val_err:.2e}; max gradient difference / max |gradient| {grad_err:.2e}")
    print(f"loadavg before: {os.getloadavg()}")
    times = {"baseline (plain autograd)": [], "rllab full (chunked)": []}
    fns = {"baseline (plain autograd)": naive_full_kl, "rllab full (chunked)": rllab_full}
    for fn in fns.values():  # warm-up
        run_once(fn, logits, ref_logits, weights, device)
    for _ in range(args.repeats):
        for name, fn in fns.items():
            times[name].append(run_once(fn, logits, ref_logits, weights, device))
    print(f"loadavg after:  {os.getloadavg()}")

    med = {}
    for name, ts in times.items():
        med[name] = statistics.median(ts)
        saved = saved_bytes(fns[name], logits, ref_logits)
        peak = peak_cuda(fns[name], logits, ref_logits, weights, device)
        peak_s = f", peak CUDA memory above inputs {peak / 2**20:,.1f} MiB" if peak is not None else ""
        print(
            f"{name:28s} fwd+bwd median {med[name] * 1e3:9.2f} ms (min {min(ts) * 1e3:9.2f}, max {max(ts) * 1e3:9.2f}); "
            f"saved for backward {saved / 2**20:,.3f} MiB{peak_s}"
        )
    base, ours = med["baseline (plain autograd)"], med["rllab full (chunked)"]
    print(f"time ratio rllab / baseline: {ours / base:.2f}")


if __name__ == "__main__":
    main()
