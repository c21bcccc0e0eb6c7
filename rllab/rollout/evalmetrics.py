"""Sampled evaluation: pass@1 averaged over n samples (mean@n) and the unbiased pass@k.

With ``train.eval_samples = n`` each held-out prompt also gets ``n`` completions sampled at the
rollout temperature (``rollout.temperature``, ``top_p``, ``top_k``); with ``c`` of them solved:

- ``eval/mean@n`` — the mean over prompts of ``c / n`` (pass@1 estimated from n samples, less
  noisy than one greedy or sampled answer);
- ``eval/pass@k`` for ``k`` = 2, 4, 8, … below ``n``, and ``n`` — the mean over prompts of the
  unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models Trained on Code")::

      pass@k = 1 − C(n − c, k) / C(n, k)

  the probability that at least one of ``k`` samples drawn without replacement from the ``n`` is
  solved (pass@1 would equal mean@n, so it is not repeated).
"""

from __future__ import annotations

from typing import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` samples of which ``c`` are correct.

    ``1 − C(n − c, k) / C(n, k)``, computed as ``1 − Π_{i=n−c+1}^{n} (1 − k/i)`` (no large
    binomials); 1 when fewer than ``k`` samples are wrong.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def report_ks(n: int) -> list[int]:
    """The k reported for n samples: 2, 4, 8, … below n, and n itself (none when n = 1)."""
    ks, k = [], 2
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n] if n >= 2 else []


def sampled_metrics(correct: Sequence[int], n: int) -> dict[str, float]:
    """``eval/mean@n`` and ``eval/pass@k`` from each prompt's count of solved samples.

    :param correct: (P,) solved samples per prompt, each in ``[0, n]``.
    :param n: samples per prompt.
    """
    if not correct:
        return {}
    P = len(correct)
    out = {f"eval/mean@{n}": sum(c / n for c in correct) / P}
    for k in report_ks(n):
        out[f"eval/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / P
    return out


def held_out_order(shares: Sequence[Sequence]) -> list:
    """Per-rank shares of a per-example list (rank R held examples R, R + W, R + 2W, …) merged back
    into the held-out set's order."""
    W = len(shares)
    out = [None] * sum(len(s) for s in shares)
    for r, share in enumerate(shares):
        out[r::W] = list(share)
    return out
