"""Actor loss: separate components (as a trainer builds it) vs ``rllab_policy_losses.fused.fused_ppo_loss``.

Both sides compute, for B × T response tokens, forward *and* backward of

    loss = ppo_clip + kl_coef·aggregate(k3(log π, log π_ref)) − entropy_coef·aggregate(entropy)

with the same metrics (approx_kl, approx_kl_k3, clipfrac, and each component's aggregated value).

* separate: ``lab.get("policy_loss", "ppo_clip")``, ``lab.get("kl_penalty", "k3")`` and
  ``lab.get("loss_aggregation", "token-mean")`` called one after the other, ``loss.backward()``;
* fused: one call to ``fused_ppo_loss`` (one autograd node), ``loss.backward()``.

Run::

    python benchmarks/bench_losses.py                 # B=256, T=2048, float32, 1 thread
    python benchmarks/bench_losses.py --threads 0     # torch's default thread count
    python benchmarks/bench_losses.py --clip-c 3.0 --mode seq-mean-token-mean
    python benchmarks/bench_losses.py --compile       # adds fused_ppo_loss(compile=True)

The two sides are timed alternately in the same process (the order flips every repetition) so
that both see the same machine load; the script prints medians with min/max, the ratio of the
medians, the load average before and after, and how closely the two results agree.

On a shared machine, torch's default of one OpenMP thread per core can be much slower than one
thread when other processes keep the cores busy (the threads wait for each other at every
operation), hence ``--threads 1`` by default; ``--threads 0`` keeps torch's setting.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import rllab


def make_inputs(B: int, T: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 8, T + 1, (B,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)  # right-padded responses
    log_prob = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    old_log_prob = log_prob + 0.1 * torch.randn(B, T, generator=g, dtype=dtype)
    ref_log_prob = log_prob + 0.2 * torch.randn(B, T, generator=g, dtype=dtype)
    advantages = torch.randn(B, 1, generator=g, dtype=dtype).expand(B, T).contiguous()
    entropy = 2 * torch.rand(B, T, generator=g, dtype=dtype)
    return dict(log_prob=log_prob, old_log_prob=old_log_prob, ref_log_prob=ref_log_prob,
                advantages=advantages, entropy=entropy, mask=mask)


def build(args):
    lab = rllab.Lab()
    agg_comp = lab.get("loss_aggregation", args.mode)
    aggregate = lambda loss_mat, mask: agg_comp(loss_mat=loss_mat, mask=mask)  # noqa: E731
    if args.clip_c is None:
        policy_loss = lab.get("policy_loss", "ppo_clip", clip_low=0.2, clip_high=args.clip_high)
    else:
        policy_loss = lab.get("policy_loss", "ppo_dual_clip", clip_low=0.2, clip_high=args.clip_high, clip_c=args.clip_c)
    k3 = lab.get("kl_penalty", "k3")

    from rllab_policy_losses.fused import fused_ppo_loss

    def separate(x):
        log_prob = x["log_prob"].clone().requires_grad_(True)
        entropy = x["entropy"].clone().requires_grad_(True)
        mask = x["mask"]
        pg_loss, metrics = policy_loss(log_prob=log_prob, old_log_prob=x["old_log_prob"],
                                       advantages=x["advantages"], mask=mask, aggregate=aggregate)
        kl_loss = aggregate(k3(log_prob=log_prob, ref_log_prob=x["ref_log_prob"]), mask)
        ent_loss = aggregate(entropy, mask)
        loss = pg_loss + args.kl_coef * kl_loss - args.entropy_coef * ent_loss
        metrics.update({"loss/policy": pg_loss.detach(), "loss/kl": kl_loss.detach(), "loss/entropy": ent_loss.detach()})
        loss.backward()
        return loss.detach(), log_prob.grad, entropy.grad, metrics

    def fused(x, compile=False):
        log_prob = x["log_prob"].clone().requires_grad_(True)
        entropy = x["entropy"].clone().requires_grad_(True)
        loss, metrics = fused_ppo_loss(
            log_prob=log_prob, old_log_prob=x["old_log_prob"], advantages=x["advantages"], mask=x["mask"],
            aggregate=aggregate, entropy=entropy, ref_log_prob=x["ref_log_prob"], kl_coef=args.kl_coef,
            entropy_coef=args.entropy_coef, clip_low=0.2, clip_high=args.clip_high, clip_c=args.clip_c,
            compile=compile,
        )
        loss.backward()
        return loss.detach(), log_prob.grad, entropy.grad, metrics

    return separate, fused


def agreement(a, b) -> str:
    rel_loss = float((a[0] - b[0]).abs() / a[0].abs().clamp(min=1e-30))
    rel_grad = float((a[1] - b[1]).abs().max() / a[1].abs().max().clamp(min=1e-30))
    rel_ent = float((a[2] - b[2]).abs().max() / a[2].abs().max().clamp(min=1e-30))
    worst_metric = max(float((a[3][k] - b[3][k]).abs()) for k in a[3])
    return (f"|Δloss|/|loss| = {rel_loss:.1e}, max|Δ∂/∂log π|/max = {rel_grad:.1e}, "
            f"max|Δ∂/∂H|/max = {rel_ent:.1e}, worst metric |Δ| = {worst_metric:.1e}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--B", type=int, default=256)
    p.add_argument("--T", type=int, default=2048)
    p.add_argument("--dtype", choices=("float32", "float64", "bfloat16"), default="float32")
    p.add_argument("--reps", type=int, default=30, help="timed repetitions per side")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: leave torch's default)")
    p.add_argument("--mode", default="token-mean", help="loss aggregation mode")
    p.add_argument("--clip-high", type=float, default=0.2)
    p.add_argument("--clip-c", type=float, default=None, help="dual-clip c (default: plain ppo_clip)")
    p.add_argument("--kl-coef", type=float, default=0.05)
    p.add_argument("--entropy-coef", type=float, default=0.01)
    p.add_argument("--compile", action="store_true", help="also time fused_ppo_loss(compile=True)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    args = p.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    x = {k: v.to(args.device) for k, v in make_inputs(args.B, args.T, dtype).items()}
    separate, fused = build(args)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    loss_name = "ppo_clip" if args.clip_c is None else f"ppo_dual_clip(c={args.clip_c})"
    print(f"bench_losses: B={args.B} T={args.T} {args.dtype}, {args.mode}, {loss_name} + k3 + entropy, "
          f"forward+backward; torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"valid tokens {float(x['mask'].float().mean()):.1%}")
    print(f"load average before: {os.getloadavg()}")

    reference = separate(x)
    print(f"agreement, fused:          {agreement(reference, fused(x))}")
    sides = [("separate", separate), ("fused", fused)]
    if args.compile:
        t0 = time.perf_counter()
        compiled = fused(x, compile=True)
        print(f"compile (first call): {time.perf_counter() - t0:.1f} s")
        print(f"agreement, fused+compile:  {agreement(reference, compiled)}")
        sides.append(("fused+compile", lambda x: fused(x, compile=True)))
    for _ in range(args.warmup):
        for _, fn in sides:
            fn(x)
    times = {name: [] for name, _ in sides}
    for rep in range(args.reps):
        for name, fn in sides if rep % 2 == 0 else sides[::-1]:
            sync()
            t0 = time.perf_counter()
            fn(x)
            sync()
            times[name].append(time.perf_counter() - t0)

    label = {"separate": "separate (3 components, autograd)", "fused": "fused (fused_ppo_loss)",
             "fused+compile": "fused (compile=True)"}
    for name, ts in times.items():
        ms = [1e3 * t for t in ts]
        print(f"{label[name]:36s} median {statistics.median(ms):8.2f} ms   min {min(ms):8.2f}   max {max(ms):8.2f}"
              f"   (n={len(ms)})")
    for name in times:
        if name != "separate":
            ratio = statistics.median(times["separate"]) / statistics.median(times[name])
            print(f"ratio separate/{name} (medians): {ratio:.2f}x")
    print(f"load average after:  {os.getloadavg()}")


if __name__ == "__main__":
    main()
