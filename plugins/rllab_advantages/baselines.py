"""Multi-objective and per-token-baseline advantage estimators: GDPO, TRL's normalize-then-sum,
and the optimal token baselines (verl 0.9.1 ``core_algos``).

* ``gdpo`` — Group reward-Decoupled normalisation (arXiv:2601.05242), verl
  ``compute_gdpo_outcome_advantage``: every reward component k is GRPO-normalised within its
  group on its own, ``A_k = (r_k − mean_g) / (std_g + ε)``; the components are summed with weights,
  ``A = Σ_k w_k·A_k``, broadcast over the row and whitened over every valid token of the batch
  (``masked_whiten``, unbiased variance, + 1e-8), 0 at masked positions.
* ``normalize_then_sum`` — TRL 1.16 ``GRPOTrainer`` with ``multi_objective_aggregation=
  "normalize_then_sum"``: ``A_k = (r_k − mean_g) / (std_g + 1e-4)`` per group, ``s = Σ_k w_k·A_k``,
  then ``A = (s − mean_batch s) / (std_batch s + 1e-4)`` over the rows (unbiased std) — one number
  per row, not per token.
* ``optimal_token_baseline`` — verl ``compute_optimal_token_baseline_advantage``: a baseline per
  group *and position* t, ``B_t = Σ_i G_{i,t}·W_{i,t} / (Σ_i W_{i,t} + 1e-8)`` over the group's
  rows valid at t, with ``G`` the reward-to-go and ``W_t = Σ_{j≤t} w_j`` the cumulative
  path-variance proxy ``w_j = (1 − 2π_j + Σ_v π_v²)·ρ̄_j²`` (π_j the sampled token's probability
  under the rollout-time policy, ``Σ_v π_v²`` the same distribution's sum of squared
  probabilities, ρ̄ optional truncated IS weights); ``A_t = G_t − B_t``. Rows are aligned by
  position t.
* ``tir_optimal_token_baseline`` — verl ``compute_multi_turn_optimal_token_baseline_advantage``:
  the same with rows aligned by *valid-token index* (the k-th valid token of every row shares a
  baseline), so masked observation spans of multi-turn tool use do not misalign the turns.

With ``handle_zero_tail`` (verl's default) a group's unique longest row gets baseline 0 past the
second-longest row's length (there is nothing to compare it with there).

Inputs: ``token_rewards`` (B, T) float, ``mask`` (B, T) bool, ``index`` (B,) int group ids;
``reward_components`` (B, K) float, one column per reward function, or None (the row score
Σ_t r_t is the only component — verl's fallback); ``old_log_prob`` and ``sum_pi_squared``
(B, T) float (the optimal baselines ``requires`` them: the trainer computes Σ_v π_v² from the
rollout-time logits); ``weights`` (B, T) float or None, truncated IS weights ρ̄.

**Where the components come from.** A task that declares ``reward_components`` (K names; see
:class:`rllab.types.Task`, e.g. ``addition`` with ``format_weight``) returns one reward per
component; the rollout batch carries them as ``reward_components`` (B, K) and the ``rl`` step
passes them to ``gdpo`` and ``normalize_then_sum`` (verl reads the ``gdpo_reward_keys`` columns of
its batch; TRL calls each of its ``reward_funcs``). Both register with
``requires=("reward_components",)``: a
config that pairs them with a single-reward task is refused at load — with one component
``gdpo`` is GRPO's group normalisation followed by batch whitening, and ``normalize_then_sum``
TRL's group-then-batch standardisation of one reward, so the choice is almost certainly a
mistake — as is a ``reward_weights`` knob whose length is not the task's K. Without a
``reward_weights`` knob the ``rl`` step weights the components as the task's scalar reward does
(the batch's ``reward_component_weights``: the task's ``reward_weights``, ``(1, format_weight)``
for ``addition``; TRL's one ``reward_weights``
serves both of its aggregations), so ``task.format_weight`` matters; ``reward_weights = [1, 1]``
restores verl's equal weighting. Called directly, the functions keep verl's fallback (no
``reward_components``: the row score is the one component) and weight all 1 without the knob.

Differences from the references (knob restoring the reference):

* fully masked rows: rllab leaves them out of every group (``count_empty_rows=False``); verl's
  ``gdpo`` and ``optimal_token_baseline`` keep them in (``count_empty_rows=True``), where they
  change which groups count as singletons and which row is "longest". ``tir_…`` drops them, as
  verl does.
* ``gdpo`` sums each component over valid tokens when it falls back on ``token_rewards``
  (``mask_scores``); verl sums over every position.
* returns are 0 at masked positions (verl leaves the reward-to-go there).
"""

