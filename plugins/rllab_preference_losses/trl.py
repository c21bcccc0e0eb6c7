"""Preference losses — TRL 1.16 ``DPOTrainer``'s other loss types.

Inputs, each (P,) over P (chosen w, rejected l) pairs, as for every preference loss:
``chosen_logps`` / ``rejected_logps`` = log π(y|x) summed over the response under the policy,
``ref_chosen_logps`` / ``ref_rejected_logps`` the same under π_ref, ``chosen_lengths`` /
``rejected_lengths`` the response token counts. With u_w = log π(w) − log π_ref(w), u_l likewise,
the scores s = f'(e^u) of the chosen f-divergence (s = u for reverse KL, DPO's case) and
Δs = s_w − s_l, the per-pair losses are (σ the logistic function, ε ``label_smoothing``):

================ ============================================================== =======================
``exo_pair``     q_w·(log q_w − log(1−ε)) + q_l·(log q_l − log ε),               Ji et al. 2024 (EXO),
                 q_w = σ(βΔs), q_l = σ(−βΔs): KL(q ‖ (1−ε, ε))                   Eq. 16
``nca_pair``     −log σ(βu_w) − ½·log σ(−βu_w) − ½·log σ(−βu_l)                  Chen et al. 2024 (NCA)
``bco_pair``     −log σ(βu_w − δ) − log σ(−(βu_l − δ)), δ = 0 (TRL 1.16) or a    Jung et al. 2024 (BCO)
                 running mean of the implicit rewards (``running_mean``)
``sppo_hard``    (u_w − 1/(2β))² + (u_l + 1/(2β))²                               Wu et al. 2024 (SPPO),
                                                                                 hard P ∈ {0, 1}
``aot``          smoothed −log σ(β·d), d = sort_P(log π(w) − log π(l))           Melnyk et al. 2024
                 − sort_P(log π_ref(w) − log π_ref(l)) (paired)                  (AOT)
``aot_unpaired`` the same with d = sort_P(u_w) − sort_P(u_l)                     Melnyk et al. 2024
``apo_zero``     (1 − σ(βu_w)) + σ(βu_l)                                         D'Oosterlinck et al.
                                                                                 2024 (APO), Eq. 7
``apo_down``     σ(βu_w) + (1 − σ(β(u_w − u_l)))                                 APO, Eq. 8
``discopop``     (1 − m)·(−log σ(x)) + m·e^{−x}, x = βΔs, m = σ(x/τ)             Chris Lu et al. 2024
                                                                                 (DiscoPOP), Eq. 5
``sft``          −Σ log π(w) / Σ |w| over the batch (the chosen responses' NLL    —
                 per token), the same value for every pair
``sigmoid_norm`` −log σ(β·(s_w/|w| − s_l/|l|))                                   TRL's length-
                                                                                 normalised DPO
================ ============================================================== =======================

"smoothed" is −(1−ε)·log σ(x) − ε·log σ(−x). ``aot`` and ``aot_unpaired`` sort over the batch,
so their i-th loss belongs to the i-th smallest margin, not to pair i.

f-divergences (Wang et al. 2023, "Beyond Reverse KL", TRL's ``f_divergence_type``): with
t = π/π_ref = e^u, s = f'(t) is u (``reverse_kl``), 1 − 1/t (``forward_kl``),
log(2t/(1+t)) = log 2 + log σ(u) (``js_divergence``), or (t^{α−1} − 1)/(α − 1)
(``alpha_divergence``, α = ``f_alpha_divergence_coef``, TRL's default 0.5; (α−1)·u clamped at 80,
as TRL). Like TRL, only the losses built on Δs accept a divergence other than reverse KL
(``sigmoid``, ``sigmoid_norm``, ``hinge``, ``ipo``, ``exo_pair``, ``robust``, ``discopop``; ``sft``
ignores it): the f-DPO reparameterisation leaves a β·log Z(x) term that cancels only in Δs.

TRL's weighted loss-type list (``combined``, ``mpo``), with LD-DPO's ``ld_alpha`` and WPO's
weighting, lives in :mod:`rllab_preference_losses.combined`; it reads the table :data:`LOSSES` below.

Reference (TRL 1.16.0, ``DPOTrainer._compute_loss``): the formulas are evaluated in TRL's order of
operations, with TRL's knob names and defaults. Differences, all documented on the knobs:

* ``bco_pair``: TRL 1.16 uses no reward shift (δ = 0, the default here); ``running_mean=True``
  restores TRL ≤ 0.x's ``RunningMoments`` shift. Its state is explicit: the loss reads
  ``bco_reward_mean`` and ``bco_reward_count`` (0-d, 0 and 0 at the first step) and returns the
  updated state as the metrics ``bco/reward_mean`` and ``bco/reward_count`` — feed them back at
  the next step. δ is the updated mean, which already includes this batch, as in TRL.
* ``sft`` is computed from the sequence sums (Σ_P log π(w) / Σ_P |w|, equal to TRL's mean over the
  chosen tokens); with no chosen token at all it is 0 (TRL: NaN). Under ``use_weighting`` TRL 1.16
  fails (an in-place product on an expanded tensor); here each pair's copy is weighted.
* Knobs that would have no effect are refused: ``label_smoothing`` ≠ 0 in ``combined`` without a
  loss that reads it, ``discopop_tau`` without ``discopop``, ``f_alpha_divergence_coef`` without
  ``alpha_divergence``, ``running_mean`` without ``bco_pair``. TRL's own refusals are kept:
  ``exo_pair`` needs ε > 0, WPO does not combine with ``aot``/``aot_unpaired``, non-reverse-KL
  divergences only with the losses listed above; ``robust`` needs ε < 0.5 (TRL only warns).
* ``alpha_divergence`` in float64 clamps at 80 like float32 (TRL has no float64 entry).

Every loss returns per-pair losses (P,) and the ``dpo/…`` metrics of the other preference losses
(accuracy = share of pairs with u_w > u_l; implicit rewards β·u); ``combined`` adds
``dpo/loss_<type>`` (mean loss of each type before its weight w_k, after WPO's) and, with WPO,
``dpo/wpo_weight`` (mean w(w)·w(l)).
Log-probs that are NaN or inf raise :class:`rllab.RowError` naming the pairs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import rllab

from . import dpo
from .common import (
    DISCOPOP_TAU,
    BetaConfig,
    FDivergenceConfig,
    PreferencePairs,
    beta_knob,
    component,
    per_token,
    preference_config,
    smoothed,
    smoothing_knob,
)

# --------------------------------------------------------------------------- the formulas
# Each takes the pairs and the loss's config (β ``beta``, ε ``label_smoothing``, τ ``discopop_tau``)
# and returns the per-pair losses (P,). u = log π − log π_ref, s = f'(e^u).


def exo_pair(p: PreferencePairs, config) -> torch.Tensor:
    """EXO (Ji et al. 2024, Eq. 16): KL(q ‖ (1−ε, ε)), q = (σ(βΔs), σ(−βΔs)).

    The reverse-KL projection of the policy's pair distribution onto the smoothed label; its
    minimum 0 is at βΔs = log((1−ε)/ε). Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    x = config.beta * (p.chosen_scores - p.rejected_scores)
    log_pw, log_pl = math.log1p(-config.label_smoothing), math.log(config.label_smoothing)
    return torch.sigmoid(x) * (F.logsigmoid(x) - log_pw) + torch.sigmoid(-x) * (F.logsigmoid(-x) - log_pl)


