"""Time of grouped_response_logprobs (each distinct prompt encoded once) vs response_logprobs.

Run::

    python benchmarks/bench_prefix.py                         # B = 16 prompts x 8, P = 7 and 32, T = 8
    python benchmarks/bench_prefix.py --prompt-lengths 7 --reps 5     # a quick smoke run

A GRPO-style batch: ``--prompts`` distinct prompts, each repeated ``--group`` times, every prompt
``P`` tokens (a sixth of the rows' prompts are left-padded by one or two columns), responses of
1..T tokens right-padded to ``T``. The model is rllab's tiny default (``build_tiny_model``), in
train mode, one CPU thread. ``plain`` = ``response_logprobs`` (every row runs prompt + response
through the decoder), ``grouped`` = ``grouped_response_logprobs``.

``fwd+bwd`` times the log-probs and entropy plus ``backward()`` of ``Σ w·log π + 0.01·Σ w·H``
(the policy update); ``fwd`` runs under ``torch.no_grad()`` (old-policy / reference passes).
The two implementations alternate within every repetition (after one warm-up call each), so
load changes hit both; times are medians (min–max). The load average is printed before and
after, and the largest difference between the two implementations' log-probs as a check.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from rllab.models.forward import grouped_response_logprobs, response_logprobs
from rllab.models.tiny import TinyModelConfig, build_tiny_model


def make_batch(prompts: int, group: int, P: int, T: int, vocab: int, seed: int = 0):
    """(B, P + T) ids and mask: ``prompts`` distinct prompts × ``group`` rows each."""
    g = torch.Generator().manual_seed(seed)
    B = prompts * group
    ids = torch.zeros(B, P + T, dtype=torch.long)
    mask = torch.zeros(B, P + T, dtype=torch.bool)
    for k in range(prompts):
        n = P - (k % 6 == 5) * (1 + k % 2)  # a few shorter, left-padded prompts
        prompt = torch.randint(4, vocab, (n,), generator=g)
        for r in range(k * group, (k + 1) * group):
            ids[r, P - n : P] = prompt
            mask[r, P - n : P] = True
            t = int(torch.randint(1, T + 1, (1,), generator=g))
            ids[r, P : P + t] = torch.randint(4, vocab, (t,), generator=g)
            mask[r, P : P + t] = True
    return ids, mask


def step(fn, model, ids, mask, T, weights, backward: bool):
    for p in model.parameters():
        p.grad = None
    t0 = time.perf_counter()
    with torch.set_grad_enabled(backward):
        log_prob, entropy = fn(model, ids, mask, T, with_entropy=True)
        if backward:
            (weights * log_prob + 0.01 * weights * entropy).sum().backward()
    return time.perf_counter() - t0, log_prob.detach()


def fmt(ts):
    return f"{statistics.median(ts) * 1e3:8.2f} ms ({min(ts) * 1e3:.2f}–{max(ts) * 1e3:.2f})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=16, help="distinct prompts")
    p.add_argument("--group", type=int, default=8, help="samples per prompt (G)")
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=[7, 32], help="prompt columns P")
    p.add_argument("--response-length", type=int, default=8, help="response columns T")
    p.add_argument("--reps", type=int, default=30, help="timed repetitions of each implementation")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = build_tiny_model(TinyModelConfig())
    model.train()
    vocab, T = len(tokenizer), args.response_length
    B = args.prompts * args.group
    impls = {"plain": response_logprobs, "grouped": grouped_response_logprobs}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} cpus")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny Qwen2: {n_params:,} parameters, V={vocab}; B={B} ({args.prompts} prompts x {args.group}), T={T}")
    print(f"loadavg before: {os.getloadavg()}")
    rows = []
    for P in args.prompt_lengths:
        ids, mask = make_batch(args.prompts, args.group, P, T, vocab)
        weights = torch.randn(B, T, generator=torch.Generator().manual_seed(1))
        for mode, backward in (("fwd+bwd", True), ("fwd", False)):
            times = {name: [] for name in impls}
            out = {}
            for rep in range(args.reps + 1):
                for name, fn in impls.items():
                    dt, out[name] = step(fn, model, ids, mask, T, weights, backward)
                    if rep:
                        times[name].append(dt)
            diff = (out["plain"] - out["grouped"]).abs().max().item()
            ratio = statistics.median(times["plain"]) / statistics.median(times["grouped"])
            rows.append((P, mode, times, ratio, diff))
            print(
                f"P={P:3d} {mode:8s} plain {fmt(times['plain'])}  grouped {fmt(times['grouped'])}  "
                f"plain/grouped {ratio:5.2f}x  max |Δ log π| {diff:.1e}",
                flush=True,
            )
    print(f"loadavg after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
