"""Preference losses — TRL 1.16 ``DPOTrainer``'s weighted loss-type list: ``combined`` and ``mpo``.

Inputs as for every preference loss (each (P,) over P chosen/rejected pairs), plus the token-level
inputs described on :func:`combined`. The loss types, their formulas, the f-divergences and the
differences from TRL are those of :mod:`rllab_preference_losses.trl`.

``combined`` is TRL's ``loss_type`` list with ``loss_weights``: Σ_k w_k·loss_k per pair (the
trainer's mean over pairs then equals TRL's Σ_k w_k·mean(loss_k)). ``mpo`` is the same with the
MPO recipe as defaults (Wang et al. 2024, Mixed Preference Optimization: ``sigmoid``, ``bco_pair``,
``sft`` weighted 0.8, 0.2, 1.0). Both also offer

* ``ld_alpha`` — LD-DPO (Liu et al. 2024, "Length Desensitization"): each sequence log-prob, of the
  policy and of the reference, becomes Σ over its first min(|w|, |l|) tokens + α·Σ over the rest;
  it needs the per-token log-probs and masks (``requires`` ``token_logps``);
* ``use_weighting`` — WPO (Zhou et al. 2024, Eq. 2): each pair's loss is multiplied by the detached
  w(w)·w(l), w(y) = exp(mean_t (log π(y_t) − log Σ_v π(v)²)); it needs the per-token log-probs and
  log Σ_v π(v)² of the policy (``requires`` ``token_logps``, ``log_sum_sq_probs``).

Every knob that would have no effect is refused (``label_smoothing`` ≠ 0 without a loss that reads
it, ``discopop_tau`` without ``discopop``, ``bco_running_mean`` without ``bco_pair``), as are TRL's
refusals (``exo_pair`` needs ε > 0, WPO does not combine with ``aot``/``aot_unpaired``, non-reverse-KL
divergences only with the losses that read Δs; ``robust`` needs ε < 0.5).

Returns per-pair losses (P,) and the ``dpo/…`` metrics of the other preference losses, plus
``dpo/loss_<type>`` (mean loss of each type before its weight w_k, after WPO's) and, with WPO,
``dpo/wpo_weight`` (mean w(w)·w(l)). Log-probs that are NaN or inf raise :class:`rllab.RowError`
naming the pairs.
"""

from __future__ import annotations

import attrs

import rllab

from .common import (
    DISCOPOP_TAU,
    PreferencePairs,
    beta_knob,
    check_token_side,
    f_alpha_knob,
    f_divergence_knob,
    wpo_weight,
)
from .trl import F_DIVERGENCE_LOSSES, LOSS_TYPES, LOSSES, SMOOTHED


def _check_combined(inst, attribute, value):
    """Cross-knob checks of combined / mpo (run once, on the last field)."""
    types = inst.loss_types
    if not types:
        raise ValueError("loss_types must name at least one loss type")
    unknown = [t for t in types if t not in LOSS_TYPES]
    if unknown:
        raise ValueError(f"loss_types {unknown} are not TRL loss types: must be among {LOSS_TYPES}")
    if inst.loss_weights is not None and len(inst.loss_weights) != len(types):
        raise ValueError(
            f"loss_weights has {len(inst.loss_weights)} weights for {len(types)} loss types {list(types)}: "
            "give one weight per loss type"
        )
    if inst.f_divergence_type != "reverse_kl" and not set(types) <= set(F_DIVERGENCE_LOSSES):
        raise ValueError(
            f"f_divergence_type = {inst.f_divergence_type!r} is only defined for {list(F_DIVERGENCE_LOSSES)}; "
            f"loss_types {list(types)} include others (use 'reverse_kl')"
        )
    eps = inst.label_smoothing
    if "exo_pair" in types and not 0.0 < eps < 1.0:
        raise ValueError(f"label_smoothing = {eps!r}: exo_pair needs 0 < ε < 1 (it takes log ε); EXO recommends 1e-3")
    if "robust" in types and not eps < 0.5:
        raise ValueError(f"label_smoothing = {eps!r}: robust needs ε < 0.5 (it divides by 1 − 2ε)")
    if eps != 0.0 and not set(types) & set(SMOOTHED):
        raise ValueError(
            f"label_smoothing = {eps!r} has no effect: none of {list(types)} reads it ({list(SMOOTHED)} do)"
        )
    if inst.discopop_tau is not None and "discopop" not in types:
        raise ValueError(f"discopop_tau = {inst.discopop_tau!r} has no effect without 'discopop' in loss_types")
    if inst.use_weighting and set(types) & {"aot", "aot_unpaired"}:
        raise ValueError(
            "use_weighting (WPO) does not combine with aot / aot_unpaired: they sort the pairs, which would "
            "misalign the weights"
        )
    if inst.bco_running_mean and "bco_pair" not in types:
        raise ValueError("bco_running_mean = True has no effect without 'bco_pair' in loss_types")


