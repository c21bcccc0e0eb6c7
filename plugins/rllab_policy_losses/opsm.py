"""The off-policy sequence mask (OPSM) of DeepSeek-V3.2, an option of several policy losses.

DeepSeek-AI 2025, "DeepSeek-V3.2" (arXiv:2512.02556), eq. 9; TRL 1.16
``GRPOTrainer.get_off_policy_mask`` (``off_policy_mask_threshold``). A row whose sampling
policy has drifted far from the current one is dropped from the loss where its advantage is
negative — the tokens most likely to push the policy somewhere the data says nothing about::

    kl_i    = Σ_t mask·(log π_sample − sg(log π_θ)) / max(1, Σ_t mask)      (B,)
    keep_t  = (A_t ≥ 0) or (kl_i ≤ δ)                                      (B, T)

``log π_sample`` is ``rollout_log_prob`` when the caller passes it (TRL with vLLM: the
inference engine's log-probs), otherwise ``old_log_prob`` (TRL without vLLM). The per-token loss
is multiplied by ``keep`` before aggregating (before any importance weight, as TRL).

TRL's advantages are one number per row, so its ``A ≥ 0`` test is per row; rllab's advantages
are (B, T) and the test is per token, which is the same thing for outcome advantages broadcast
over a row.
"""

from __future__ import annotations

import torch

import rllab
from rllab import ops


def off_policy_mask_knob():
    """The ``off_policy_mask_threshold`` knob (δ; None disables the mask, TRL's default)."""
    return rllab.knob(
        None,
        help="δ of the off-policy sequence mask (DeepSeek-V3.2, TRL's off_policy_mask_threshold): "
        "drop rows with mean KL(sample‖current) > δ where A < 0; None: off",
        gt=0.0,
    )


def off_policy_keep(*, log_prob, sample_log_prob, advantages, mask, threshold) -> torch.Tensor:
    """(B, T) bool: True where the off-policy sequence mask keeps a token.

    ``log_prob`` (B, T) current policy (detached here), ``sample_log_prob`` (B, T) the sampling
    policy's log-probs, ``advantages`` (B, T), ``mask`` (B, T) bool; every input already zeroed
    at masked positions. ``threshold`` δ > 0.
    """
    kl = torch.where(mask, sample_log_prob.detach() - log_prob.detach(), 0.0).sum(-1)
    seq_kl = kl / mask.sum(-1).clamp(min=1).to(kl.dtype)
    return (advantages >= 0) | (seq_kl <= threshold)[:, None]


def apply_off_policy_mask(
    pg_losses, *, config, log_prob, old_log_prob, advantages, mask, rollout_log_prob, metrics, where="policy loss"
):
    """``pg_losses`` × keep when ``config.off_policy_mask_threshold`` is set (else unchanged).

    Adds ``actor/off_policy_masked_frac`` (share of valid tokens dropped) to ``metrics``.
    ``rollout_log_prob`` (B, T) or None selects the sampling log-probs, as TRL does.
    """
    threshold = getattr(config, "off_policy_mask_threshold", None)
    if threshold is None:
        return pg_losses
    if rollout_log_prob is not None:
        if rollout_log_prob.shape != mask.shape:
            raise ValueError(
                f"{where}: rollout_log_prob has shape {tuple(rollout_log_prob.shape)} but mask has {tuple(mask.shape)}"
            )
        ops.check_finite(f"{where} (off-policy sequence mask)", "rollout_log_prob", rollout_log_prob.detach(), mask)
        sample = torch.where(mask, rollout_log_prob.detach(), 0.0)
    else:
        sample = old_log_prob
    keep = off_policy_keep(
        log_prob=log_prob, sample_log_prob=sample, advantages=advantages, mask=mask, threshold=threshold
    )
    dropped = (~keep & mask).to(torch.float32).sum() / mask.sum().clamp(min=1).to(torch.float32)
    metrics["actor/off_policy_masked_frac"] = dropped.detach()
    return torch.where(keep, pg_losses, torch.zeros((), dtype=pg_losses.dtype, device=pg_losses.device))
