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

``dpo``, ``hinge``, ``ipo`` and ``robust`` take TRL's ``f_divergence_type`` (and its
``f_alpha_divergence_coef``): their log-ratios u become f'(e^u) before the formula (reverse KL,
the default, leaves them unchanged); see ``rllab plugins show sigmoid_norm`` for the definitions.
TRL 1.16's other loss types (``exo_pair``, ``nca_pair``, ``bco_pair``, ``sppo_hard``, ``aot``,
``aot_unpaired``, ``apo_zero``, ``apo_down``, ``discopop``, ``sft``, ``sigmoid_norm``) live in
:mod:`rllab_preference_losses.trl`; its weighted loss-type list (``combined``, ``mpo``), LD-DPO's
``ld_alpha`` and WPO's weighting in :mod:`rllab_preference_losses.combined`.

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

import torch
import torch.nn.functional as F

import rllab

from .common import (
    BetaConfig,
    FDivergenceConfig,
    PreferencePairs,
    beta_knob,
    metrics,
    per_token,
    preference_config,
    smoothed,
    smoothing_knob,
)

# --------------------------------------------------------------------------- configs


@preference_config
class DPOConfig(FDivergenceConfig):
    """Knobs of dpo, hinge."""


@preference_config
class CDPOConfig(BetaConfig):
    """Knobs of cdpo (conservative DPO)."""

    label_smoothing: float = smoothing_knob(0.1, " (TRL default 0.0 = dpo)", ge=0.0, le=0.5)


@preference_config
class IPOConfig(FDivergenceConfig):
    """Knobs of ipo."""

    beta: float = beta_knob(" (IPO's τ: the target log-ratio gap per token is 1/(2τ))")


@preference_config
class RobustConfig(FDivergenceConfig):
    """Knobs of robust (provably robust DPO)."""

    label_smoothing: float = smoothing_knob(
        0.1, "; must be < 0.5 (the loss divides by 1 − 2ε); TRL default 0.0 = dpo", ge=0.0, lt=0.5
    )


@preference_config
class SimPOConfig(BetaConfig):
    """Knobs of simpo (reference-free, length-normalised)."""

    beta: float = beta_knob(" (SimPO paper: about 2–2.5)")
    gamma: float = rllab.knob(0.5, help="γ, target reward margin (TRL's simpo_gamma)", ge=0.0)
    label_smoothing: float = smoothing_knob(0.0, ge=0.0, le=0.5)


# --------------------------------------------------------------------------- losses
# Each formula takes the pairs (s = f'(e^u) the f-divergence scores, s = u for reverse KL) and the
# loss's config, and returns the per-pair losses (P,); ``common.component`` registers it.


def sigmoid(p: PreferencePairs, config) -> torch.Tensor:
    """DPO (Rafailov et al. 2023): −log σ(βΔ), Δ the chosen minus rejected policy/reference log-ratio.

    Every argument (P,); returns losses (P,) and ``dpo/…`` metrics. Policy = reference gives log 2.
    """
    return -F.logsigmoid(config.beta * (p.chosen_scores - p.rejected_scores))


def hinge(p: PreferencePairs, config) -> torch.Tensor:
    """Hinge / SLiC (Zhao et al. 2023): relu(1 − βΔ).

    Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    return torch.relu(1 - config.beta * (p.chosen_scores - p.rejected_scores))


def ipo(p: PreferencePairs, config) -> torch.Tensor:
    """IPO (Azar et al. 2023): (Δ_len − 1/(2β))², each log-ratio averaged over its response tokens.

    Δ_len = (log π(w) − log π_ref(w)) / |w| − (log π(l) − log π_ref(l)) / |l|, lengths clamped to
    ≥ 1 (as TRL). Every argument (P,); returns losses (P,) and ``dpo/…`` metrics (rewards and
    accuracy from the un-normalised log-ratios, as TRL logs them).
    """
    delta_len = per_token(p.chosen_scores, p.chosen_lengths) - per_token(p.rejected_scores, p.rejected_lengths)
    return (delta_len - 1 / (2 * config.beta)) ** 2


def robust(p: PreferencePairs, config) -> torch.Tensor:
    """Robust DPO (Chowdhury et al. 2024): [−(1−ε)·log σ(βΔ) + ε·log σ(−βΔ)] / (1 − 2ε).

    Unbiased under labels flipped with probability ε (0 ≤ ε < 0.5): its expectation over the flip
    is the clean ``dpo`` loss. Being a de-biased estimate it is not bounded below by 0 (it tends to
    −ε·βΔ/(1 − 2ε) for large βΔ), as in TRL. Every argument (P,); returns losses (P,) and
    ``dpo/…`` metrics. ε = 0 is ``dpo``.
    """
    beta, eps = config.beta, config.label_smoothing
    delta = p.chosen_scores - p.rejected_scores
    clean = -(1 - eps) * F.logsigmoid(beta * delta)
    flipped = -eps * F.logsigmoid(-beta * delta)
    return (clean - flipped) / (1 - 2 * eps)


def cdpo(p: PreferencePairs, config) -> torch.Tensor:
    """Conservative DPO (label smoothing ε): −(1−ε)·log σ(βΔ) − ε·log σ(−βΔ).

    Every argument (P,); returns losses (P,) and ``dpo/…`` metrics. ε = 0 is ``dpo``.
    """
    return smoothed(config.beta * (p.chosen_scores - p.rejected_scores), config.label_smoothing)


def simpo(*, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths, config):
    """SimPO (Meng et al. 2024): −log σ(β·(log π(w)/|w| − log π(l)/|l|) − γ), reference-free.

    Computed as TRL's CPO trainer: β·(ā_w − ā_l − γ/β), with optional label smoothing.
    ``ref_chosen_logps`` / ``ref_rejected_logps`` are ignored (may be None); lengths are clamped
    to ≥ 1. Every other argument (P,); returns losses (P,) and ``dpo/…`` metrics with rewards β·ā.
    """
    p = PreferencePairs.build(
        "preference_loss 'simpo'", config, chosen_logps, rejected_logps, None, None, chosen_lengths, rejected_lengths,
        reference=False,
    )  # fmt: skip
    beta = config.beta
    chosen_avg, rejected_avg = per_token(p.chosen_logps, p.chosen_lengths), per_token(p.rejected_logps, p.rejected_lengths)
    losses = smoothed(beta * (chosen_avg - rejected_avg - config.gamma / beta), config.label_smoothing)
    return losses, metrics(chosen_avg - rejected_avg, beta * chosen_avg, beta * rejected_avg)
