"""Preference losses — the DPO family, over P (chosen w, rejected l) pairs.

Inputs, each (P,): ``chosen_logps`` / ``rejected_logps`` = log π(y|x) summed over the response
tokens under the policy, ``ref_chosen_logps`` / ``ref_rejected_logps`` the same under the frozen
reference π_ref, ``chosen_lengths`` / ``rejected_lengths`` the response token counts. With the
implicit rewards r_w = β·(log π(w) − log π_ref(w)), r_l = β·(log π(l) − log π_ref(l)) and

    Δ = (log π(w) − log π_ref(w)) − (log π(l) − log π_ref(l)),

each loss returns per-pair losses (P,) (the trainer averages them) and the metrics
``dpo/accuracy`` (share of pairs with Δ > 0), ``dpo/chosen_reward`` (mean r_w),
``dpo/rejected_reward`` (mean r_l) and ``dpo/margin`` (mean r_w − r_l):

========== ============================================================ =========================
``dpo``    −log σ(βΔ)                                                   Rafailov et al. 2023
``cdpo``   −(1−ε)·log σ(βΔ) − ε·log σ(−βΔ)                              Mitchell 2023 (cDPO note)
``ipo``    (Δ_len − 1/(2β))², Δ_len with each log-ratio divided by      Azar et al. 2023
           its response length
``hinge``  relu(1 − βΔ)                                                 SLiC, Zhao et al. 2023
``robust`` [−(1−ε)·log σ(βΔ) + ε·log σ(−βΔ)] / (1 − 2ε)                 Chowdhury et al. 2024
``simpo``  −(1−ε)·log σ(β·(ā_w − ā_l − γ/β)) − ε·log σ(−β·(…)),         Meng et al. 2024
           ā = log π / length; reference-free
========== ============================================================ =========================

β (``beta``, default 0.1, must be > 0) is the inverse temperature; for ``ipo`` it is the paper's τ.
ε (``label_smoothing``) is the assumed probability that a preference label is flipped.

Reference behaviour (TRL 1.16.0 ``DPOTrainer``, ``experimental/cpo`` for SimPO): the formulas are
evaluated in TRL's order of operations. Differences, all knobs away from TRL:

* ``label_smoothing`` defaults to 0.1 for ``cdpo`` and ``robust`` (the value the Robust DPO paper
  recommends); TRL's default 0.0 turns both into plain ``dpo`` — set ``label_smoothing=0.0`` to
  reproduce it. TRL 1.16's ``sigmoid`` loss no longer reads ``label_smoothing``; rllab keeps the
  smoothed form as the separate ``cdpo``.
* ``robust`` requires 0 ≤ ε < 0.5 (at ε = 0.5 it divides by zero), as TRL's validator; its
  per-pair loss can be negative (see its docstring). ``cdpo``
  and ``simpo`` allow 0 ≤ ε ≤ 0.5 (ε > 0.5 would reverse the labels).
* ``ipo`` and ``simpo`` divide by lengths clamped to ≥ 1 (TRL clamps the same way), so an empty
  response contributes log-ratio 0 instead of a division by zero.
* ``simpo`` uses TRL's ``CPOConfig`` defaults (β = 0.1, γ = 0.5); the SimPO paper tunes β ≈ 2–2.5
  with γ/β ≈ 0.3–0.8. Its implicit rewards are β·ā (TRL CPO's logged rewards) and its accuracy
  counts pairs with ā_w > ā_l; the reference log-probs are ignored and may be None.
* Metrics are means over the P pairs (TRL logs the same means per process before gathering).
  With P = 0 the losses are empty and every metric is 0.

Log-probs that are NaN or inf raise :class:`rllab.RowError` naming the pairs.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

import rllab
from rllab import ops

# --------------------------------------------------------------------------- configs


def _beta(help_extra: str = ""):
    return rllab.knob(0.1, help="β, inverse temperature of the implicit reward" + help_extra, gt=0.0)


@attrs.frozen
class DPOConfig:
    """Knobs of dpo, hinge."""

    beta: float = _beta()


@attrs.frozen
class CDPOConfig:
    """Knobs of cdpo (conservative DPO)."""

    beta: float = _beta()
    label_smoothing: float = rllab.knob(
        0.1, help="ε, probability that a preference label is flipped (TRL default 0.0 = dpo)", ge=0.0, le=0.5
    )


@attrs.frozen
class IPOConfig:
    """Knobs of ipo."""

    beta: float = _beta(" (IPO's τ: the target log-ratio gap per token is 1/(2τ))")


@attrs.frozen
class RobustConfig:
    """Knobs of robust (provably robust DPO)."""

    beta: float = _beta()
    label_smoothing: float = rllab.knob(
        0.1,
        help="ε, probability that a preference label is flipped; must be < 0.5 (the loss divides by 1 − 2ε); "
        "TRL default 0.0 = dpo",
        ge=0.0,
        lt=0.5,
    )


@attrs.frozen
class SimPOConfig:
    """Knobs of simpo (reference-free, length-normalised)."""

    beta: float = _beta(" (SimPO paper: about 2–2.5)")
    gamma: float = rllab.knob(0.5, help="γ, target reward margin (TRL's simpo_gamma)", ge=0.0)
    label_smoothing: float = rllab.knob(0.0, help="ε, probability that a preference label is flipped", ge=0.0, le=0.5)


# --------------------------------------------------------------------------- shared pieces


def _check_inputs(where: str, *, need_ref: bool = True, **tensors) -> None:
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


def _mean(x: torch.Tensor) -> torch.Tensor:
    """Mean over pairs, detached; 0 for P = 0."""
    x = x.detach()
    return x.sum() / max(x.numel(), 1)


def _metrics(delta: torch.Tensor, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> dict:
    return {
        "dpo/accuracy": _mean((delta > 0).to(chosen_rewards.dtype)),
        "dpo/chosen_reward": _mean(chosen_rewards),
        "dpo/rejected_reward": _mean(rejected_rewards),
        "dpo/margin": _mean(chosen_rewards - rejected_rewards),
    }


def _log_ratios(where, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths):
    """Validate the inputs; return the (P,) log-ratios log π − log π_ref of chosen and rejected."""
    _check_inputs(
        where,
        chosen_logps=chosen_logps,
        rejected_logps=rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
        chosen_lengths=chosen_lengths,
        rejected_lengths=rejected_lengths,
    )
    return chosen_logps - ref_chosen_logps, rejected_logps - ref_rejected_logps


def _smoothed(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """−(1−ε)·log σ(x) − ε·log σ(−x): binary cross-entropy against the label (1 − ε)."""
    return -F.logsigmoid(logits) * (1 - label_smoothing) - F.logsigmoid(-logits) * label_smoothing


# --------------------------------------------------------------------------- losses


def dpo(*, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths, config):
    """DPO (Rafailov et al. 2023): −log σ(βΔ), Δ the chosen minus rejected policy/reference log-ratio.

    Every argument (P,); returns losses (P,) and ``dpo/…`` metrics. Policy = reference gives log 2.
    """
    chosen_lr, rejected_lr = _log_ratios(
        "preference_loss 'dpo'",
        chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths,
    )  # fmt: skip
    delta = chosen_lr - rejected_lr
    losses = -F.logsigmoid(config.beta * delta)
    return losses, _metrics(delta, config.beta * chosen_lr, config.beta * rejected_lr)


def cdpo(*, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths, config):
    """Conservative DPO (label smoothing ε): −(1−ε)·log σ(βΔ) − ε·log σ(−βΔ).

    Every argument (P,); returns losses (P,) and ``dpo/…`` metrics. ε = 0 is ``dpo``.
    """
    chosen_lr, rejected_lr = _log_ratios(
        "preference_loss 'cdpo'",
        chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths,
    )  # fmt: skip
    delta = chosen_lr - rejected_lr
    losses = _smoothed(config.beta * delta, config.label_smoothing)
    return losses, _metrics(delta, config.beta * chosen_lr, config.beta * rejected_lr)


def ipo(*, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths, config):
    """IPO (Azar et al. 2023): (Δ_len − 1/(2β))², each log-ratio averaged over its response tokens.

    Δ_len = (log π(w) − log π_ref(w)) / |w| − (log π(l) − log π_ref(l)) / |l|, lengths clamped to
    ≥ 1 (as TRL). Every argument (P,); returns losses (P,) and ``dpo/…`` metrics (rewards and
    accuracy from the un-normalised log-ratios, as TRL logs them).
    """
    chosen_lr, rejected_lr = _log_ratios(
        "preference_loss 'ipo'",
        chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths,
    )  # fmt: skip
    dtype = chosen_lr.dtype
    chosen_avg = chosen_lr / chosen_lengths.to(dtype).clamp(min=1.0)
    rejected_avg = rejected_lr / rejected_lengths.to(dtype).clamp(min=1.0)
    losses = (chosen_avg - rejected_avg - 1 / (2 * config.beta)) ** 2
    return losses, _metrics(chosen_lr - rejected_lr, config.beta * chosen_lr, config.beta * rejected_lr)


def hinge(*, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths, config):
    """Hinge / SLiC (Zhao et al. 2023): relu(1 − βΔ).

    Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    chosen_lr, rejected_lr = _log_ratios(
        "preference_loss 'hinge'",
        chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths,
    )  # fmt: skip
    delta = chosen_lr - rejected_lr
    losses = torch.relu(1 - config.beta * delta)
    return losses, _metrics(delta, config.beta * chosen_lr, config.beta * rejected_lr)


