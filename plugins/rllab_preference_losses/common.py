"""Pieces every preference loss shares: the :class:`PreferencePairs` record every loss formula
reads, :func:`component` that registers a formula, input checks, the ``dpo/…`` metrics, TRL's
f-divergence scores, length-desensitised log-probs (LD-DPO) and WPO weights.

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
    ld_alpha = None


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


def sft_loss(chosen_logps: torch.Tensor, chosen_lengths: torch.Tensor) -> torch.Tensor:
    """−Σ_P log π(w) / Σ_P |w|, 0-d: the mean NLL over every chosen token of the batch (0 if none)."""
    tokens = chosen_lengths.sum().to(chosen_logps.dtype)
    return -chosen_logps.sum() / tokens.clamp(min=1.0)


# f'(t) at t = π/π_ref = e^u of each f-divergence (TRL 1.16's ``chosen_scores``), u the log-ratio.


def reverse_kl(u: torch.Tensor, alpha: float | None) -> torch.Tensor:
    """u: DPO's own log-ratio."""
    return u


def forward_kl(u: torch.Tensor, alpha: float | None) -> torch.Tensor:
    """1 − e^{−u} = 1 − 1/t."""
    return 1 - torch.exp(-u)


def js_divergence(u: torch.Tensor, alpha: float | None) -> torch.Tensor:
    """log 2 + log σ(u) = log(2t/(1+t))."""
    return math.log(2) + F.logsigmoid(u)


def alpha_divergence(u: torch.Tensor, alpha: float | None) -> torch.Tensor:
    """(e^{(α−1)·u} − 1)/(α − 1) = (t^{α−1} − 1)/(α − 1), α = ``alpha`` (None: TRL's 0.5).

    (α−1)·u is clamped at 80 (11 in float16) and evaluated in float32 at least, as TRL;
    |α − 1| < 1e-6 falls back to u (the α → 1 limit).
    """
    a = TRL_ALPHA if alpha is None else alpha
    if abs(a - 1.0) < 1e-6:
        return u
    t = (a - 1.0) * u
    dtype = t.dtype
    clamp_max = 11.0 if dtype == torch.float16 else 80.0
    work = torch.promote_types(dtype, torch.float32)
    return (torch.exp(torch.clamp(t.to(work), max=clamp_max)) - 1.0).to(dtype) * (1.0 / (a - 1.0))


F_SCORES = {"reverse_kl": reverse_kl, "forward_kl": forward_kl, "js_divergence": js_divergence, "alpha_divergence": alpha_divergence}
assert tuple(F_SCORES) == F_DIVERGENCES


def f_scores(log_ratio: torch.Tensor, f_divergence_type: str, alpha: float | None) -> torch.Tensor:
    """f'(e^u) of the named f-divergence at u = ``log_ratio`` (P,): :data:`F_SCORES`."""
    if f_divergence_type not in F_SCORES:
        raise ValueError(f"unknown f_divergence_type {f_divergence_type!r}: must be one of {F_DIVERGENCES}")
    return F_SCORES[f_divergence_type](log_ratio, alpha)


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


# --------------------------------------------------------------------------- the record

SEQUENCE_INPUTS = ("chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps", "chosen_lengths", "rejected_lengths")
"""The six (P,) inputs of every preference loss, in the order :meth:`PreferencePairs.build` takes them."""


