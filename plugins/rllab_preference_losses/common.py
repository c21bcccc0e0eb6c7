"""Pieces every preference loss shares: input checks, the ``dpo/…`` metrics, TRL's f-divergence
scores, length-desensitised log-probs (LD-DPO) and WPO weights.

Shapes: P pairs; ``T_w`` / ``T_l`` the padded response lengths of the chosen / rejected side
(they may differ). Sequence-level tensors are (P,); token-level ones (P, T_w) or (P, T_l).
"""

from __future__ import annotations

import math

import attrs
import torch
import torch.nn.functional as F

import rllab
from rllab import ops

F_DIVERGENCES = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")
TRL_ALPHA = 0.5
"""TRL 1.16's default ``f_alpha_divergence_coef``."""
DISCOPOP_TAU = 0.05
"""τ of ``discopop`` (the DiscoPOP paper's and TRL's)."""

# --------------------------------------------------------------------------- knobs


def beta_knob(help_extra: str = ""):
    return rllab.knob(0.1, help="β, inverse temperature of the implicit reward" + help_extra, gt=0.0)


def smoothing_knob(default: float, help_extra: str = "", **bounds):
    """``label_smoothing``: ε with ``bounds`` (``ge``/``gt``/``le``/``lt``) and a loss's remark."""
    return rllab.knob(default, help="ε, probability that a preference label is flipped" + help_extra, **bounds)


def _check_alpha(inst, attribute, value):
    if value is not None and inst.f_divergence_type != "alpha_divergence":
        raise ValueError(
            f"f_alpha_divergence_coef = {value!r} only applies with f_divergence_type = 'alpha_divergence' "
            f"(got {inst.f_divergence_type!r})"
        )


def f_divergence_knob():
    return rllab.knob(
        "reverse_kl",
        help="f-divergence of the policy/reference regulariser (Wang et al. 2023, f-DPO): the log-ratio "
        "u = log π − log π_ref becomes f'(e^u); reverse_kl is DPO",
        choices=F_DIVERGENCES,
    )


def f_alpha_knob():
    return rllab.knob(
        None,
        help=f"α of alpha_divergence (None: TRL's {TRL_ALPHA}); refused with the other divergences",
        validator=_check_alpha,
    )


# --------------------------------------------------------------------------- configs

F_DIVERGENCE_KNOBS = ("f_divergence_type", "f_alpha_divergence_coef")


def _knob_order(cls, fields):
    """``beta`` first, the f-divergence pair last, every other knob as declared (base classes first)."""
    head = [f for f in fields if f.name == "beta"]
    tail = [f for f in fields if f.name in F_DIVERGENCE_KNOBS]
    return head + [f for f in fields if f.name != "beta" and f.name not in F_DIVERGENCE_KNOBS] + tail


def preference_config(cls):
    """``attrs.frozen`` for the config of a single preference loss: its knobs show (and take
    positional arguments) in the order β, the loss's own knobs, the f-divergence pair, whichever
    class in the hierarchy declares them."""
    return attrs.frozen(cls, field_transformer=_knob_order)


@preference_config
class BetaConfig:
    """Knobs of nca_pair, sppo_hard, apo_zero, apo_down."""

    beta: float = beta_knob()

    # The base of every single-loss config. A setting that a loss does not expose as a knob keeps
    # this fixed value (TRL's default); a subclass that declares the knob overrides it.
    f_divergence_type = "reverse_kl"
    f_alpha_divergence_coef = None
    label_smoothing = 0.0
    running_mean = False
    discopop_tau = DISCOPOP_TAU


@preference_config
class FDivergenceConfig(BetaConfig):
    """β and TRL's f-divergence (``f_divergence_type``, ``f_alpha_divergence_coef``)."""

    f_divergence_type: str = f_divergence_knob()
    f_alpha_divergence_coef: float | None = f_alpha_knob()


# --------------------------------------------------------------------------- checks


def check_inputs(where: str, *, need_ref: bool = True, **tensors) -> None:
    """The six sequence-level inputs: tensors, (P,), one shape, finite log-probs."""
    for name in ("chosen_logps", "rejected_logps", "chosen_lengths", "rejected_lengths") + (
        ("ref_chosen_logps", "ref_rejected_logps") if need_ref else ()
    ):
        if not isinstance(tensors[name], torch.Tensor):
            raise TypeError(f"{where}: {name} must be a (P,) tensor, got {type(tensors[name]).__name__}")
    if tensors["chosen_logps"].ndim != 1:
        raise ValueError(f"{where}: chosen_logps must be (P,), got shape {tuple(tensors['chosen_logps'].shape)}")
    rllab.check_same_shape(where, **tensors)
    logps = [t for k, t in tensors.items() if k.endswith("logps") and t is not None]
    stacked = torch.stack([t.detach().to(torch.float64) for t in logps], dim=-1)
    ops.check_finite(where, "a sequence log-prob (chosen, rejected or reference)", stacked)


