"""Advantage estimators: rllab's vectorised scans and segment sums against verl-style loops.

Baselines, written the way verl 0.9.1 writes them:

* ``gae``: a Python loop over the T token positions, (B,)-wide per step, skipping masked steps,
  then ``masked_whiten`` (verl's ``compute_gae_advantage_return``).
* ``reinforce_plus_plus``: the same kind of loop for the discounted return, then whitening.
* ``grpo`` / ``rloo``: a Python loop over rows into a dict of group id → scores, a loop over
  groups for the statistics, a loop over rows to apply them (verl's ``compute_grpo_outcome_
  advantage`` / ``compute_rloo_outcome_advantage``).

The loop runs on one thread; rllab runs on one and on two torch threads (``--threads``), all
interleaved repeat by repeat so a load drift hits every column; the table gives the median with
min/max, the speed-up of the medians over the loop, the ratio of the two-thread median to the
one-thread median (≤ 1: more threads are no slower), and the largest deviation from the loop
relative to the loop's largest magnitude (float32 inputs).
Masks are response masks with random lengths ("prefix"), or with observation spans cut into
them ("multi-turn": the scan's multipliers then come from the mask).

The process keeps freed memory for reuse, as the trainer does (``[train] keep_freed_memory``):
otherwise glibc returns the memory the loop frees to the OS, and each output of ours lands on
fresh pages whose faults cost more than its arithmetic (``--malloc-defaults`` measures that).

    python benchmarks/bench_advantages.py                 # the full table
    python benchmarks/bench_advantages.py --malloc-defaults   # glibc's malloc as it comes
    python benchmarks/bench_advantages.py --quick         # small sizes, a few seconds
    python benchmarks/bench_advantages.py --threads 1,2 --only gae   # thread counts; some estimators
    pytest benchmarks/bench_advantages.py                 # pytest-benchmark smoke runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

import torch

import rllab
from rllab.training.memory import keep_freed_memory

# --------------------------------------------------------------------------- verl-style baselines


def loop_masked_whiten(x, m):
    n = m.sum()
    mean = (x * m).sum() / (n + 1e-8)
    var = (((x - mean) ** 2) * m).sum() / (n + 1e-8) * n / (n - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def loop_gae(token_rewards, values, mask, gamma, lam):
    m = mask.to(token_rewards.dtype)
    next_values, last = 0, 0
    reversed_adv = []
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_values - values[:, t]
        new = delta + gamma * lam * last
        next_values = values[:, t] * m[:, t] + (1 - m[:, t]) * next_values
        last = new * m[:, t] + (1 - m[:, t]) * last
        reversed_adv.append(last)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    returns = advantages + values
    return loop_masked_whiten(advantages, m), returns


def loop_reinforce_pp(token_rewards, mask, gamma):
    m = mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = 0
    for t in reversed(range(token_rewards.shape[1])):
        new = token_rewards[:, t] + gamma * running
        returns[:, t] = new * m[:, t]
        running = new * m[:, t] + (1 - m[:, t]) * running
    return loop_masked_whiten(returns, m) * m, returns


def loop_grpo(token_rewards, mask, index, epsilon=1e-6):
    scores = token_rewards.sum(dim=-1)
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            stacked = torch.stack(group)
            id2mean[idx], id2std[idx] = stacked.mean(), stacked.std()
    for i in range(scores.shape[0]):
        scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
    return scores.unsqueeze(-1) * mask


def loop_rloo(token_rewards, mask, index):
    scores = token_rewards.sum(dim=-1)
    id2score, id2mean = defaultdict(list), {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx, group in id2score.items():
        id2mean[idx] = torch.tensor(0.0) if len(group) == 1 else torch.stack(group).mean()
    for i in range(scores.shape[0]):
        n = len(id2score[index[i]])
        if n > 1:
            scores[i] = scores[i] * n / (n - 1) - id2mean[index[i]] * n / (n - 1)
    return scores.unsqueeze(-1) * mask


# --------------------------------------------------------------------------- inputs


def make_batch(B, T, holes, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g) * 0.01  # a KL-in-reward term on every token
    values = torch.randn(B, T, generator=g)
    lengths = torch.randint(T // 8, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    rewards[torch.arange(B), lengths - 1] += torch.randint(0, 2, (B,), generator=g).float()  # the score
    if holes:  # four observation spans of T/32 tokens per row
        starts = torch.randint(0, T - T // 32, (B, 4), generator=g)
        pos = torch.arange(T)[None, None, :]
        inside = (pos >= starts[..., None]) & (pos < starts[..., None] + T // 32)
        mask &= ~inside.any(dim=1)
    return rewards, values, mask


def rel_dev(a, b, mask):
    a = torch.where(mask, a, 0.0).double()
    b = torch.where(mask, b, 0.0).double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


# --------------------------------------------------------------------------- timing


def time_interleaved(baseline, ours, repeats, threads):
    """Interleaved timings (seconds): the baseline on one thread, ours on each thread count.
    Returns ``(baseline_times, {threads: our_times})``."""
    for n in threads:  # warm-up (allocator, first-call dispatch, thread pool)
        torch.set_num_threads(n)
        ours()
    tb, to = [], {n: [] for n in threads}
    for _ in range(repeats):
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        baseline()
        tb.append(time.perf_counter() - t0)
        for n in threads:
            torch.set_num_threads(n)
            t0 = time.perf_counter()
            ours()
            to[n].append(time.perf_counter() - t0)
    torch.set_num_threads(1)
    return tb, to


def fmt(ts):
    ms = [t * 1e3 for t in ts]
    return f"{statistics.median(ms):8.2f} [{min(ms):7.2f}, {max(ms):7.2f}]"


def header(threads):
    cols = "".join(f"{f'rllab {n}t ms median [min, max]':>31}{f'x{n}t':>7}" for n in threads)
    ratio = f"{f'{threads[-1]}t/{threads[0]}t':>8}" if len(threads) > 1 else ""
    return f"{'estimator':<12}{'B':>6}{'T':>6} {'knobs':<12}{'mask':<11}{'loop ms median [min, max]':>30}{cols}{ratio}{'max dev':>9}"


def row(name, B, T, knobs, mask_kind, tb, to, dev):
    base = statistics.median(tb)
    cols = "".join(f"{fmt(ts):>31}{base / statistics.median(ts):>6.1f}x" for ts in to.values())
    medians = [statistics.median(ts) for ts in to.values()]
    ratio = f"{medians[-1] / medians[0]:>8.2f}" if len(medians) > 1 else ""
    return f"{name:<12}{B:>6}{T:>6} {knobs:<12}{mask_kind:<11}{fmt(tb):>30}{cols}{ratio}{dev:>9.1e}"


def bench_gae(lab, B, T, lam, holes, repeats, threads, gamma=1.0):
    r, v, m = make_batch(B, T, holes)
    est = lab.get("advantage_estimator", "gae", gamma=gamma, lam=lam)
    ref_adv, ref_ret = loop_gae(r, v, m, gamma, lam)
    adv, ret = est(token_rewards=r, values=v, mask=m, index=None)
    dev = max(rel_dev(adv, ref_adv, m), rel_dev(ret, ref_ret, m))
    tb, to = time_interleaved(
        lambda: loop_gae(r, v, m, gamma, lam), lambda: est(token_rewards=r, values=v, mask=m, index=None), repeats,
        threads,
    )
    return row("gae", B, T, f"γ={gamma:g} λ={lam:g}", "multi-turn" if holes else "prefix", tb, to, dev)


def bench_reinforce_pp(lab, B, T, gamma, holes, repeats, threads):
    r, _, m = make_batch(B, T, holes)
    est = lab.get("advantage_estimator", "reinforce_plus_plus", gamma=gamma)
    ref_adv, ref_ret = loop_reinforce_pp(r, m, gamma)
    adv, ret = est(token_rewards=r, mask=m, index=None)
    dev = max(rel_dev(adv, ref_adv, m), rel_dev(ret, ref_ret, m))
    tb, to = time_interleaved(
        lambda: loop_reinforce_pp(r, m, gamma), lambda: est(token_rewards=r, mask=m, index=None), repeats, threads
    )
    return row("reinforce++", B, T, f"γ={gamma:g}", "multi-turn" if holes else "prefix", tb, to, dev)


def bench_group(lab, name, B, T, G, repeats, threads):
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    m = torch.arange(T)[None, :] < lengths[:, None]
    r = torch.zeros(B, T)
    r[torch.arange(B), lengths - 1] = torch.randint(0, 2, (B,), generator=g).float()
    index = torch.arange(B) // G
    index = index[torch.randperm(B, generator=g)]
    index_np = index.numpy()  # verl passes the uid column as a numpy array
    loop = {"grpo": loop_grpo, "rloo": loop_rloo}[name]
    est = lab.get("advantage_estimator", name)  # defaults; no reward sits on a masked token here
    ref = loop(r, m, index_np)
    adv, _ = est(token_rewards=r, mask=m, index=index)
    dev = rel_dev(adv, ref, m)
    tb, to = time_interleaved(
        lambda: loop(r, m, index_np), lambda: est(token_rewards=r, mask=m, index=index), repeats, threads
    )
    return row(name, B, T, f"G={G}", "prefix", tb, to, dev)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per row (default 5)")
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument(
        "--malloc-defaults", action="store_true",
        help="leave glibc malloc as it is (by default the process keeps freed memory, as the trainer does: "
        "[train] keep_freed_memory)",
    )
    parser.add_argument("--threads", default="1,2", help="torch thread counts for rllab's column(s) (default 1,2)")
    parser.add_argument("--only", default="", help="run only the estimators named here (comma-separated)")
    args = parser.parse_args(argv)
    threads = tuple(int(n) for n in args.threads.split(","))
    only = set(filter(None, args.only.split(",")))
    wanted = lambda name: not only or name in only  # noqa: E731
    torch.set_num_threads(1)
    lab = rllab.Lab()
    kept = False if args.malloc_defaults else keep_freed_memory()

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, float32, repeats={args.repeats}, "
          f"freed memory {'kept for reuse (as the trainer does)' if kept else 'returned to the OS (glibc defaults)'}")
    print(f"load average before: {os.getloadavg()}")
    print(header(threads))
    Bs, Ts = ((16,), (256, 1024)) if args.quick else ((64, 256), (512, 2048, 8192))
    big_B, big_T = Bs[-1], Ts[-1]
    if wanted("gae"):
        for B in Bs:
            for T in Ts:
                for lam in (1.0, 0.95):
                    print(bench_gae(lab, B, T, lam, False, args.repeats, threads), flush=True)
        for lam in (1.0, 0.95):
            print(bench_gae(lab, big_B, big_T, lam, True, args.repeats, threads), flush=True)
    if wanted("reinforce++"):
        for gamma in (1.0, 0.99):
            for holes in (False, True):
                print(bench_reinforce_pp(lab, big_B, big_T, gamma, holes, args.repeats, threads), flush=True)
    group_B = 1024 if args.quick else 16384
    for name in ("grpo", "rloo"):
        if wanted(name):
            print(bench_group(lab, name, group_B, 256, 16, args.repeats, threads), flush=True)
    print(f"load average after:  {os.getloadavg()}")


# --------------------------------------------------------------------------- pytest-benchmark smoke


def _smoke_lab():
    torch.set_num_threads(1)
    return rllab.Lab()


def test_smoke_gae(benchmark):
    lab = _smoke_lab()
    r, v, m = make_batch(16, 512, holes=True)
    est = lab.get("advantage_estimator", "gae", lam=0.95)
    adv, _ = benchmark(lambda: est(token_rewards=r, values=v, mask=m, index=None))
    assert rel_dev(adv, loop_gae(r, v, m, 1.0, 0.95)[0], m) < 1e-5


def test_smoke_gae_loop(benchmark):
    torch.set_num_threads(1)
    r, v, m = make_batch(16, 512, holes=True)
    benchmark(lambda: loop_gae(r, v, m, 1.0, 0.95))


def test_smoke_grpo(benchmark):
    lab = _smoke_lab()
    index = torch.arange(1024) // 8
    r, _, m = make_batch(1024, 64, holes=False)
    est = lab.get("advantage_estimator", "grpo", mask_scores=False)
    adv, _ = benchmark(lambda: est(token_rewards=r, mask=m, index=index))
    assert rel_dev(adv, loop_grpo(r, m, index.numpy()), m) < 1e-5


if __name__ == "__main__":
    main()
