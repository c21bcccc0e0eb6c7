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
weighting, lives in :mod:`rllab_preference_losses.combined`; it reuses :func:`formula` below.

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

from .common import (
    DISCOPOP_TAU,
    BetaConfig,
    FDivergenceConfig,
    beta_knob,
    metrics,
    per_token,
    preference_config,
    prepare,
    smoothed,
    smoothing_knob,
)

# Loss types whose TRL formula reads the f-divergence scores (TRL's ``f_divergence_loss_types``).
F_DIVERGENCE_LOSSES = ("sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft")
LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
    "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)  # fmt: skip
SMOOTHED = ("robust", "exo_pair", "aot", "aot_unpaired")
"""Loss types that read ``label_smoothing``."""


# --------------------------------------------------------------------------- the formulas


def formula(loss_type: str, p, *, beta: float, label_smoothing: float, discopop_tau: float, bco_shift=None, sft=None):
    """Per-pair loss (P,) of one TRL loss type from the prepared pairs ``p`` (:class:`common.Pairs`)."""
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * (p.chosen_scores - p.rejected_scores))
    if loss_type == "hinge":
        return torch.relu(1 - beta * (p.chosen_scores - p.rejected_scores))
    if loss_type == "ipo":
        ipo_delta = per_token(p.chosen_scores, p.chosen_lengths) - per_token(p.rejected_scores, p.rejected_lengths)
        return (ipo_delta - 1 / (2 * beta)) ** 2
    if loss_type == "exo_pair":
        x = beta * (p.chosen_scores - p.rejected_scores)
        log_pw, log_pl = math.log1p(-label_smoothing), math.log(label_smoothing)
        return torch.sigmoid(x) * (F.logsigmoid(x) - log_pw) + torch.sigmoid(-x) * (F.logsigmoid(-x) - log_pl)
    if loss_type == "nca_pair":
        chosen_rewards, rejected_rewards = beta * p.chosen_lr, beta * p.rejected_lr
        return (
            -F.logsigmoid(chosen_rewards) - 0.5 * F.logsigmoid(-chosen_rewards) - 0.5 * F.logsigmoid(-rejected_rewards)
        )
    if loss_type == "robust":
        delta = p.chosen_scores - p.rejected_scores
        clean = -(1 - label_smoothing) * F.logsigmoid(beta * delta)
        flipped = -label_smoothing * F.logsigmoid(-beta * delta)
        return (clean - flipped) / (1 - 2 * label_smoothing)
    if loss_type == "bco_pair":
        chosen_rewards, rejected_rewards = beta * p.chosen_lr, beta * p.rejected_lr
        if bco_shift is not None:
            chosen_rewards, rejected_rewards = chosen_rewards - bco_shift, rejected_rewards - bco_shift
        return -F.logsigmoid(chosen_rewards) - F.logsigmoid(-rejected_rewards)
    if loss_type == "sppo_hard":
        return (p.chosen_lr - 0.5 / beta) ** 2 + (p.rejected_lr + 0.5 / beta) ** 2
    if loss_type == "aot":
        logratios = p.chosen_logps - p.rejected_logps
        ref_logratios = p.ref_chosen_logps - p.ref_rejected_logps
        delta = torch.sort(logratios, dim=0)[0] - torch.sort(ref_logratios, dim=0)[0]
        return smoothed(beta * delta, label_smoothing)
    if loss_type == "aot_unpaired":
        delta = torch.sort(p.chosen_lr, dim=0)[0] - torch.sort(p.rejected_lr, dim=0)[0]
        return smoothed(beta * delta, label_smoothing)
    if loss_type == "apo_zero":
        return (1 - torch.sigmoid(beta * p.chosen_lr)) + torch.sigmoid(beta * p.rejected_lr)
    if loss_type == "apo_down":
        return torch.sigmoid(beta * p.chosen_lr) + (1 - torch.sigmoid(beta * (p.chosen_lr - p.rejected_lr)))
    if loss_type == "discopop":
        logits = (p.chosen_scores - p.rejected_scores) * beta
        modulation = torch.sigmoid(logits / discopop_tau)
        return -F.logsigmoid(logits) * (1 - modulation) + torch.exp(-logits) * modulation
    if loss_type == "sft":
        # + 0·u_l: the same value for every pair, and a zero (not a missing) gradient for the rejected side
        return sft + 0.0 * p.rejected_lr
    if loss_type == "sigmoid_norm":
        delta = per_token(p.chosen_scores, p.chosen_lengths) - per_token(p.rejected_scores, p.rejected_lengths)
        return -F.logsigmoid(beta * delta)
    raise ValueError(f"unknown loss type {loss_type!r}: must be one of {LOSS_TYPES}")