def nca_pair(p: PreferencePairs, config) -> torch.Tensor:
    """NCA (Chen et al. 2024): −log σ(βu_w) − ½·log σ(−βu_w) − ½·log σ(−βu_l).

    Noise-contrastive alignment on absolute rewards: raises the chosen likelihood, not only the
    margin. Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    chosen_rewards, rejected_rewards = config.beta * p.chosen_lr, config.beta * p.rejected_lr
    return -F.logsigmoid(chosen_rewards) - 0.5 * F.logsigmoid(-chosen_rewards) - 0.5 * F.logsigmoid(-rejected_rewards)


def bco_pair(p: PreferencePairs, config) -> torch.Tensor:
    """BCO on pairs (Jung et al. 2024): −log σ(βu_w − δ) − log σ(−(βu_l − δ)).

    δ = 0 (TRL 1.16), or with ``running_mean`` the running mean of β·u (TRL ≤ 0.x); then
    ``bco_reward_mean`` / ``bco_reward_count`` (0-d) are the state before this batch and the
    metrics ``bco/reward_mean`` / ``bco/reward_count`` the state after it. Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    chosen_rewards, rejected_rewards = config.beta * p.chosen_lr, config.beta * p.rejected_lr
    if p.reward_shift is not None:
        chosen_rewards, rejected_rewards = chosen_rewards - p.reward_shift, rejected_rewards - p.reward_shift
    return -F.logsigmoid(chosen_rewards) - F.logsigmoid(-rejected_rewards)