def robust(*, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths, config):
    """Robust DPO (Chowdhury et al. 2024): [−(1−ε)·log σ(βΔ) + ε·log σ(−βΔ)] / (1 − 2ε).

    Unbiased under labels flipped with probability ε (0 ≤ ε < 0.5): its expectation over the flip
    is the clean ``dpo`` loss. Being a de-biased estimate it is not bounded below by 0 (it tends to
    −ε·βΔ/(1 − 2ε) for large βΔ), as in TRL. Every argument (P,); returns losses (P,) and
    ``dpo/…`` metrics. ε = 0 is ``dpo``.
    """
    chosen_lr, rejected_lr = _log_ratios(
        "preference_loss 'robust'",
        chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths,
    )  # fmt: skip
    delta = chosen_lr - rejected_lr
    eps = config.label_smoothing
    clean = -(1 - eps) * F.logsigmoid(config.beta * delta)
    flipped = -eps * F.logsigmoid(-config.beta * delta)
    losses = (clean - flipped) / (1 - 2 * eps)
    return losses, _metrics(delta, config.beta * chosen_lr, config.beta * rejected_lr)


def simpo(*, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths, config):
    """SimPO (Meng et al. 2024): −log σ(β·(log π(w)/|w| − log π(l)/|l|) − γ), reference-free.

    Computed as TRL's CPO trainer: β·(ā_w − ā_l − γ/β), with optional label smoothing.
    ``ref_chosen_logps`` / ``ref_rejected_logps`` are ignored (may be None); lengths are clamped
    to ≥ 1. Every other argument (P,); returns losses (P,) and ``dpo/…`` metrics with rewards β·ā.
    """
    _check_inputs(
        "preference_loss 'simpo'",
        need_ref=False,
        chosen_logps=chosen_logps,
        rejected_logps=rejected_logps,
        chosen_lengths=chosen_lengths,
        rejected_lengths=rejected_lengths,
    )
    dtype = chosen_logps.dtype
    chosen_avg = chosen_logps / chosen_lengths.to(dtype).clamp(min=1.0)
    rejected_avg = rejected_logps / rejected_lengths.to(dtype).clamp(min=1.0)
    logits = chosen_avg - rejected_avg
    logits = logits - config.gamma / config.beta
    losses = _smoothed(config.beta * logits, config.label_smoothing)
    return losses, _metrics(chosen_avg - rejected_avg, config.beta * chosen_avg, config.beta * rejected_avg)


@rllab.hookimpl
def register_preference_losses(register):
    register("dpo", dpo, config=DPOConfig, aliases=("sigmoid",))
    register("cdpo", cdpo, config=CDPOConfig)
    register("ipo", ipo, config=IPOConfig)
    register("hinge", hinge, config=DPOConfig)
    register("robust", robust, config=RobustConfig)
    register("simpo", simpo, config=SimPOConfig)