def _combined_config(name: str, doc: str, types: tuple[str, ...], weights: tuple[float, ...] | None):
    @attrs.frozen
    class Config:
        loss_types: tuple[str, ...] = rllab.knob(types, help="TRL loss types to combine (TRL's loss_type list)")
        loss_weights: tuple[float, ...] | None = rllab.knob(
            weights, help="one weight per loss type (None: all 1.0, as TRL)"
        )
        beta: float = beta_knob()
        label_smoothing: float = rllab.knob(
            0.0,
            help="ε for robust, exo_pair, aot, aot_unpaired (TRL default 0.0; exo_pair needs > 0, robust < 0.5)",
            ge=0.0,
            lt=1.0,
        )
        discopop_tau: float | None = rllab.knob(
            None, help=f"τ of discopop (None: {DISCOPOP_TAU}, the paper's and TRL's)", gt=0.0
        )
        f_divergence_type: str = f_divergence_knob()
        f_alpha_divergence_coef: float | None = f_alpha_knob()
        ld_alpha: float | None = rllab.knob(
            None,
            help="LD-DPO α in [0, 1]: weight of the tokens beyond the shorter response of the pair (None: off, "
            "1.0 = no effect); needs the token_logps inputs",
            ge=0.0,
            le=1.0,
        )
        use_weighting: bool = rllab.knob(
            False,
            help="WPO weighting of each pair by its detached policy probability; needs token_logps and "
            "log_sum_sq_probs",
        )
        bco_running_mean: bool = rllab.knob(
            False,
            help="bco_pair shifts rewards by their running mean (TRL ≤ 0.x); needs bco_reward_mean / bco_reward_count",
            validator=_check_combined,
        )

    Config.__name__ = Config.__qualname__ = name
    Config.__doc__ = doc
    return Config


CombinedConfig = _combined_config(
    "CombinedConfig", "Knobs of combined (TRL DPOConfig's loss settings; defaults are TRL's).", ("sigmoid",), None
)
MPOConfig = _combined_config(
    "MPOConfig",
    "Knobs of mpo (combined with the MPO recipe as defaults).",
    ("sigmoid", "bco_pair", "sft"),
    (0.8, 0.2, 1.0),
)


def combined(
    *,
    chosen_logps,
    rejected_logps,
    ref_chosen_logps,
    ref_rejected_logps,
    chosen_lengths,
    rejected_lengths,
    config,
    chosen_token_logps=None,
    rejected_token_logps=None,
    ref_chosen_token_logps=None,
    ref_rejected_token_logps=None,
    chosen_mask=None,
    rejected_mask=None,
    chosen_log_sum_sq_probs=None,
    rejected_log_sum_sq_probs=None,
    bco_reward_mean=None,
    bco_reward_count=None,
):
    """TRL's loss-type list: Σ_k w_k·loss_k per pair, with optional LD-DPO α, f-divergence and WPO.

    Sequence inputs (P,) as every preference loss. Token-level inputs, read only when a knob asks
    for them: ``chosen_token_logps`` / ``ref_chosen_token_logps`` / ``chosen_log_sum_sq_probs``
    (P, T_w) float, ``chosen_mask`` (P, T_w) bool (row sums = ``chosen_lengths``), the rejected
    ones (P, T_l); ``bco_reward_mean`` / ``bco_reward_count`` 0-d. Returns losses (P,) and the
    ``dpo/…`` metrics plus ``dpo/loss_<type>`` (and ``dpo/wpo_weight``, ``bco/…`` when used).
    """
    cfg = config
    where = f"preference_loss '{'mpo' if isinstance(cfg, MPOConfig) else 'combined'}'"
    tokens = {
        "chosen_token_logps": chosen_token_logps, "rejected_token_logps": rejected_token_logps, "chosen_mask": chosen_mask,
        "ref_chosen_token_logps": ref_chosen_token_logps, "ref_rejected_token_logps": ref_rejected_token_logps,
        "rejected_mask": rejected_mask, "chosen_log_sum_sq_probs": chosen_log_sum_sq_probs,
        "rejected_log_sum_sq_probs": rejected_log_sum_sq_probs,
    }  # fmt: skip
    p = PreferencePairs.build(
        where, cfg, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths,
        rejected_lengths, tokens=tokens,
    )  # fmt: skip
    extra = {}
    weight = None
    if cfg.use_weighting:
        weight_inputs = {}
        for side, lengths in (("chosen", chosen_lengths), ("rejected", rejected_lengths)):
            tok, lssp, mask = (tokens[f"{side}_{k}"] for k in ("token_logps", "log_sum_sq_probs", "mask"))
            check_token_side(
                where, side, lengths, mask, **{f"{side}_token_logps": tok, f"{side}_log_sum_sq_probs": lssp}
            )
            weight_inputs[side] = wpo_weight(tok, lssp, mask)
        weight = (weight_inputs["chosen"] * weight_inputs["rejected"]).to(p.chosen_lr.dtype)
        extra["dpo/wpo_weight"] = weight.detach().sum() / max(weight.numel(), 1)
    if cfg.bco_running_mean:
        p, state = p.shifted(where, cfg.beta, bco_reward_mean, bco_reward_count)
        extra.update(state)
    p = p.with_nll(chosen_logps)  # TRL's sft reads the plain per-token log-probs
    weights = cfg.loss_weights or (1.0,) * len(cfg.loss_types)
    total = None
    for loss_type, w in zip(cfg.loss_types, weights):
        per_pair = LOSSES[loss_type](p, cfg)
        if weight is not None:
            per_pair = per_pair * weight
        extra[f"dpo/loss_{loss_type}"] = per_pair.detach().sum() / max(per_pair.numel(), 1)
        term = per_pair * w
        total = term if total is None else total + term
    return total, {**p.metrics(cfg.beta), **extra}


def register(register_fn) -> None:
    """Register combined and mpo through the hook's ``register`` callable."""
    requires = ("token_logps", "log_sum_sq_probs", "bco_running_mean")
    register_fn("combined", combined, config=CombinedConfig, requires=requires)
    register_fn(
        "mpo",
        combined,
        config=MPOConfig,
        requires=requires,
        summary="MPO (Wang et al. 2024): combined with sigmoid 0.8, bco_pair 0.2, sft 1.0",
    )