def check_token_side(where: str, side: str, lengths: torch.Tensor, mask, **tensors) -> None:
    """Token-level inputs of one side (``side`` = "chosen" or "rejected"): each (P, T_side) float,
    ``{side}_mask`` (P, T_side) bool, row counts of the mask equal to ``{side}_lengths``, finite
    where the mask is True. Errors name the component, the argument and the shapes."""
    for name, t in tensors.items():
        if t is None:
            raise ValueError(f"{where}: {name} is required here (a (P, T) tensor), got None")
    first_name, first = next(iter(tensors.items()))
    if mask is None:
        raise ValueError(f"{where}: {side}_mask is required with {first_name} (a (P, T) bool tensor), got None")
    ops.check_inputs(where, mask, **tensors)
    if first.shape[0] != lengths.shape[0]:
        raise ValueError(
            f"{where}: {first_name} has {first.shape[0]} rows but {side}_lengths has {lengths.shape[0]} pairs"
        )
    counts = mask.sum(-1)
    if not bool((counts == lengths.to(counts.dtype)).all()):
        bad = (counts != lengths.to(counts.dtype)).nonzero().flatten().tolist()
        raise rllab.RowError(
            f"{where}: {side}_mask counts {counts[bad[:10]].tolist()} tokens but {side}_lengths says "
            f"{lengths[bad[:10]].tolist()} in pairs {bad[:10]}",
            bad,
        )


# --------------------------------------------------------------------------- metrics


def mean(x: torch.Tensor) -> torch.Tensor:
    """Mean over pairs, detached; 0 for P = 0."""
    x = x.detach()
    return x.sum() / max(x.numel(), 1)


