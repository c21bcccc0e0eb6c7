"""Backward-scan advantage estimators: GAE, REINFORCE (return-to-go), REINFORCE++ and ReMax.

GAE — Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation" (https://arxiv.org/abs/1506.02438). REINFORCE++ — Hu 2025,
https://arxiv.org/abs/2501.03262. Semantics follow verl 0.9.1 ``core_algos``.

Shapes: ``token_rewards``, ``values``, ``mask``: (B, T); ``index``: (B,) (unused here).

**Observation tokens are skipped.** Every estimator here runs a backward recursion over the
*valid* tokens of a row only: a position with ``mask`` False carries the running quantities
(GAE's ``next_value`` and advantage, the running return) through unchanged, and a reward that
sits on a masked token is dropped. So a multi-turn response whose tool-output tokens are masked
out keeps one unbroken chain from its last valid token back to its first. Writing
``p_1 < … < p_n`` for the valid positions of a row::

    δ_k = r_{p_k} + γ·V_{p_{k+1}} − V_{p_k}        (V_{p_{n+1}} = 0)
    A_k = δ_k + γλ·A_{k+1}                          (A_{n+1} = 0)       gae
    G_k = r_{p_k} + γ·G_{k+1}                        (G_{n+1} = 0)       reinforce, reinforce++

and a masked position holds the value of the next valid position to its right (0 if none),
which is what verl's per-token loop leaves there.

**How it is computed.** Each estimator is one skip scan (:mod:`rllab_advantages.scan`, which
holds the reference loop and the fast paths) plus elementwise work. The returns scan the
rewards with coefficient γ. GAE scans ``x = γλ·r + γ(1 − λ)·V`` with coefficient ``c = γλ``:
writing ``n(k)`` for the valid position after ``k``, the advantage unrolls to
``A_k = r_k − V_k + S_{n(k)}`` (each ``γ·V_{n(k)}`` of a δ meets the ``−γλ·V_{n(k)}`` of the next
term), and ``S_{n(k)}`` is the scan's value at ``k + 1``, since a masked position carries the
next valid one's. The result equals verl's loop to float32 rounding.
"""

from __future__ import annotations

import attrs
import torch

import rllab
from rllab import ops

from .scan import discounted_reverse_cumsum, has_holes, skip_scan

__all__ = ["gae", "reinforce", "reinforce_plus_plus", "discounted_reverse_cumsum"]