from __future__ import annotations

import attrs
import torch

import rllab
from rllab import ops

from .group import _MASK_SCORES_HELP, _group_ids, _scores, _segment_sum

__all__ = ["gdpo", "normalize_then_sum", "optimal_token_baseline", "tir_optimal_token_baseline"]


def _zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


# --------------------------------------------------------------------------- components


def _components(where, token_rewards, mask, index, reward_components, reward_weights, mask_scores):
    """(scores (B, K), counted (B,) bool, weights (K,)), validated."""
    scores, counted, dtype = _scores(where, token_rewards, mask, index, mask_scores)
    if reward_components is None:
        if reward_weights is not None and len(reward_weights) != 1:
            raise ValueError(
                f"{where}: reward_weights has {len(reward_weights)} entries but no reward_components were given "
                "(one component: the row score); pass reward_components (B, K) or drop the weights"
            )
        comps = scores[:, None]
    else:
        rllab.check_tensor(where, "reward_components", reward_components, ndim=2, floating=True, shape_doc="(B, K)")
        if reward_components.shape[0] != mask.shape[0]:
            raise ValueError(
                f"{where}: reward_components has {reward_components.shape[0]} rows, the batch {mask.shape[0]}"
            )
        comps = reward_components.detach().to(device=mask.device, dtype=dtype)
        ops.check_finite(where, "reward_components", comps, counted[:, None].expand_as(comps))
        comps = torch.where(counted[:, None], comps, _zero(comps))
    K = comps.shape[1]
    if reward_weights is not None and len(reward_weights) != K:
        raise ValueError(
            f"{where}: knob reward_weights has {len(reward_weights)} entries for the {K} reward components of the batch"
        )
    w = torch.ones(K, dtype=dtype, device=mask.device) if reward_weights is None else torch.tensor(
        reward_weights, dtype=dtype, device=mask.device
    )
    return comps, counted, w


def _per_group_normalised(comps, index, counted, eps, singleton_std_one, divide=True):
    """(B, K): per column, (r − mean_g)/(std_g + eps) over counted rows (only r − mean_g without
    ``divide``); a group of one follows verl (mean 0, std 1) when ``singleton_std_one``, else gets 0
    (TRL)."""
    cols = []
    for k in range(comps.shape[1]):  # K reward functions, a handful: not a loop over tokens
        count, mean, std = ops.group_stats(comps[:, k], index.to(comps.device), valid=counted)
        single = count <= 1
        if singleton_std_one:
            centred = comps[:, k] - torch.where(single, _zero(mean), mean)
            cols.append(centred / (torch.where(single, torch.ones_like(std), std) + eps) if divide else centred)
        else:
            cols.append(torch.where(single, _zero(mean), (comps[:, k] - mean) / (std + eps)))
    return torch.stack(cols, dim=1)


def _weights_knob():
    return rllab.knob(
        None, help="w_k per reward component (None: the task's reward_weights, e.g. (1, format_weight); all 1 when it has none); needs reward_components with K columns", optional=True
    )


@attrs.frozen
class GDPOConfig:
    """Knobs of gdpo (verl's ``epsilon``, ``norm_adv_by_std_in_grpo``, ``gdpo_reward_weights``)."""

    epsilon: float = rllab.knob(1e-6, help="ε added to each group std", ge=0.0)
    norm_by_std: bool = rllab.knob(True, help="divide each component by its group std (False: centre only)")
    reward_weights: tuple[float, ...] | None = _weights_knob()
    mask_scores: bool = rllab.knob(True, help=_MASK_SCORES_HELP)


def gdpo(*, token_rewards, mask, index, values=None, config: GDPOConfig, reward_components=None):
    """GDPO: per-component group normalisation, weighted sum, batch whitening (verl's ``gdpo``).

    ``A = masked_whiten(Σ_k w_k·(r_k − mean_g)/(std_g + ε), mask) × mask``; a group of one has mean
    0 and std 1 (verl's GRPO convention). With ``norm_by_std=False`` the components are only
    centred. ``reward_components`` (B, K) or None (one component: the row score).

    :returns: ``(advantages, returns)``, both (B, T) and equal.
    """
    where = "advantage_estimator 'gdpo'"
    comps, counted, w = _components(where, token_rewards, mask, index, reward_components, config.reward_weights,
                                    config.mask_scores)
    with torch.no_grad():
        normed = _per_group_normalised(
            comps, index, counted, config.epsilon, singleton_std_one=True, divide=config.norm_by_std
        )
        summed = (normed * w).sum(-1)
        tokens = torch.where(mask, summed[:, None], _zero(summed))
        advantages = torch.where(mask, ops.masked_whiten(tokens, mask), _zero(tokens))
        return advantages, advantages.clone()