def sppo_hard(p: PreferencePairs, config) -> torch.Tensor:
    """SPPO, hard labels (Wu et al. 2024, Eq. 4.7 with P ∈ {0, 1}): (u_w − 1/(2β))² + (u_l + 1/(2β))².

    Regresses each log-ratio on ±1/(2β) separately. Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    return (p.chosen_lr - 0.5 / config.beta) ** 2 + (p.rejected_lr + 0.5 / config.beta) ** 2


def aot(p: PreferencePairs, config) -> torch.Tensor:
    """AOT paired (Melnyk et al. 2024): smoothed −log σ(β·d), d = sort(log π(w) − log π(l)) − sort(ref).

    Sorting over the batch makes the i-th loss belong to the i-th quantile, not to pair i.
    Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    logratios = p.chosen_logps - p.rejected_logps
    ref_logratios = p.ref_chosen_logps - p.ref_rejected_logps
    delta = torch.sort(logratios, dim=0)[0] - torch.sort(ref_logratios, dim=0)[0]
    return smoothed(config.beta * delta, config.label_smoothing)


def aot_unpaired(p: PreferencePairs, config) -> torch.Tensor:
    """AOT unpaired (Melnyk et al. 2024): smoothed −log σ(β·(sort(u_w) − sort(u_l))).

    Chosen and rejected log-ratios are sorted separately (first-order stochastic dominance of
    the chosen reward distribution). Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    delta = torch.sort(p.chosen_lr, dim=0)[0] - torch.sort(p.rejected_lr, dim=0)[0]
    return smoothed(config.beta * delta, config.label_smoothing)


def apo_zero(p: PreferencePairs, config) -> torch.Tensor:
    """APO-zero (D'Oosterlinck et al. 2024, Eq. 7): (1 − σ(βu_w)) + σ(βu_l).

    For chosen answers better than the policy's: raise chosen, lower rejected likelihood.
    Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    return (1 - torch.sigmoid(config.beta * p.chosen_lr)) + torch.sigmoid(config.beta * p.rejected_lr)


def apo_down(p: PreferencePairs, config) -> torch.Tensor:
    """APO-down (D'Oosterlinck et al. 2024, Eq. 8): σ(βu_w) + (1 − σ(β(u_w − u_l))).

    For chosen answers worse than the policy's: lower both, the rejected more. Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    beta = config.beta
    return torch.sigmoid(beta * p.chosen_lr) + (1 - torch.sigmoid(beta * (p.chosen_lr - p.rejected_lr)))


def discopop(p: PreferencePairs, config) -> torch.Tensor:
    """DiscoPOP (Chris Lu et al. 2024, Eq. 5): (1 − m)·(−log σ(x)) + m·e^{−x}, x = βΔs, m = σ(x/τ).

    A log-ratio-modulated blend of the logistic and exponential losses (τ ``discopop_tau``).
    e^{−x} grows without bound for x ≪ 0, as in TRL. Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    tau = DISCOPOP_TAU if config.discopop_tau is None else config.discopop_tau  # None: combined's default
    logits = (p.chosen_scores - p.rejected_scores) * config.beta
    modulation = torch.sigmoid(logits / tau)
    return -F.logsigmoid(logits) * (1 - modulation) + torch.exp(-logits) * modulation


def sft(p: PreferencePairs, config) -> torch.Tensor:
    """SFT on the chosen responses: −Σ_P log π(w) / Σ_P |w|, the same value for every pair.

    The batch's mean negative log-likelihood per chosen token (TRL's ``sft`` loss type); its
    gradient reaches only ``chosen_logps``. The reference log-probs feed the metrics only.
    Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    # + 0·u_l: the same value for every pair, and a zero (not a missing) gradient for the rejected side
    return p.chosen_nll + 0.0 * p.rejected_lr


def sigmoid_norm(p: PreferencePairs, config) -> torch.Tensor:
    """Length-normalised DPO (TRL's sigmoid_norm): −log σ(β·(s_w/|w| − s_l/|l|)).

    Each score is averaged over its response tokens (lengths clamped to ≥ 1). Every argument (P,); returns losses (P,) and ``dpo/…`` metrics.
    """
    delta = per_token(p.chosen_scores, p.chosen_lengths) - per_token(p.rejected_scores, p.rejected_lengths)
    return -F.logsigmoid(config.beta * delta)


LOSSES = {
    "sigmoid": dpo.sigmoid, "hinge": dpo.hinge, "ipo": dpo.ipo, "exo_pair": exo_pair, "nca_pair": nca_pair,
    "robust": dpo.robust, "bco_pair": bco_pair, "sppo_hard": sppo_hard, "aot": aot, "aot_unpaired": aot_unpaired,
    "apo_zero": apo_zero, "apo_down": apo_down, "discopop": discopop, "sft": sft, "sigmoid_norm": sigmoid_norm,
}  # fmt: skip
"""TRL 1.16's loss types, each its formula (``combined`` sums them by weight)."""
LOSS_TYPES = tuple(LOSSES)
# Loss types whose TRL formula reads the f-divergence scores (TRL's ``f_divergence_loss_types``).
F_DIVERGENCE_LOSSES = ("sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft")
SMOOTHED = ("robust", "exo_pair", "aot", "aot_unpaired")
"""Loss types that read ``label_smoothing``."""


# --------------------------------------------------------------------------- configs


@preference_config
class SFTConfig(BetaConfig):
    """Knobs of sft."""

    beta: float = beta_knob(" (sft's loss ignores it; it scales the logged implicit rewards only)")


@preference_config
class BCOConfig(BetaConfig):
    """Knobs of bco_pair."""

    running_mean: bool = rllab.knob(
        False,
        help="shift the implicit rewards by their running mean (TRL ≤ 0.x, the BCO paper's δ); needs the "
        "bco_reward_mean / bco_reward_count inputs; False is TRL 1.16",
    )


@preference_config
class ExoConfig(FDivergenceConfig):
    """Knobs of exo_pair."""

    label_smoothing: float = rllab.knob(
        1e-3,
        help="ε of the target distribution (1 − ε, ε); must be in (0, 1), EXO's recommended 1e-3 "
        "(TRL has no default: it refuses 0)",
        gt=0.0,
        lt=1.0,
    )


@preference_config
class AOTConfig(BetaConfig):
    """Knobs of aot, aot_unpaired."""

    label_smoothing: float = smoothing_knob(0.0, " (TRL default 0.0)", ge=0.0, le=0.5)


@preference_config
class DiscoPOPConfig(FDivergenceConfig):
    """Knobs of discopop."""

    discopop_tau: float = rllab.knob(
        DISCOPOP_TAU, help="τ, temperature of the logistic/exponential mixing (paper and TRL: 0.05)", gt=0.0
    )


@preference_config
class SigmoidNormConfig(FDivergenceConfig):
    """Knobs of sigmoid_norm."""


def register(register_fn) -> None:
    """Register every loss of this module through the hook's ``register`` callable."""
    register_fn("exo_pair", component(exo_pair), config=ExoConfig)
    register_fn("nca_pair", component(nca_pair), config=BetaConfig)
    register_fn("bco_pair", component(bco_pair), config=BCOConfig, requires=("bco_running_mean",))
    register_fn("sppo_hard", component(sppo_hard), config=BetaConfig)
    register_fn("aot", component(aot), config=AOTConfig)
    register_fn("aot_unpaired", component(aot_unpaired), config=AOTConfig)
    register_fn("apo_zero", component(apo_zero), config=BetaConfig)
    register_fn("apo_down", component(apo_down), config=BetaConfig)
    register_fn("discopop", component(discopop), config=DiscoPOPConfig)
    register_fn("sft", component(sft), config=SFTConfig)
    register_fn("sigmoid_norm", component(sigmoid_norm), config=SigmoidNormConfig)