# --------------------------------------------------------------------------- shared helpers


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.detach().to(dtype)``, without an operation for each that has nothing to do."""
    x = x.detach() if x.requires_grad else x
    return x if x.dtype == dtype else x.to(dtype)


def _float_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _check_inputs(where: str, token_rewards, mask, values=None) -> None:
    ops.check_token_tensor(where, "token_rewards", token_rewards, mask, floating=True)
    ops.check_inputs(where, mask, token_rewards=token_rewards, values=values)


# --------------------------------------------------------------------------- gae


@attrs.frozen
class GAEConfig:
    """Knobs of gae."""

    gamma: float = rllab.knob(1.0, help="γ: discount per valid token", ge=0.0, le=1.0)
    lam: float = rllab.knob(
        1.0, help="λ: GAE trace decay (1 = Monte-Carlo return − V, 0 = one-step TD)", ge=0.0, le=1.0
    )
    whiten: bool = rllab.knob(True, help="whiten advantages over the batch's valid tokens (verl always does)")
    remask: bool = rllab.knob(
        True,
        help="zero advantages and returns at masked positions; False keeps verl's values there "
        "(the whitened advantage carried from the next valid token, and A + V)",
    )


def gae(*, token_rewards, mask, index=None, values=None, config: GAEConfig):
    """Generalized Advantage Estimation with observation tokens skipped (verl's ``gae``).

    ``δ_t = r_t + γ·V_{t+1} − V_t``, ``A_t = δ_t + γλ·A_{t+1}``, run backwards over the valid
    tokens of each row (a masked position passes ``next_value`` and ``A`` through unchanged; its
    reward is dropped). ``returns = A + V`` (before whitening). Advantages are then whitened over
    every valid token of the batch (``config.whiten``).

    :param token_rewards: (B, T) float.
    :param values: (B, T) float critic values (required).
    :param mask: (B, T) bool.
    :param index: (B,) group ids, unused.
    :returns: ``(advantages, returns)``, both (B, T), in float32 (or wider, if an input is).

    Differences from verl, each with the verl behaviour one knob away:

    * ``remask=True`` (default) zeroes both outputs at masked positions. verl leaves the carried
      whitened advantage and ``A + V`` there; no loss reads them, but a zero is what every other
      estimator returns and what a reader of a dumped batch expects. ``remask=False`` matches
      verl at every position (it also makes an all-masked row non-zero after whitening).
    * With fewer than two valid tokens in the batch verl's ``masked_var`` raises; rllab centres
      without scaling, so the advantage of a lone valid token is 0 (it carries no signal).
    """
    where = "advantage_estimator 'gae'"
    if values is None:
        raise ValueError(f"{where} requires values (a critic); got values=None")
    _check_inputs(where, token_rewards, mask, values)
    dtype = _float_dtype(token_rewards, values)
    with torch.no_grad():
        rewards, values = _as(token_rewards, dtype), _as(values, dtype)
        gamma, lam = config.gamma, config.lam
        holes = has_holes(mask)
        x = rewards * (gamma * lam)
        if lam != 1.0:
            x.add_(values, alpha=gamma * (1.0 - lam))
        scanned = skip_scan(x, mask, gamma * lam, holes=holes)  # S_t: S of the first valid token ≥ t
        advantages = rewards - values  # A_k = r_k − V_k + S_{n(k)}, S_{n(k)} the scan at k + 1
        advantages[:, :-1] += scanned[:, 1:]
        if config.remask:
            advantages = ops.zero_masked_(advantages, mask)
            returns = ops.zero_masked_(advantages + values, mask)
        else:  # verl: a masked position carries A of the next valid token, and its returns are A + V
            advantages = skip_scan(advantages, mask, 0.0, holes=holes)
            returns = advantages + values
        if config.whiten:
            advantages = ops.masked_whiten(advantages, mask, remask=config.remask)
    return advantages, returns


# --------------------------------------------------------------------------- returns


@attrs.frozen
class ReturnConfig:
    """Knobs of the discounted-return estimators."""

    gamma: float = rllab.knob(1.0, help="γ: discount per valid token", ge=0.0, le=1.0)


def _discounted_return(token_rewards, mask, gamma):
    """G over each row's valid tokens (observation tokens skipped), 0 at masked positions (B, T)."""
    rewards = _as(token_rewards, _float_dtype(token_rewards))
    return ops.zero_masked_(skip_scan(rewards, mask, gamma), mask)


def _checked_return(name: str, token_rewards, mask, gamma):
    """The inputs of the estimator ``name`` checked, then their :func:`_discounted_return` (no grad)."""
    _check_inputs(f"advantage_estimator {name!r}", token_rewards, mask)
    with torch.no_grad():
        return _discounted_return(token_rewards, mask, gamma)


def reinforce(*, token_rewards, mask, index=None, values=None, config: ReturnConfig):
    """REINFORCE: the advantage is the discounted return-to-go, with no baseline.

    ``G_t = r_t + γ·G_{t+1}`` backwards over the valid tokens of each row (observation tokens
    skipped, as in ``gae``); ``advantages = returns = G``, 0 at masked positions.

    :param token_rewards: (B, T) float; :param mask: (B, T) bool; ``index``, ``values`` unused.
    :returns: ``(advantages, returns)``, both (B, T).
    """
    returns = _checked_return("reinforce", token_rewards, mask, config.gamma)
    return returns, returns.clone()


def reinforce_plus_plus(*, token_rewards, mask, index=None, values=None, config: ReturnConfig):
    """REINFORCE++ (Hu 2025): discounted return-to-go, whitened over the batch (verl's ``reinforce_plus_plus``).

    ``G_t = r_t + γ·G_{t+1}`` backwards over the valid tokens (observation tokens skipped);
    ``returns = G`` (0 at masked positions, as verl); ``advantages = masked_whiten(G) × mask``
    over every valid token of the batch. With fewer than two valid tokens (verl raises) the
    advantages are only centred, i.e. 0.

    :param token_rewards: (B, T) float; :param mask: (B, T) bool; ``index``, ``values`` unused.
    :returns: ``(advantages, returns)``, both (B, T).
    """
    returns = _checked_return("reinforce_plus_plus", token_rewards, mask, config.gamma)
    with torch.no_grad():
        advantages = ops.masked_whiten(returns, mask, remask=True)
    return advantages, returns


def remax(*, token_rewards, mask, index=None, values=None, reward_baselines=None, config=None):
    """ReMax (Li et al. 2023): the return minus the reward of the policy's greedy response.

    ``returns_t = Σ_{j ≥ t} r_j`` (undiscounted reward-to-go over the row's valid tokens) and
    ``advantages = returns − b`` on valid tokens, where ``b`` is the reward of the greedy
    (argmax) response to the same prompt — a per-prompt baseline that costs one greedy rollout
    instead of a group (verl 0.9.1 ``compute_remax_outcome_advantage``). Masked positions are 0
    (verl leaves reward-to-go at observation positions inside a row; no loss reads them).

    :param token_rewards: (B, T) float; :param mask: (B, T) bool.
    :param reward_baselines: (B,) float, the greedy response's reward for each row's prompt
        (``requires=("reward_baselines",)``: the ``rl`` step samples it).
    :returns: ``(advantages, returns)``, both (B, T).
    """
    where = "advantage_estimator 'remax'"
    _check_inputs(where, token_rewards, mask)
    if reward_baselines is None:
        raise ValueError(f"{where}: needs reward_baselines (B,), the reward of the greedy response to each row's prompt")
    if not isinstance(reward_baselines, torch.Tensor) or reward_baselines.shape != token_rewards.shape[:1]:
        shape = tuple(getattr(reward_baselines, "shape", ()))
        raise ValueError(f"{where}: reward_baselines must be a ({token_rewards.shape[0]},) tensor, got shape {shape}")
    with torch.no_grad():
        returns = _discounted_return(token_rewards, mask, 1.0)
        advantages = ops.zero_masked(returns - reward_baselines.to(returns.dtype)[:, None], mask)
    return advantages, returns