@attrs.frozen
class NormalizeThenSumConfig:
    """Knobs of normalize_then_sum (TRL's constants)."""

    epsilon: float = rllab.knob(1e-4, help="ε added to the group std and to the batch std (TRL: 1e-4)", ge=0.0)
    reward_weights: tuple[float, ...] | None = _weights_knob()
    mask_scores: bool = rllab.knob(True, help=_MASK_SCORES_HELP)


def normalize_then_sum(*, token_rewards, mask, index, values=None, config: NormalizeThenSumConfig,
                       reward_components=None):
    """TRL's ``normalize_then_sum``: normalise each reward per group, sum, standardise over the batch.

    ``s_i = Σ_k w_k·(r_{i,k} − mean_g)/(std_g + ε)`` (a group of one: 0), then
    ``A_i = (s_i − mean s)/(std s + ε)`` over the counted rows (unbiased std; 0 with one row),
    broadcast over the row's valid tokens. ``reward_components`` (B, K) or None.

    :returns: ``(advantages, returns)``, both (B, T) and equal.
    """
    where = "advantage_estimator 'normalize_then_sum'"
    comps, counted, w = _components(where, token_rewards, mask, index, reward_components, config.reward_weights,
                                    config.mask_scores)
    with torch.no_grad():
        normed = _per_group_normalised(comps, index, counted, config.epsilon, singleton_std_one=False)
        s = (normed * w).sum(-1)
        mean = ops.masked_mean(s, counted)
        std = ops.masked_var(s, counted).sqrt()
        adv = torch.where(counted, (s - mean) / (std + config.epsilon), _zero(s))
        advantages = torch.where(mask, adv[:, None], _zero(adv))
        return advantages, advantages.clone()


# --------------------------------------------------------------------------- optimal token baselines


@attrs.frozen
class OTBConfig:
    """Knobs of the optimal token baselines (verl's defaults)."""

    handle_zero_tail: bool = rllab.knob(
        True, help="a group's unique longest row gets baseline 0 past the second-longest row's length"
    )
    epsilon: float = rllab.knob(1e-8, help="added to the baseline's denominator Σ W", ge=0.0)
    count_empty_rows: bool = rllab.knob(
        False, help="fully masked rows stay in their group (verl's optimal_token_baseline); tir_… always drops them"
    )


def _otb_inputs(where, token_rewards, mask, index, old_log_prob, sum_pi_squared, weights):
    rllab.check_tensor(where, "token_rewards", token_rewards, ndim=2, floating=True, shape_doc="(B, T)")
    rllab.check_mask(where, mask, like=token_rewards)
    if old_log_prob is None or sum_pi_squared is None:
        raise ValueError(f"{where}: needs old_log_prob and sum_pi_squared (B, T) from the trainer (requires=...)")
    rllab.check_same_shape(where, token_rewards=token_rewards, old_log_prob=old_log_prob,
                           sum_pi_squared=sum_pi_squared, weights=weights)
    if not isinstance(index, torch.Tensor) or index.shape != token_rewards.shape[:1]:
        raise ValueError(f"{where}: index must be a ({token_rewards.shape[0]},) tensor of group ids")
    dtype = torch.promote_types(token_rewards.dtype, torch.float32)
    out = []
    for name, x in (("token_rewards", token_rewards), ("old_log_prob", old_log_prob),
                    ("sum_pi_squared", sum_pi_squared), ("weights", weights)):
        if x is None:
            out.append(None)
            continue
        x = x.detach().to(dtype)
        ops.check_finite(where, name, x, mask)
        out.append(torch.where(mask, x, _zero(x)))
    rewards, logp, sps, rho = out
    returns = torch.flip(torch.cumsum(torch.flip(rewards, [-1]), -1), [-1])
    w = 1 - 2 * torch.exp(logp) + sps
    if rho is not None:
        w = w * rho**2
    cum_w = torch.cumsum(torch.where(mask, w, _zero(w)), -1)
    return returns, cum_w