def sft_loss(chosen_logps: torch.Tensor, chosen_lengths: torch.Tensor) -> torch.Tensor:
    """−Σ_P log π(w) / Σ_P |w|, 0-d: the mean NLL over every chosen token of the batch (0 if none)."""
    tokens = chosen_lengths.sum().to(chosen_logps.dtype)
    return -chosen_logps.sum() / tokens.clamp(min=1.0)


def bco_running_mean(where: str, p, beta: float, reward_mean, reward_count):
    """TRL ≤ 0.x's ``RunningMoments`` update with the batch mean of the implicit rewards.

    ``reward_mean``, ``reward_count`` 0-d (the state before this batch; 0 and 0 initially).
    Returns ``(δ, count)``, 0-d, detached: δ = mean + (m − mean)/(count + 1), m the mean of
    β·u over the 2P chosen and rejected responses; with P = 0 the state is returned unchanged.
    """
    if reward_mean is None or reward_count is None:
        raise ValueError(
            f"{where}: running_mean = True needs bco_reward_mean and bco_reward_count (0-d tensors, 0 and 0 at the "
            f"first step, then the returned metrics bco/reward_mean and bco/reward_count); got "
            f"bco_reward_mean={reward_mean!r}, bco_reward_count={reward_count!r}"
        )
    dtype, device = p.chosen_lr.dtype, p.chosen_lr.device
    mean = torch.as_tensor(reward_mean).detach().to(dtype=dtype, device=device)
    count = torch.as_tensor(reward_count).detach().to(dtype=dtype, device=device)
    if mean.numel() != 1 or count.numel() != 1:
        raise ValueError(
            f"{where}: bco_reward_mean and bco_reward_count must be scalars, got shapes "
            f"{tuple(mean.shape)} and {tuple(count.shape)}"
        )
    mean, count = mean.reshape(()), count.reshape(())
    if not bool(torch.isfinite(mean) & (count >= 0)):
        raise ValueError(
            f"{where}: bco_reward_mean must be finite and bco_reward_count ≥ 0, got {mean.item()}, {count.item()}"
        )
    if p.chosen_lr.numel() == 0:
        return mean, count
    batch = torch.cat((beta * p.chosen_lr, beta * p.rejected_lr), 0).mean().detach()
    count = count + 1
    return mean + (batch - mean) / count, count


# --------------------------------------------------------------------------- single losses


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


def _single(loss_type: str, doc: str, module: str = __name__, name: str | None = None):
    """A registered loss computing TRL's ``loss_type`` alone (``name``: its registered name)."""
    name = name or loss_type
    where = f"preference_loss '{name}'"

    def loss(
        *,
        chosen_logps,
        rejected_logps,
        ref_chosen_logps,
        ref_rejected_logps,
        chosen_lengths,
        rejected_lengths,
        config,
        bco_reward_mean=None,
        bco_reward_count=None,
    ):
        p = prepare(
            where,
            chosen_logps=chosen_logps,
            rejected_logps=rejected_logps,
            ref_chosen_logps=ref_chosen_logps,
            ref_rejected_logps=ref_rejected_logps,
            chosen_lengths=chosen_lengths,
            rejected_lengths=rejected_lengths,
            f_divergence_type=config.f_divergence_type,
            f_alpha_divergence_coef=config.f_alpha_divergence_coef,
        )
        extra = {}
        shift = None
        if config.running_mean:
            shift, count = bco_running_mean(where, p, config.beta, bco_reward_mean, bco_reward_count)
            extra = {"bco/reward_mean": shift, "bco/reward_count": count}
        losses = formula(
            loss_type,
            p,
            beta=config.beta,
            label_smoothing=config.label_smoothing,
            discopop_tau=config.discopop_tau,
            bco_shift=shift,
            sft=sft_loss(p.chosen_logps, p.chosen_lengths) if loss_type == "sft" else None,
        )
        beta = config.beta
        return losses, {**metrics(p.chosen_lr - p.rejected_lr, beta * p.chosen_lr, beta * p.rejected_lr), **extra}

    loss.__name__ = loss.__qualname__ = name
    loss.__doc__ = doc
    loss.__module__ = module
    return loss


_SHAPES = "Every argument (P,); returns losses (P,) and ``dpo/…`` metrics."

