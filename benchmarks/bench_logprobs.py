"""Peak memory and time of rllab's chunked log-prob / entropy kernels vs the dense formulas.

Run::

    python benchmarks/bench_logprobs.py                  # N = 4096, V = 151,936, D = 896
    python benchmarks/bench_logprobs.py --n 512 --rounds 1 --reps 1   # a quick smoke run

Variants (each measured in a fresh subprocess, so the resident-set peak belongs to it alone):

* ``logits/*``: given float32 logits ``(N, V)``, log π(label) and the entropy.
  dense = ``log_softmax(logits).gather(...)`` plus a separate entropy pass
  (``logsumexp(logits) − Σ softmax(logits)·logits``); rllab = ``logprobs_from_logits``.
* ``hidden/*``: given hidden states ``(N, D)`` and an LM head ``(V, D)``.
  dense = ``hidden @ Wᵀ`` then the dense formulas; rllab = ``logprobs_from_hidden`` (never forms
  the logits).

``fwd`` runs under ``torch.no_grad()`` (the old-policy / reference passes); ``fwd+bwd`` runs with
gradients and backpropagates ``Σ (g₁·log π + g₂·H)``. Peak extra memory is ``ru_maxrss`` minus the
resident set right after the inputs were created, so it counts everything the computation
allocates — including, in ``logits/fwd+bwd``, the ``(N, V)`` gradient of the logits, which any
method must produce, and in ``hidden/fwd+bwd`` the gradients of the hidden states and of the head;
"excl. grads" subtracts those. Percentages are of the float32 logits size.
The load average is printed before and after; times are medians (min–max) over all repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

VARIANTS = [
    ("logits", "fwd", "dense"),
    ("logits", "fwd", "rllab"),
    ("logits", "fwd+bwd", "dense"),
    ("logits", "fwd+bwd", "rllab"),
    ("hidden", "fwd", "dense"),
    ("hidden", "fwd", "rllab"),
    ("hidden", "fwd+bwd", "dense"),
    ("hidden", "fwd+bwd", "rllab"),
]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def dense_stats(logits: torch.Tensor, labels: torch.Tensor):
    """The textbook formulas: log_softmax + gather, and a separate entropy pass."""
    log_prob = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    probs = torch.softmax(logits, dim=-1)
    entropy = torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
    return log_prob, entropy


def child(path: str, mode: str, impl: str, n: int, vocab: int, dim: int, reps: int, chunk_size) -> dict:
    """Runs one variant ``reps + 1`` times (the first is a warm-up) and reports time and memory."""
    from rllab.kernels.chunked import logprobs_from_hidden, logprobs_from_logits

    torch.manual_seed(0)
    grad = mode == "fwd+bwd"
    labels = torch.randint(0, vocab, (n,))
    g_lp, g_ent = torch.randn(n), torch.randn(n)
    if path == "logits":
        logits = torch.randn(n, vocab).requires_grad_(grad)
        leaves = [logits]
    else:
        hidden = torch.empty(n, dim).normal_().requires_grad_(grad)
        weight = torch.empty(vocab, dim).normal_(std=dim**-0.5).requires_grad_(grad)
        leaves = [hidden, weight]

    def run():
        with torch.set_grad_enabled(grad):
            if path == "logits" and impl == "dense":
                lp, ent = dense_stats(logits, labels)
            elif path == "logits":
                lp, ent = logprobs_from_logits(logits, labels, chunk_size=chunk_size, with_entropy=True)
            elif impl == "dense":
                lp, ent = dense_stats(hidden @ weight.t(), labels)
            else:
                lp, ent = logprobs_from_hidden(hidden, weight, labels, chunk_size=chunk_size, with_entropy=True)
            if grad:
                (lp * g_lp + ent * g_ent).sum().backward()
        return lp, ent

    baseline = rss_bytes()
    # Fail with an allocation error rather than wake the OOM killer on a shared machine:
    # cap the address space at what is mapped now plus what is available, less a margin.
    headroom = meminfo("MemAvailable") - (1 << 30)
    limit = status_bytes("VmSize") + headroom
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    # gradients any method must return: d/dlogits (N, V), or d/dhidden (N, D) and d/dW (V, D)
    grad_bytes = 0 if not grad else 4 * n * vocab if path == "logits" else 4 * (n + vocab) * dim
    times, checksum = [], None
    try:
        for i in range(reps + 1):
            for leaf in leaves:
                leaf.grad = None
            t0 = time.perf_counter()
            lp, ent = run()
            dt = time.perf_counter() - t0
            if i:
                times.append(dt)
            checksum = [float(lp.detach().double().sum()), float(ent.detach().double().sum())]
            del lp, ent
    except RuntimeError as e:
        if "alloc" not in str(e).lower() and "memory" not in str(e).lower():
            raise
        return {"error": f"out of memory: needs more than {headroom / 2**30:.1f} GiB extra", "grad_bytes": grad_bytes}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"times": times, "extra": peak - baseline, "grad_bytes": grad_bytes, "checksum": checksum}


def meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def spawn(variant, args) -> dict:
    cmd = [
        sys.executable, __file__, "--child", ",".join(variant),
        "--n", str(args.n), "--vocab", str(args.vocab), "--dim", str(args.dim), "--reps", str(args.reps),
    ]
    if args.chunk_size:
        cmd += ["--chunk-size", str(args.chunk_size)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"variant {variant} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt_times(ts):
    return f"{statistics.median(ts):7.3f}s ({min(ts):.3f}–{max(ts):.3f})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=4096, help="tokens")
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--dim", type=int, default=896, help="hidden size for the hidden-state path")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per subprocess (after 1 warm-up)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (one subprocess per variant each)")
    p.add_argument("--chunk-size", type=int, default=None, help="tokens per chunk (default: rllab's)")
    p.add_argument("--only", default="", help="comma-separated path filter: logits, hidden")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        path, mode, impl = args.child.split(",")
        print(json.dumps(child(path, mode, impl, args.n, args.vocab, args.dim, args.reps, args.chunk_size)))
        return

    from rllab.kernels.chunked import CHUNK_ELEMENTS, _hidden_tile

    variants = [v for v in VARIANTS if not args.only or v[0] in args.only.split(",")]
    logits_bytes = 4 * args.n * args.vocab
    chunk = args.chunk_size or max(1, CHUNK_ELEMENTS // args.vocab)
    tile = _hidden_tile(args.chunk_size, None, args.n, args.vocab, "bench")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus")
    print(f"N={args.n} V={args.vocab} D={args.dim}; float32 logits = {logits_bytes / 2**30:.2f} GiB")
    print(f"logits path: {chunk} tokens per chunk; hidden path: tiles of {tile[0]} tokens x {tile[1]} vocabulary entries")
    print(f"loadavg before: {os.getloadavg()}")
    results: dict = {}
    t_start = time.perf_counter()
    for r in range(args.rounds):
        for v in variants:
            res = spawn(v, args)
            if "error" in res:
                print(f"  round {r}: {'/'.join(v):24s} {res['error']}", flush=True)
                continue
            agg = results.setdefault(v, {"times": [], "extra": [], "grad_bytes": res["grad_bytes"], "checksum": []})
            agg["times"] += res["times"]
            agg["extra"].append(res["extra"])
            agg["checksum"].append(res["checksum"])
            print(f"  round {r}: {'/'.join(v):24s} {fmt_times(res['times'])}  extra {res['extra'] / 2**30:6.2f} GiB", flush=True)
    print(f"loadavg after: {os.getloadavg()}  (wall {time.perf_counter() - t_start:.0f}s)")

    print()
    print(f"{'variant':24s} {'time median (min–max)':>28s} {'peak extra':>11s} {'% logits':>9s} {'excl. grads':>12s}")
    for v in variants:
        a = results.get(v)
        if a is None:
            print(f"{'/'.join(v):24s} {'did not fit in memory':>28s}")
            continue
        extra = max(a["extra"])
        excl = extra - a["grad_bytes"]
        print(
            f"{'/'.join(v):24s} {fmt_times(a['times']):>28s} {extra / 2**30:8.2f} GiB {100 * extra / logits_bytes:8.1f}% "
            f"{(f'{100 * excl / logits_bytes:9.1f}%' if a['grad_bytes'] else ''):>12s}"
        )
    print()
    print("rllab / dense ratios (time: median; memory: peak extra)")
    for path in ("logits", "hidden"):
        for mode in ("fwd", "fwd+bwd"):
            d, c = results.get((path, mode, "dense")), results.get((path, mode, "rllab"))
            if not d or not c:
                continue
            tr = statistics.median(c["times"]) / statistics.median(d["times"])
            mr = max(c["extra"]) / max(d["extra"])
            agree = max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(c["checksum"][0], d["checksum"][0]))
            print(f"  {path}/{mode:8s} time ×{tr:5.2f}   memory ×{mr:5.3f}   (Σ log π, Σ H rel. diff {agree:.1e})")


if __name__ == "__main__":
    main()
