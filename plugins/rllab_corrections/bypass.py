"""Bypass mode: train against the rollout engine's log-probs directly (verl 0.9.1
``compute_policy_loss_bypass_mode``, ``rollout_corr_helper.apply_bypass_mode``).

The ordinary ("decoupled") setup has three policies: the sampler (``rollout_log_prob``), the
trainer's copy of it at rollout time (``old_log_prob``, one extra forward pass) and the policy
being trained. Bypass mode skips the extra forward: the trainer passes the rollout log-probs *as*
``old_log_prob``, and the loss corrects for the sampler itself, from ``π_θ/π_rollout``:

* ``loss_type="ppo_clip"`` — the dual-clip PPO surrogate (verl's ``vanilla`` loss) on
  r = π_θ/π_rollout: the clipped ratio already is the importance correction, so no IS weight is
  multiplied in (verl computes one for its metrics only);
* ``loss_type="reinforce"`` — ``−A·sg(w)·log π_θ`` with ``w`` the truncated (or IcePop-masked)
  IS weight of π_θ/π_rollout at token or sequence level (``is_level``), computed from the
  detached current log-probs on every call, optionally batch-normalised.

Both can reject tokens or sequences first with any :data:`rllab_corrections.rejection.CRITERIA`
(``rs_criterion``; several, comma-separated or a list, must all pass — thresholds ``rs_upper``
and ``rs_lower`` as ``upper`` and ``lower`` of ``rejection``) on the same ratio; rejected tokens leave the mask the loss is aggregated over
(``aggregate(loss, keep)``), as verl's ``effective_mask``.

Signature of every policy loss (:mod:`rllab.hookspecs`); shapes (B, T). ``weights`` from an
importance correction, if any, are multiplied in as everywhere else (verl ignores precomputed
weights in bypass mode: use the correction ``none`` with it to match). Enabling bypass mode is a
trainer switch — passing ``rollout_log_prob`` as ``old_log_prob`` and skipping the old-log-prob
forward — this loss is the half of it that lives in a plugin.
"""

from __future__ import annotations

import attrs
import torch

import rllab
from rllab import ops
from rllab import FloatOrFloatsOrNone, StrOrStrsOrNone

from .rejection import (
    CRITERIA, DEFAULT_C_MAX, _keep, _weight_knobs_need_a_weight, check_on_policy_weight_kept, check_rejects_something_only,
    criteria, importance_weights, resolve_criteria,
)

LOG_RATIO_CLAMP = 20.0


def _check_rs(inst, attribute, value):
    if value is not None and inst.rs_criterion is None:
        raise ValueError(f"{attribute.name} = {value!r} needs rs_criterion (rejection sampling is off)")


def _check_rs_criterion(inst, attribute, value):
    if value is not None:
        criteria(value, knob="rs_criterion")


def _check_c_min(inst, attribute, value):
    if value is not None and value > (DEFAULT_C_MAX if inst.c_max is None else inst.c_max):
        raise ValueError(f"c_min = {value!r} must not exceed c_max = {inst.c_max!r}")


@attrs.frozen
class BypassConfig:
    """Knobs of ``bypass_mode`` (defaults: verl's ``RolloutCorrectionConfig.bypass_ppo_clip`` and actor config)."""

    loss_type: str = rllab.knob(
        "ppo_clip", help="ppo_clip (ratio does the correction) or reinforce (explicit IS weight)",
        choices=("ppo_clip", "reinforce"),
    )
    clip_low: float = rllab.knob(0.2, help="ppo_clip: ε_low", ge=0.0)
    clip_high: float = rllab.knob(0.2, help="ppo_clip: ε_high", ge=0.0)
    clip_c: float = rllab.knob(3.0, help="ppo_clip: dual-clip cap −A·c where A < 0 (verl always dual-clips)", gt=1.0)
    is_level: str = rllab.knob("none", help="reinforce: IS weight level none, token or sequence",
                               choices=("none", "token", "sequence"))
    c_max: float | None = rllab.knob(
        None, help="reinforce: IS weights are truncated at c_max (or masked outside [c_min, c_max]); None: 2.0", gt=0.0
    )
    c_min: float | None = rllab.knob(None, help="IcePop lower bound (None: truncate)", gt=0.0, validator=_check_c_min)
    batch_normalize: bool = rllab.knob(False, help="divide the IS weights by their batch mean")
    rs_criterion: StrOrStrsOrNone = rllab.knob(
        None, help="rejection criterion (None: off); several (comma-separated or a list) must all pass. One or "
        "more of " + ", ".join(CRITERIA), validator=_check_rs_criterion,
    )
    rs_upper: FloatOrFloatsOrNone = rllab.knob(
        None, help="rejection upper threshold (required with rs_criterion); one shared or one per criterion",
        validator=_check_rs,
    )
    rs_lower: FloatOrFloatsOrNone = rllab.knob(
        None, help="k1 rejection lower threshold (None: 1/rs_upper); one shared or one per k1 criterion",
        validator=_check_rs,
    )

    def __attrs_post_init__(self):
        if self.rs_criterion is not None and self.rs_upper is None:
            raise ValueError(f"rs_criterion = {self.rs_criterion!r} needs rs_upper")
        if self.loss_type == "ppo_clip" and self.is_level != "none":
            raise ValueError(
                f"is_level = {self.is_level!r} applies to loss_type = 'reinforce' only (PPO's ratio is the correction)"
            )
        _weight_knobs_need_a_weight(self)
        check_rejects_something_only(self.rs_criterion, self.rs_upper, self.rs_lower,
                                     names=("rs_upper", "rs_lower", "", "rs_criterion"))
        check_on_policy_weight_kept(self.c_min, self.c_max)
        if self.loss_type == "reinforce" and any(
            getattr(self, k) != d for k, d in (("clip_low", 0.2), ("clip_high", 0.2), ("clip_c", 3.0))
        ):
            raise ValueError(
                f"clip_low = {self.clip_low!r}, clip_high = {self.clip_high!r}, clip_c = {self.clip_c!r}: "
                "the clip knobs apply to loss_type = 'ppo_clip' only"
            )