@attrs.frozen
class PreferencePairs:
    """P (chosen w, rejected l) pairs as every loss formula reads them, (P,) each unless noted.

    Built once per call by :meth:`build`; each loss is then a plain function of it and its config.
    """

    chosen_logps: torch.Tensor
    """log π(w) summed over the response (LD-DPO's desensitised sum under ``ld_alpha``)."""
    rejected_logps: torch.Tensor
    ref_chosen_logps: torch.Tensor | None
    """The same under π_ref; None for a reference-free loss (``simpo``)."""
    ref_rejected_logps: torch.Tensor | None
    chosen_lengths: torch.Tensor
    """Response token counts (int)."""
    rejected_lengths: torch.Tensor
    chosen_lr: torch.Tensor | None
    """u_w = log π(w) − log π_ref(w); None without a reference."""
    rejected_lr: torch.Tensor | None
    chosen_scores: torch.Tensor | None
    """s_w = f'(e^{u_w}) of the config's f-divergence (= ``chosen_lr`` for reverse_kl)."""
    rejected_scores: torch.Tensor | None
    chosen_nll: torch.Tensor | None = None
    """0-d: −Σ_P log π(w) / Σ_P |w|, of the log-probs as given (before LD-DPO's α): the sft loss
    (:meth:`with_nll`)."""
    reward_shift: torch.Tensor | None = None
    """0-d δ of bco_pair's running mean (:meth:`shifted`); None: no shift."""

    @classmethod
    def build(
        cls, where: str, config, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths,
        rejected_lengths, *, tokens: dict | None = None, reference: bool = True,
    ) -> "PreferencePairs":  # fmt: skip
        """Validate the inputs; apply LD-DPO's ``config.ld_alpha`` (from ``tokens``) and the
        config's f-divergence. ``where`` names the loss in errors.

        ``tokens`` (read only when ``ld_alpha`` is set) holds ``chosen_token_logps``,
        ``ref_chosen_token_logps``, ``chosen_mask`` (P, T_w) and the rejected ones (P, T_l).
        ``reference=False``: the reference log-probs are ignored (may be None).
        """
        given = dict(zip(SEQUENCE_INPUTS, (chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths)))
        if not reference:
            del given["ref_chosen_logps"], given["ref_rejected_logps"]
        check_inputs(where, need_ref=reference, **given)
        if not reference:
            return cls(chosen_logps, rejected_logps, None, None, chosen_lengths, rejected_lengths, None, None, None, None)
        if config.ld_alpha is not None:
            t = tokens or {}
            for side, lengths in (("chosen", chosen_lengths), ("rejected", rejected_lengths)):
                names = (f"{side}_token_logps", f"ref_{side}_token_logps")
                check_token_side(where, side, lengths, t.get(f"{side}_mask"), **{n: t.get(n) for n in names})
            shared = torch.minimum(chosen_lengths, rejected_lengths)
            cm, rm, alpha = t["chosen_mask"], t["rejected_mask"], config.ld_alpha
            chosen_logps = ld_logps(t["chosen_token_logps"], cm, shared, alpha)
            rejected_logps = ld_logps(t["rejected_token_logps"], rm, shared, alpha)
            ref_chosen_logps = ld_logps(t["ref_chosen_token_logps"].detach(), cm, shared, alpha)
            ref_rejected_logps = ld_logps(t["ref_rejected_token_logps"].detach(), rm, shared, alpha)
        chosen_lr = chosen_logps - ref_chosen_logps
        rejected_lr = rejected_logps - ref_rejected_logps
        kind, coef = config.f_divergence_type, config.f_alpha_divergence_coef
        return cls(
            chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths,
            chosen_lr, rejected_lr, f_scores(chosen_lr, kind, coef), f_scores(rejected_lr, kind, coef),
        )  # fmt: skip

    def shifted(self, where: str, beta: float, reward_mean, reward_count) -> tuple["PreferencePairs", dict]:
        """bco_pair's running-mean shift (TRL ≤ 0.x's ``RunningMoments``, updated with this batch).

        ``reward_mean``, ``reward_count`` 0-d: the state before this batch (0 and 0 initially).
        Returns the pairs with ``reward_shift`` δ = mean + (m − mean)/(count + 1), m the mean of
        β·u over the 2P chosen and rejected responses, and the state after this batch as the
        metrics ``bco/reward_mean`` (= δ) and ``bco/reward_count``, 0-d and detached; with P = 0
        the state is returned unchanged.
        """
        if reward_mean is None or reward_count is None:
            raise ValueError(
                f"{where}: running_mean = True needs bco_reward_mean and bco_reward_count (0-d tensors, 0 and 0 at the "
                f"first step, then the returned metrics bco/reward_mean and bco/reward_count); got "
                f"bco_reward_mean={reward_mean!r}, bco_reward_count={reward_count!r}"
            )
        dtype, device = self.chosen_lr.dtype, self.chosen_lr.device
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
        if self.chosen_lr.numel() != 0:
            batch = torch.cat((beta * self.chosen_lr, beta * self.rejected_lr), 0).mean().detach()
            count = count + 1
            mean = mean + (batch - mean) / count
        return attrs.evolve(self, reward_shift=mean), {"bco/reward_mean": mean, "bco/reward_count": count}

    def with_nll(self, chosen_logps: torch.Tensor) -> "PreferencePairs":
        """The pairs with ``chosen_nll`` from ``chosen_logps``, the log-probs as given to the loss.

        Taken after the other terms, just before the formulas, so that autograd sums the
        gradients in the same order as ever (bit for bit).
        """
        return attrs.evolve(self, chosen_nll=sft_loss(chosen_logps, self.chosen_lengths))

    def metrics(self, beta: float) -> dict:
        """The ``dpo/…`` metrics of the log-ratios: accuracy of u_w > u_l, rewards β·u."""
        return metrics(self.chosen_lr - self.rejected_lr, beta * self.chosen_lr, beta * self.rejected_lr)


def component(formula, name: str | None = None):
    """The registered preference loss computing ``formula(pairs, config)`` alone.

    ``formula`` takes the :class:`PreferencePairs` and the loss's config and returns the per-pair
    losses (P,); its docstring is the component's. The component takes the six (P,) inputs (and,
    with bco_pair's ``running_mean``, the running-mean state) and returns the losses and the
    ``dpo/…`` metrics (``bco/…`` too with the running mean). ``name``: the registered name, if
    not the formula's.
    """
    name = name or formula.__name__
    where = f"preference_loss '{name}'"

    def loss(*, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths, config, bco_reward_mean=None, bco_reward_count=None):  # fmt: skip
        p = PreferencePairs.build(where, config, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths)
        extra = {}
        if config.running_mean:
            p, extra = p.shifted(where, config.beta, bco_reward_mean, bco_reward_count)
        return formula(p.with_nll(chosen_logps), config), {**p.metrics(config.beta), **extra}

    loss.__name__ = loss.__qualname__ = name
    loss.__doc__ = formula.__doc__
    loss.__module__ = formula.__module__
    return loss
