"""Group-baseline advantage estimators: GRPO (and Dr.GRPO), RLOO, REINFORCE++-baseline, OPO,
GPG and GRPO pass@k.

Each one reduces a row to one outcome score, compares it with the other rows sampled from the
same prompt (rows sharing an ``index`` id), and broadcasts the resulting scalar over the row's
valid tokens. ``returns`` equal the advantages (there is no critic).

* GRPO — Shao et al. 2024, DeepSeekMath (https://arxiv.org/abs/2402.03300):
  ``A_i = (s_i − mean_g) / (std_g + ε)``; Dr.GRPO (Liu et al. 2025,
  https://arxiv.org/abs/2503.20783) drops the division: ``A_i = s_i − mean_g``.
* RLOO — Ahmadian et al. 2024 (https://arxiv.org/abs/2402.14740):
  ``A_i = s_i − mean_{j≠i} s_j = G/(G−1)·(s_i − mean_g)``.
* REINFORCE++-baseline — Hu 2025 (https://arxiv.org/abs/2501.03262): ``s_i − mean_g``, then
  whitened over every valid token of the batch.
* OPO — Hao et al. 2025 (https://arxiv.org/abs/2505.23585): a length-weighted baseline,
  ``A_i = s_i − Σ_g |y_j|·s_j / Σ_g |y_j|``.
* GPG — Chu et al. 2025 (https://arxiv.org/abs/2504.02546): ``A_i = α·(s_i − mean_g)/f_norm``
  with ``α = B / #{rows with s ≠ 0}``.
* GRPO pass@k — Chen et al. 2025 (https://arxiv.org/abs/2503.19595): only the best row of a
  group gets a non-zero advantage, ``(s_max − s_second) / (std_g + ε)``.

GDPO, TRL's normalize-then-sum and the optimal token baselines are in :mod:`rllab_advantages.baselines`.

Shapes: ``token_rewards`` (B, T) float, ``mask`` (B, T) bool, ``index`` (B,) integer group ids
(any values, not necessarily contiguous). Outputs: (B, T), 0 at masked positions.

**Scores and fully masked rows** (knob ``mask_scores``, default True). rllab sums a row's
rewards over its valid tokens only, and a row with no valid token takes no part in any group or
batch statistic (its advantage is 0). verl (``mask_scores=False``) sums the rewards over *every*
position, mask ignored, and a fully masked row still counts in its group: its score (usually 0)
shifts the group mean and std of the rows that do train. The two agree whenever rewards sit on
valid tokens and no row is fully masked — the ordinary case — so the default only changes the
edge case, where verl's behaviour lets a row that is not trained on move the others'
advantages. With ``mask_scores=False`` NaN or inf anywhere in ``token_rewards`` is an error
(it would be summed); with the default only valid positions are checked.

**Groups of one** (knob ``singleton`` where it applies): ``"score"`` is verl's convention
(baseline 0, and for GRPO std 1: ``A = s / (1 + ε)``; RLOO: ``A = s``); ``"zero"`` gives
``A = 0`` (TRL's GRPO with one generation, verl's ``rloo_vectorized``). Under ``mask_scores``
a group counts only its rows that have a valid token.

Group statistics use segment sums over group ids (``rllab.ops.group_stats``, ``index_add_``),
never a Python loop over groups or rows; a group whose scores are all equal gets A = 0.
"""

from __future__ import annotations

import attrs
import torch

import rllab
from rllab import ops

__all__ = ["grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg", "grpo_passk"]

_MASK_SCORES_HELP = (
    "sum rewards over valid tokens only and leave fully masked rows out of every statistic; "
    "False is verl: sum over all positions, every row counts in its group"
)


# --------------------------------------------------------------------------- shared helpers


def _scores(where: str, token_rewards, mask, index, mask_scores: bool):
    """Validate the inputs; return ``(scores (B,), counted (B,) bool, dtype)``.

    ``counted`` marks the rows that take part in group and batch statistics.
    """
    ops.check_token_tensor(where, "token_rewards", token_rewards, mask, floating=True)
    if not isinstance(index, torch.Tensor) or index.shape != token_rewards.shape[:1]:
        got = tuple(index.shape) if isinstance(index, torch.Tensor) else type(index).__name__
        raise ValueError(
            f"{where}: index must be a ({token_rewards.shape[0]},) tensor of group ids (one per row), got {got}"
        )
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        raise TypeError(f"{where}: index must hold integer group ids, got {index.dtype}")
    dtype = torch.promote_types(token_rewards.dtype, torch.float32)
    rewards = token_rewards.detach().to(dtype)
    if mask_scores:
        # the masked row sums are finite exactly when every valid entry is (unless a sum
        # overflowed: the exact check then decides and names the rows)
        scores = ops.masked_sum(rewards, mask, dim=1)
        if not bool(torch.isfinite(scores.sum())):
            ops.check_finite(where, "token_rewards", rewards, mask)
        counted = ops.row_any(mask)
    else:
        scores = rewards.sum(dim=1)
        if not bool(torch.isfinite(scores.sum())):
            ops.check_finite(where, "token_rewards", rewards)
        counted = torch.ones_like(scores, dtype=torch.bool)
    return scores, counted, dtype