def _otb_core(returns, cum_w, valid, index, rows_in_group, handle_zero_tail, eps):
    """Baselines (B, L) for aligned (B, L) returns and cumulative W; ``valid`` (B, L) bool.

    ``rows_in_group`` (B,) bool: rows that join their group (count towards N and the zero tail).
    """
    inverse, n = _group_ids(index, returns.device)
    num = torch.zeros(n, returns.shape[1], dtype=returns.dtype, device=returns.device)
    num = num.index_add_(0, inverse, torch.where(valid, returns * cum_w, _zero(returns)))
    den = torch.zeros_like(num).index_add_(0, inverse, torch.where(valid, cum_w, _zero(cum_w))) + eps
    size = _segment_sum(rows_in_group.to(returns.dtype), inverse, n)
    baseline = torch.where((size[inverse] > 1)[:, None], (num / den)[inverse], _zero(num))
    if handle_zero_tail:
        lengths = valid.sum(-1).to(returns.dtype)
        neg = torch.full((n,), -1.0, dtype=returns.dtype, device=returns.device)
        cand = torch.where(rows_in_group, lengths, -1.0)
        longest = neg.scatter_reduce(0, inverse, cand, "amax")
        at_max = rows_in_group & (lengths == longest[inverse])
        n_at_max = _segment_sum(at_max.to(returns.dtype), inverse, n)
        second = neg.scatter_reduce(0, inverse, torch.where(at_max, -1.0, cand), "amax")
        unique = at_max & (n_at_max[inverse] == 1) & (size[inverse] > 1) & (longest[inverse] > second[inverse])
        pos = torch.arange(returns.shape[1], device=returns.device)[None, :]
        tail = unique[:, None] & (pos >= second[inverse][:, None])
        baseline = torch.where(tail, _zero(baseline), baseline)
    return baseline


def optimal_token_baseline(*, token_rewards, mask, index, values=None, config: OTBConfig, old_log_prob=None,
                           sum_pi_squared=None, weights=None):
    """Optimal token baseline, rows aligned by position (verl's ``optimal_token_baseline``).

    ``A_{i,t} = G_{i,t} − B_{g,t}`` with ``B_{g,t} = Σ_{j∈g} G_{j,t}·W_{j,t}·m_{j,t} /
    (Σ_{j∈g} W_{j,t}·m_{j,t} + ε)``; a group of one has baseline 0. Inputs (B, T) as the module
    docstring says. :returns: ``(advantages, returns)`` (B, T), returns the reward-to-go.
    """
    where = "advantage_estimator 'optimal_token_baseline'"
    with torch.no_grad():
        returns, cum_w = _otb_inputs(where, token_rewards, mask, index, old_log_prob, sum_pi_squared, weights)
        rows = torch.ones_like(mask[:, 0]) if config.count_empty_rows else mask.any(-1)
        baseline = _otb_core(returns, cum_w, mask, index, rows, config.handle_zero_tail, config.epsilon)
        advantages = torch.where(mask, returns - baseline, _zero(returns))
        return advantages, torch.where(mask, returns, _zero(returns))


def tir_optimal_token_baseline(*, token_rewards, mask, index, values=None, config: OTBConfig, old_log_prob=None,
                               sum_pi_squared=None, weights=None):
    """Optimal token baseline, rows aligned by valid-token index (verl's ``tir_optimal_token_baseline``).

    As ``optimal_token_baseline`` on each row's valid tokens packed to the front: the k-th valid
    tokens of a group's rows share ``B_{g,k}``. Fully masked rows join no group. Inputs (B, T).
    :returns: ``(advantages, returns)`` (B, T), returns the reward-to-go.
    """
    where = "advantage_estimator 'tir_optimal_token_baseline'"
    if config.count_empty_rows:
        raise ValueError(f"{where}: count_empty_rows=True is not available (verl's tir_… drops empty rows)")
    with torch.no_grad():
        returns, cum_w = _otb_inputs(where, token_rewards, mask, index, old_log_prob, sum_pi_squared, weights)
        B, T = mask.shape
        slot = (torch.cumsum(mask.long(), -1) - 1).clamp(min=0)  # packed index of each valid token
        packed_valid = torch.arange(T, device=mask.device)[None, :] < mask.sum(-1, keepdim=True)
        target = torch.where(mask, slot, T - 1)
        packed_g = torch.zeros_like(returns).scatter_(1, target, torch.where(mask, returns, 0.0))
        packed_w = torch.zeros_like(cum_w).scatter_(1, target, torch.where(mask, cum_w, 0.0))
        # a masked position scattered to column T − 1 only when the row has no valid token there
        packed_g = torch.where(packed_valid, packed_g, _zero(packed_g))
        packed_w = torch.where(packed_valid, packed_w, _zero(packed_w))
        baseline = _otb_core(packed_g, packed_w, packed_valid, index, mask.any(-1), config.handle_zero_tail,
                             config.epsilon)
        advantages = torch.where(mask, returns - baseline.gather(1, slot), _zero(returns))
        return advantages, torch.where(mask, returns, _zero(returns))