def metrics(delta: torch.Tensor, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> dict:
    """``dpo/accuracy`` (share of Δ > 0), mean chosen / rejected implicit reward, mean margin."""
    return {
        "dpo/accuracy": mean((delta > 0).to(chosen_rewards.dtype)),
        "dpo/chosen_reward": mean(chosen_rewards),
        "dpo/rejected_reward": mean(rejected_rewards),
        "dpo/margin": mean(chosen_rewards - rejected_rewards),
    }


# --------------------------------------------------------------------------- formulas


def smoothed(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """−(1−ε)·log σ(x) − ε·log σ(−x): binary cross-entropy against the label (1 − ε)."""
    return -F.logsigmoid(logits) * (1 - label_smoothing) - F.logsigmoid(-logits) * label_smoothing


def per_token(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """x / max(length, 1), (P,): a sequence sum averaged over its response tokens (as TRL clamps)."""
    return x / lengths.to(x.dtype).clamp(min=1.0)


def f_scores(log_ratio: torch.Tensor, f_divergence_type: str, alpha: float | None) -> torch.Tensor:
    """f'(t) at t = π/π_ref = exp(u), u = ``log_ratio`` (P,) — TRL 1.16's ``chosen_scores``.

    ``reverse_kl``: u.  ``forward_kl``: 1 − e^{−u}.  ``js_divergence``: log 2 + log σ(u).
    ``alpha_divergence``: (e^{(α−1)·u} − 1)/(α − 1), with (α−1)·u clamped at 80 (11 in float16)
    and evaluated in float32 at least, as TRL; |α − 1| < 1e-6 falls back to u (the α → 1 limit).
    """
    if f_divergence_type == "reverse_kl":
        return log_ratio
    if f_divergence_type == "forward_kl":
        return 1 - torch.exp(-log_ratio)
    if f_divergence_type == "js_divergence":
        return math.log(2) + F.logsigmoid(log_ratio)
    if f_divergence_type == "alpha_divergence":
        a = TRL_ALPHA if alpha is None else alpha
        if abs(a - 1.0) < 1e-6:
            return log_ratio
        t = (a - 1.0) * log_ratio
        dtype = t.dtype
        clamp_max = 11.0 if dtype == torch.float16 else 80.0
        work = torch.promote_types(dtype, torch.float32)
        return (torch.exp(torch.clamp(t.to(work), max=clamp_max)) - 1.0).to(dtype) * (1.0 / (a - 1.0))
    raise ValueError(f"unknown f_divergence_type {f_divergence_type!r}: must be one of {F_DIVERGENCES}")


def ld_logps(token_logps: torch.Tensor, mask: torch.Tensor, shared: torch.Tensor, alpha: float) -> torch.Tensor:
    """LD-DPO (Liu et al. 2024, Eq. 9) sequence log-prob: the first ``shared`` valid tokens count
    fully, the rest ("verbose" tail) by α.

    ``token_logps`` (P, T) float, ``mask`` (P, T) bool, ``shared`` (P,) int = min(|w|, |l|) of
    the pair. Returns Σ_shared log π + α·Σ_tail log π, (P,). As TRL's
    ``shared_logps + ld_alpha * tail_logps``, counting valid tokens by their running position.
    """
    pos = torch.cumsum(mask, dim=-1)
    in_shared = mask & (pos <= shared.to(pos.dtype)[:, None])
    in_tail = mask & ~in_shared
    return ops.masked_sum(token_logps, in_shared, dim=-1) + alpha * ops.masked_sum(token_logps, in_tail, dim=-1)


def wpo_weight(token_logps: torch.Tensor, log_sum_sq_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """WPO (Zhou et al. 2024, Eq. 2) per-sequence weight, detached, (P,).

    exp of the mean over valid tokens of log π(y_t) − log Σ_v π(v)², the "aligned" log-prob that
    equals 0 for a greedy-like distribution; ``token_logps``, ``log_sum_sq_probs`` (P, T) float,
    ``mask`` (P, T) bool. Lengths are clamped to ≥ 1, as TRL.
    """
    with torch.no_grad():
        aligned = ops.zero_masked(token_logps.detach() - log_sum_sq_probs.detach(), mask)
        return torch.exp(aligned.sum(-1) / mask.sum(-1).clamp(min=1).to(aligned.dtype))


@attrs.frozen
class Pairs:
    """Everything a loss formula may read, (P,) each unless noted."""

    chosen_logps: torch.Tensor
    rejected_logps: torch.Tensor
    ref_chosen_logps: torch.Tensor
    ref_rejected_logps: torch.Tensor
    chosen_lengths: torch.Tensor
    rejected_lengths: torch.Tensor
    chosen_lr: torch.Tensor
    """log π(w) − log π_ref(w)."""
    rejected_lr: torch.Tensor
    chosen_scores: torch.Tensor
    """f'(π/π_ref) of the chosen side (= ``chosen_lr`` for reverse_kl)."""
    rejected_scores: torch.Tensor


def prepare(
    where: str,
    *,
    chosen_logps,
    rejected_logps,
    ref_chosen_logps,
    ref_rejected_logps,
    chosen_lengths,
    rejected_lengths,
    f_divergence_type: str = "reverse_kl",
    f_alpha_divergence_coef: float | None = None,
    ld_alpha: float | None = None,
    token_inputs: dict | None = None,
) -> Pairs:
    """Validate the inputs; apply LD-DPO's α (from the token-level inputs) and the f-divergence.

    ``token_inputs`` (read only when ``ld_alpha`` is set) holds ``chosen_token_logps``,
    ``ref_chosen_token_logps``, ``chosen_mask`` (P, T_w) and the rejected ones (P, T_l).
    """
    check_inputs(
        where,
        chosen_logps=chosen_logps,
        rejected_logps=rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
        chosen_lengths=chosen_lengths,
        rejected_lengths=rejected_lengths,
    )
    if ld_alpha is not None:
        t = token_inputs or {}
        for side, lengths in (("chosen", chosen_lengths), ("rejected", rejected_lengths)):
            check_token_side(
                where,
                side,
                lengths,
                t.get(f"{side}_mask"),
                **{
                    f"{side}_token_logps": t.get(f"{side}_token_logps"),
                    f"ref_{side}_token_logps": t.get(f"ref_{side}_token_logps"),
                },
            )
        shared = torch.minimum(chosen_lengths, rejected_lengths)
        cm, rm = t["chosen_mask"], t["rejected_mask"]
        chosen_logps = ld_logps(t["chosen_token_logps"], cm, shared, ld_alpha)
        rejected_logps = ld_logps(t["rejected_token_logps"], rm, shared, ld_alpha)
        ref_chosen_logps = ld_logps(t["ref_chosen_token_logps"].detach(), cm, shared, ld_alpha)
        ref_rejected_logps = ld_logps(t["ref_rejected_token_logps"].detach(), rm, shared, ld_alpha)
    chosen_lr = chosen_logps - ref_chosen_logps
    rejected_lr = rejected_logps - ref_rejected_logps
    return Pairs(
        chosen_logps=chosen_logps,
        rejected_logps=rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
        chosen_lengths=chosen_lengths,
        rejected_lengths=rejected_lengths,
        chosen_lr=chosen_lr,
        rejected_lr=rejected_lr,
        chosen_scores=f_scores(chosen_lr, f_divergence_type, f_alpha_divergence_coef),
        rejected_scores=f_scores(rejected_lr, f_divergence_type, f_alpha_divergence_coef),
    )