def _group_scores(name: str, token_rewards, mask, index, mask_scores: bool):
    """:func:`_scores` of the estimator ``name``, and the group statistics of its counted rows
    (:func:`rllab.ops.group_stats`): ``(scores, counted, dtype, count, mean, std)``."""
    scores, counted, dtype = _scores(f"advantage_estimator {name!r}", token_rewards, mask, index, mask_scores)
    with torch.no_grad():
        count, mean, std = ops.group_stats(scores, index.to(scores.device), valid=counted)
    return scores, counted, dtype, count, mean, std


def _centred(scores: torch.Tensor, count: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """``s_i − mean_g`` (B,); a group of one has baseline 0."""
    return scores - torch.where(count <= 1, ops.scalar_zero(scores), mean)


def _group_ids(index: torch.Tensor, device: torch.device):
    """Contiguous group ids 0..n−1 for arbitrary integer ids: ``(inverse (B,), n)``."""
    _, inverse = torch.unique(index.to(device), return_inverse=True)
    return inverse, (int(inverse.max()) + 1 if inverse.numel() else 0)


def _segment_sum(x: torch.Tensor, inverse: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, inverse, x)


def _broadcast(per_row: torch.Tensor, mask: torch.Tensor):
    """Row scalars (B,) → (B, T) advantages, 0 at masked positions; returns *is* advantages — the
    same tensor, as verl's outcome estimators return ``scores, scores`` (a second (B, T) copy
    costs as much as the rest of the estimator; nothing in rllab writes into either)."""
    if bool(torch.isfinite(per_row).all()):
        # verl's scores × mask: exact for finite rows (a masked position gets ±0), and the
        # cheapest broadcast (the mask's bytes cast, one multiplication)
        advantages = mask.view(torch.int8).to(per_row.dtype).mul_(per_row[:, None])
    else:  # NaN or inf in a row (ε = 0 and a constant group): still 0 at masked positions
        advantages = ops.zero_masked_(per_row[:, None].expand(mask.shape).contiguous(), mask)
    return advantages, advantages


# --------------------------------------------------------------------------- grpo


def _check_scale(inst, attribute, value):
    if value == "batch" and not inst.norm_by_std:
        raise ValueError("scale = 'batch' divides by the batch std, which norm_by_std = False turns off; choose one")


@attrs.frozen
class GRPOConfig:
    """Knobs of grpo."""

    epsilon: float = rllab.knob(1e-6, help="ε added to the std (verl 1e-6, TRL 1e-4)", ge=0.0)
    norm_by_std: bool = rllab.knob(True, help="divide by the std; False is Dr.GRPO (same as scale='none')")
    scale: str = rllab.knob(
        "group",
        help="std to divide by, as TRL's scale_rewards: the group's, the whole batch's, or none",
        choices=("group", "batch", "none"),
        validator=_check_scale,
    )
    singleton: str = rllab.knob(
        "score", help="a group of one: 'score' = mean 0, std 1 (verl); 'zero' = A 0 (TRL)", choices=("score", "zero")
    )
    mask_scores: bool = rllab.knob(True, help=_MASK_SCORES_HELP)


def grpo(*, token_rewards, mask, index, values=None, config: GRPOConfig):
    """GRPO group-normalised outcome advantage (verl's ``grpo``, TRL's ``GRPOTrainer``).

    ``s_i = Σ_t r_{i,t}``; per group g: ``A_i = (s_i − mean_g) / (std_g + ε)`` with the unbiased
    std, broadcast over the row's valid tokens. ``norm_by_std=False`` or ``scale='none'``
    (Dr.GRPO) skips the division (and ε); ``scale='batch'`` divides by the unbiased std of every
    counted score in the batch instead (TRL's ``scale_rewards='batch'``; 0 with fewer than two
    rows). A group of one follows ``singleton``: ``"score"`` takes baseline 0 and, under
    ``scale='group'``, std 1 (verl: ``A = s / (1 + ε)``); ``"zero"`` gives 0. A group whose
    scores are all equal gets 0.

    :param token_rewards: (B, T) float; :param mask: (B, T) bool; :param index: (B,) int group ids.
    :returns: ``(advantages, returns)``, both (B, T) and equal.
    """
    scores, counted, _, count, mean, std = _group_scores("grpo", token_rewards, mask, index, config.mask_scores)
    with torch.no_grad():
        single = count <= 1
        baseline = torch.where(single, scores if config.singleton == "zero" else ops.scalar_zero(scores), mean)
        advantage = scores - baseline
        if config.norm_by_std and config.scale != "none":
            if config.scale == "group":
                spread = torch.where(single, torch.ones_like(std), std)
            else:
                spread = ops.masked_var(scores, counted).sqrt().expand_as(scores)
            advantage = advantage / (spread + config.epsilon)
        return _broadcast(advantage, mask)


# --------------------------------------------------------------------------- rloo


@attrs.frozen
class RLOOConfig:
    """Knobs of rloo."""

    singleton: str = rllab.knob(
        "score",
        help="a group of one: 'score' = A is the raw score (verl's rloo); 'zero' = A 0 (verl's rloo_vectorized)",
        choices=("score", "zero"),
    )
    mask_scores: bool = rllab.knob(True, help=_MASK_SCORES_HELP)


def rloo(*, token_rewards, mask, index, values=None, config: RLOOConfig):
    """RLOO leave-one-out baseline (verl's ``rloo`` / ``rloo_vectorized``).

    ``A_i = s_i − mean_{j≠i} s_j = G/(G−1)·(s_i − mean_g)`` over a group of G counted rows,
    broadcast over the row's valid tokens. A group of one follows ``singleton``.

    :param token_rewards: (B, T) float; :param mask: (B, T) bool; :param index: (B,) int group ids.
    :returns: ``(advantages, returns)``, both (B, T) and equal.
    """
    scores, _, _, count, mean, _ = _group_scores("rloo", token_rewards, mask, index, config.mask_scores)
    with torch.no_grad():
        single = count <= 1
        loo = count / (count - 1).clamp(min=1) * (scores - mean)
        alone = scores if config.singleton == "score" else torch.zeros_like(scores)
        return _broadcast(torch.where(single, alone, loo), mask)


# --------------------------------------------------------------------------- reinforce++ baseline


@attrs.frozen
class MaskScoresConfig:
    """Knobs of a group-baseline estimator."""

    mask_scores: bool = rllab.knob(True, help=_MASK_SCORES_HELP)


def reinforce_plus_plus_baseline(*, token_rewards, mask, index, values=None, config: MaskScoresConfig):
    """REINFORCE++-baseline: group-mean baseline, then whitened over the batch (verl's
    ``reinforce_plus_plus_baseline``).

    ``a_i = s_i − mean_g`` (a group of one: baseline 0), broadcast over the row's valid tokens,
    then ``masked_whiten`` over every valid token of the batch (unbiased variance, +1e-8) and
    zeroed at masked positions. With fewer than two valid tokens in the batch (verl raises)
    the result is 0.

    :param token_rewards: (B, T) float; :param mask: (B, T) bool; :param index: (B,) int group ids.
    :returns: ``(advantages, returns)``, both (B, T) and equal.
    """
    scores, _, _, count, mean, _ = _group_scores("reinforce_plus_plus_baseline", token_rewards, mask, index, config.mask_scores)
    with torch.no_grad():
        tokens, _ = _broadcast(_centred(scores, count, mean), mask)
        advantages = torch.where(mask, ops.masked_whiten(tokens, mask), ops.scalar_zero(tokens))
        return advantages, advantages.clone()


# --------------------------------------------------------------------------- opo


def opo(*, token_rewards, mask, index, values=None, config: MaskScoresConfig):
    """OPO: optimal (length-weighted) baseline (verl's ``opo``).

    ``A_i = s_i − Σ_{j∈g} |y_j|·s_j / Σ_{j∈g} |y_j|`` with ``|y_j|`` the number of valid tokens
    of row j; a group of one has baseline 0, and so does a group whose rows have no valid token
    (verl: 0/0 = NaN). Broadcast over the row's valid tokens.

    :param token_rewards: (B, T) float; :param mask: (B, T) bool; :param index: (B,) int group ids.
    :returns: ``(advantages, returns)``, both (B, T) and equal.
    """
    scores, counted, dtype = _scores("advantage_estimator 'opo'", token_rewards, mask, index, config.mask_scores)
    with torch.no_grad():
        inverse, n = _group_ids(index, scores.device)
        length = mask.sum(dim=1).to(dtype)
        count = _segment_sum(counted.to(dtype), inverse, n)
        weighted = _segment_sum(torch.where(counted, length * scores, ops.scalar_zero(scores)), inverse, n)
        total = _segment_sum(torch.where(counted, length, ops.scalar_zero(scores)), inverse, n)
        baseline = torch.where((count > 1) & (total > 0), weighted / total.clamp(min=1), ops.scalar_zero(scores))
        return _broadcast(scores - baseline[inverse], mask)


# --------------------------------------------------------------------------- gpg


@attrs.frozen
class GPGConfig:
    """Knobs of gpg."""

    f_norm: float = rllab.knob(1.0, help="constant the advantage is divided by (verl: 1)", gt=0.0)
    mask_scores: bool = rllab.knob(True, help=_MASK_SCORES_HELP)


def gpg(*, token_rewards, mask, index, values=None, config: GPGConfig):
    """GPG: group-mean baseline rescaled by the share of rows with a non-zero score (verl's ``gpg``).

    ``α = B / max(1, #{i: s_i ≠ 0})`` over the counted rows; ``A_i = α·(s_i − mean_g) / f_norm``
    (a group of one: baseline 0), broadcast over the row's valid tokens.

    :param token_rewards: (B, T) float; :param mask: (B, T) bool; :param index: (B,) int group ids.
    :returns: ``(advantages, returns)``, both (B, T) and equal.
    """
    scores, counted, dtype, count, mean, _ = _group_scores("gpg", token_rewards, mask, index, config.mask_scores)
    with torch.no_grad():
        rows = counted.sum().to(dtype)
        nonzero = (counted & (scores != 0)).sum().to(dtype)
        alpha = rows / nonzero.clamp(min=1)
        return _broadcast(alpha * _centred(scores, count, mean) / config.f_norm, mask)


# --------------------------------------------------------------------------- grpo pass@k


@attrs.frozen
class PassKConfig:
    """Knobs of grpo_passk."""

    epsilon: float = rllab.knob(1e-6, help="ε added to the group std", ge=0.0)
    norm_by_std: bool = rllab.knob(True, help="divide the best row's advantage by the group std")
    mask_scores: bool = rllab.knob(True, help=_MASK_SCORES_HELP)


def grpo_passk(*, token_rewards, mask, index, values=None, config: PassKConfig):
    """GRPO for pass@k (verl's ``grpo_passk``): only each group's best row learns.

    In every group the row with the highest score gets ``s_max − s_second`` (divided by
    ``std_g + ε``, unbiased, when ``norm_by_std``); every other row gets 0. Ties for the best
    give 0 whichever row is picked. verl raises on a group of fewer than two rows; rllab gives
    such a group 0 (a lone sample cannot be compared), so a group that loses rows to
    ``mask_scores`` cannot stop a run.

    :param token_rewards: (B, T) float; :param mask: (B, T) bool; :param index: (B,) int group ids.
    :returns: ``(advantages, returns)``, both (B, T) and equal.
    """
    scores, counted, _, count, _, std = _group_scores("grpo_passk", token_rewards, mask, index, config.mask_scores)
    with torch.no_grad():
        inverse, n = _group_ids(index, scores.device)
        neg_inf = torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device)
        lowest = neg_inf.expand(n)
        candidates = torch.where(counted, scores, neg_inf)
        best = lowest.scatter_reduce(0, inverse, candidates, "amax")
        rows = torch.arange(scores.shape[0], device=scores.device)
        at_best = counted & (scores == best[inverse])
        first = torch.full((n,), scores.shape[0], dtype=rows.dtype, device=rows.device)
        first = first.scatter_reduce(0, inverse, torch.where(at_best, rows, scores.shape[0]), "amin")
        is_best = rows == first[inverse]
        second = lowest.scatter_reduce(0, inverse, torch.where(is_best, neg_inf, candidates), "amax")
        gap = best[inverse] - second[inverse]
        if config.norm_by_std:
            gap = gap / (std + config.epsilon)
        advantage = torch.where(is_best & (count > 1), gap, ops.scalar_zero(scores))
        return _broadcast(advantage, mask)