def _zero(x):
    return torch.zeros((), dtype=x.dtype, device=x.device)


def bypass_mode(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """Bypass-mode policy loss: ``old_log_prob`` is the rollout engine's (verl's ``bypass_mode``).

    ``keep`` = valid tokens passing ``rs_criterion`` on π_θ/π_rollout (all valid tokens without
    it). ``ppo_clip``: per token the dual-clip surrogate on r = exp(clamp(log π_θ − log π_rollout,
    ±20)); ``reinforce``: ``−A·sg(w)·log π_θ`` (w = 1 with ``is_level="none"``). Aggregated over
    ``keep``. All tensors (B, T). Metrics: ``actor/approx_kl`` and ``actor/clipfrac`` (and
    ``actor/clipfrac_lower`` for ppo_clip) over ``keep``; ``tis/rs_masked_frac``.
    """
    where = "policy_loss 'bypass_mode'"
    rllab.check_mask(where, mask)
    rllab.check_same_shape(where, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask,
                           weights=weights)
    present = {"log_prob": log_prob, "old_log_prob": old_log_prob, "advantages": advantages, "weights": weights}
    for name, x in present.items():
        if x is not None:
            ops.check_finite(where, name, x.detach(), mask)
    log_prob = torch.where(mask, log_prob, _zero(log_prob))
    rollout = torch.where(mask, old_log_prob.detach(), _zero(log_prob))
    advantages = torch.where(mask, advantages.detach(), _zero(log_prob))

    with torch.no_grad():
        current = log_prob.detach()
        if config.rs_criterion is not None:
            keep, _ = _keep(resolve_criteria(config.rs_criterion, config.rs_upper, config.rs_lower), current, rollout, mask)
        else:
            keep = mask
    log_ratio = torch.clamp(log_prob - rollout, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    metrics = {
        "actor/approx_kl": ops.masked_mean(-log_ratio.detach(), keep),
        "actor/approx_kl_k3": ops.masked_mean((ratio.detach() - 1) - log_ratio.detach(), keep),
        "tis/rs_masked_frac": ops.masked_mean((mask & ~keep).to(log_prob.dtype), mask),
    }
    if config.loss_type == "ppo_clip":
        pg_losses1 = -advantages * ratio
        pg_losses2 = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
        clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
        pg_losses3 = -advantages * config.clip_c
        clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
        pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
        metrics["actor/clipfrac"] = ops.masked_mean((pg_losses2 > pg_losses1).to(log_prob.dtype), keep)
        metrics["actor/clipfrac_lower"] = ops.masked_mean(
            ((clip_pg_losses1 > pg_losses3) & (advantages < 0)).to(log_prob.dtype), keep
        )
    else:
        pg_losses = -advantages * log_prob
        if config.is_level != "none":
            with torch.no_grad():
                is_weights, is_metrics = importance_weights(
                    current, rollout, mask, level=config.is_level,
                    c_max=DEFAULT_C_MAX if config.c_max is None else config.c_max, c_min=config.c_min,
                    batch_normalize=config.batch_normalize,
                )
            pg_losses = pg_losses * is_weights
            metrics.update(is_metrics)
            metrics["tis/mean_weight"] = ops.masked_mean(is_weights, mask)
        metrics["actor/clipfrac"] = torch.zeros((), dtype=torch.float32, device=log_prob.device)
    if weights is not None:
        pg_losses = pg_losses * torch.where(mask, weights.detach(), _zero(log_prob))
    return aggregate(pg_losses, keep), {k: v.detach() for k, v in metrics.items()}