exo_pair = _single("exo_pair", f"""EXO (Ji et al. 2024, Eq. 16): KL(q ‖ (1−ε, ε)), q = (σ(βΔs), σ(−βΔs)).

    The reverse-KL projection of the policy's pair distribution onto the smoothed label; its
    minimum 0 is at βΔs = log((1−ε)/ε). {_SHAPES}
    """)
nca_pair = _single("nca_pair", f"""NCA (Chen et al. 2024): −log σ(βu_w) − ½·log σ(−βu_w) − ½·log σ(−βu_l).

    Noise-contrastive alignment on absolute rewards: raises the chosen likelihood, not only the
    margin. {_SHAPES}
    """)
bco_pair = _single("bco_pair", f"""BCO on pairs (Jung et al. 2024): −log σ(βu_w − δ) − log σ(−(βu_l − δ)).

    δ = 0 (TRL 1.16), or with ``running_mean`` the running mean of β·u (TRL ≤ 0.x); then
    ``bco_reward_mean`` / ``bco_reward_count`` (0-d) are the state before this batch and the
    metrics ``bco/reward_mean`` / ``bco/reward_count`` the state after it. {_SHAPES}
    """)
sppo_hard = _single("sppo_hard", f"""SPPO, hard labels (Wu et al. 2024, Eq. 4.7 with P ∈ {{0, 1}}): (u_w − 1/(2β))² + (u_l + 1/(2β))².

    Regresses each log-ratio on ±1/(2β) separately. {_SHAPES}
    """)
aot = _single("aot", f"""AOT paired (Melnyk et al. 2024): smoothed −log σ(β·d), d = sort(log π(w) − log π(l)) − sort(ref).

    Sorting over the batch makes the i-th loss belong to the i-th quantile, not to pair i.
    {_SHAPES}
    """)
aot_unpaired = _single("aot_unpaired", f"""AOT unpaired (Melnyk et al. 2024): smoothed −log σ(β·(sort(u_w) − sort(u_l))).

    Chosen and rejected log-ratios are sorted separately (first-order stochastic dominance of
    the chosen reward distribution). {_SHAPES}
    """)
apo_zero = _single("apo_zero", f"""APO-zero (D'Oosterlinck et al. 2024, Eq. 7): (1 − σ(βu_w)) + σ(βu_l).

    For chosen answers better than the policy's: raise chosen, lower rejected likelihood.
    {_SHAPES}
    """)
apo_down = _single("apo_down", f"""APO-down (D'Oosterlinck et al. 2024, Eq. 8): σ(βu_w) + (1 − σ(β(u_w − u_l))).

    For chosen answers worse than the policy's: lower both, the rejected more. {_SHAPES}
    """)
discopop = _single("discopop", f"""DiscoPOP (Chris Lu et al. 2024, Eq. 5): (1 − m)·(−log σ(x)) + m·e^{{−x}}, x = βΔs, m = σ(x/τ).

    A log-ratio-modulated blend of the logistic and exponential losses (τ ``discopop_tau``).
    e^{{−x}} grows without bound for x ≪ 0, as in TRL. {_SHAPES}
    """)
sft = _single("sft", f"""SFT on the chosen responses: −Σ_P log π(w) / Σ_P |w|, the same value for every pair.

    The batch's mean negative log-likelihood per chosen token (TRL's ``sft`` loss type); its
    gradient reaches only ``chosen_logps``. The reference log-probs feed the metrics only.
    {_SHAPES}
    """)
sigmoid_norm = _single("sigmoid_norm", f"""Length-normalised DPO (TRL's sigmoid_norm): −log σ(β·(s_w/|w| − s_l/|l|)).

    Each score is averaged over its response tokens (lengths clamped to ≥ 1). {_SHAPES}
    """)


def register(register_fn) -> None:
    """Register every loss of this module through the hook's ``register`` callable."""
    register_fn("exo_pair", exo_pair, config=ExoConfig)
    register_fn("nca_pair", nca_pair, config=BetaConfig)
    register_fn("bco_pair", bco_pair, config=BCOConfig, requires=("bco_running_mean",))
    register_fn("sppo_hard", sppo_hard, config=BetaConfig)
    register_fn("aot", aot, config=AOTConfig)
    register_fn("aot_unpaired", aot_unpaired, config=AOTConfig)
    register_fn("apo_zero", apo_zero, config=BetaConfig)
    register_fn("apo_down", apo_down, config=BetaConfig)
    register_fn("discopop", discopop, config=DiscoPOPConfig)
    register_fn("sft", sft, config=SFTConfig)
    register_fn("sigmoid_norm", sigmoid_norm, config=SigmoidNormConfig)
