"""Rejection sampling on the rollout/training mismatch (verl 0.9.1 ``rollout_corr_helper``); the
divergence estimates it thresholds and the mismatch metrics are :mod:`rllab_corrections.divergence`'s.

Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch". Where an importance weight *re-weights* a token whose trainer and
sampler disagree, rejection sampling *drops* it — or its whole sequence — once a divergence
estimate between the two policies passes a threshold. With ``lr_t = clamp(old_log_prob_t −
rollout_log_prob_t, ±20)`` (log π_train/π_rollout) the per-token divergence estimates are::

    k1_t = −lr_t          k2_t = ½·lr_t²          k3_t = exp(lr_t) − 1 − lr_t

and the criteria (verl's ``rollout_rs`` options) are

==================== ============================================================ ===========
``token_kN``         each token on its own: keep where k_t passes                  token
``seq_sum_kN``       Σ_t k_t over the row (for k1: log of the sequence ratio, sign  sequence
                     flipped)
``seq_mean_kN``      mean_t k_t over the row (for k1: the log of the *geometric     sequence
                     mean* ratio, sign flipped — "Geo-RS")
``seq_max_kN``       max_t k_t over the row (N = 2, 3): one bad token vetoes the    sequence
                     whole sequence
==================== ============================================================ ===========

The per-token **veto** (``veto_threshold``, off by default) drops every token of a row in which
some valid token has ``π_train/π_rollout = exp(lr_t) < veto_threshold`` — one catastrophically
unlikely token under the trainer condemns its sequence. It is the ``rollout_token_veto_threshold``
of the verl releases before 0.9 (paper value 1e-4); verl 0.9.1 dropped it (``seq_max_k3`` is its
closest 0.9.1 criterion), so it has no 0.9.1 reference and is tested by hand. It combines with the
criterion: a token is kept only if it passes both.

**Several criteria** (verl's comma-separated ``rollout_rs``, e.g. ``"token_k1,seq_max_k3"``):
``criterion`` may list several, as one comma-separated string or a list of names, and a token is
kept only where it passes *every* criterion (verl's ``combined_mask``). ``upper`` is one number
shared by all of them or a list with one per criterion (verl's ``rollout_rs_threshold``
``"0.5_2.0,0.1"`` is ``criterion = "token_k1,seq_max_k3"``, ``upper = [2.0, 0.1]``,
``lower = 0.5``); ``lower`` is one number shared by the k1 criteria or a list with one per k1
criterion, in their order. A criterion listed twice, a criterion that is not known and a number
of thresholds that matches neither are refused by name.

A k1 statistic passes where ``log(lower) ≤ stat ≤ log(upper)`` (``lower`` defaults to
1/``upper``; an empty interval — ``upper`` < 1 with the default ``lower`` — is refused, as is a
``veto_threshold`` ≥ 1: both would reject every token); k2 and k3 statistics are non-negative and
pass where ``stat ≤ upper``. A sequence
criterion keeps or drops every token of a row together. Note that the k1 statistic is −lr, so
``upper`` bounds π_rollout/π_train from above — verl's convention, kept as is.

Shapes: ``old_log_prob``, ``rollout_log_prob`` (B, T) float, ``mask`` (B, T) bool.

:func:`rejection_mask` returns the (B, T) keep mask (verl's ``modified_response_mask``).
The registered correction ``rejection`` returns ``keep × w`` as its weights, where ``w`` is an
optional importance weight (``is_level`` "token"/"sequence", truncated at ``c_max`` or masked
outside [``c_min``, ``c_max``], optionally batch-normalised) or 1.

**The response mask** (knob ``narrow_mask``). verl removes rejected tokens from the response mask
(``compute_rollout_correction_and_add_to_batch`` overwrites ``response_mask`` before
``compute_advantage``), so they leave everything downstream: the loss's normaliser (token-mean
divides by the tokens that survived), the token and sequence counts of the aggregation, the KL
and entropy terms and the value loss. rllab's ``rl`` step does the same: the correction registers
with the traits ``keep_mask=`` :func:`keep_mask` and ``narrows_mask=`` :func:`narrows_mask`, and the step
trains on ``mask & keep`` — the IS weights themselves are computed on the sampled mask, as
verl's are. When the step narrows:

* ``"after_advantage"`` (default): the advantage estimator sees the sampled mask and the
  narrowed one applies from the loss on. For the outcome estimators (``grpo``, ``rloo``,
  ``grpo_passk``, …) this is exactly verl — verl's scores sum the rewards over every position, so
  a rejected row still counts in its group — whatever ``mask_scores`` says; rllab's default
  ``mask_scores=True`` would otherwise drop a fully rejected row from its group, and lose the
  reward of a row whose last token a token criterion rejected. Estimators whose statistics read
  the mask inside rows or over the batch (``gae``, whitening, ``opo``'s lengths, the optimal
  token baselines) see every sampled token.
* ``"before_advantage"``: verl's order literally — the estimator gets the narrowed mask too.
  Combine it with the estimator's verl knobs (``mask_scores=False``) to reproduce verl's
  advantages for every estimator.
* ``"off"``: rejected tokens only get weight 0 and stay in the normaliser and the counts (rllab
  before this knob existed; a token-mean then shrinks the gradient by the rejected share).

The step needs the old log-probs before the update to narrow the counts, so a narrowing
correction always runs the old-log-prob forward (never the fused on-policy shortcut).

Metrics (detached 0-d, ``tis/…``): ``tis/rs_masked_frac`` (share of valid tokens rejected),
``tis/rs_seq_masked_frac`` (share of non-empty rows with a rejected token; verl divides by all
rows, empty ones included), ``tis/rs_stat_mean`` (the criterion's statistic averaged over valid
tokens, verl's ``rollout_rs_<option>_mean``) and the mismatch metrics of
:func:`mismatch_metrics`. With several criteria ``tis/rs_masked_frac`` counts the tokens any of
them rejects, and each criterion ``c`` reports ``tis/rs_<c>_stat_mean`` and
``tis/rs_<c>_masked_frac`` (verl's ``rollout_rs_<c>_mean`` and ``…_masked_fraction``) in place of
``tis/rs_stat_mean``.
"""

from __future__ import annotations

import math

import attrs
import torch

import rllab
from rllab import ops
from rllab import FloatOrFloats, FloatOrFloatsOrNone, StrOrStrs
from rllab_corrections.divergence import SAFETY_BOUND, _zero, divergences, mismatch_metrics, row_stat  # noqa: F401  (re-exported)

NARROW = ("after_advantage", "before_advantage", "off")

CRITERIA = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)

__all__ = ["CRITERIA", "NARROW", "criteria", "resolve_criteria", "divergences", "rejection_mask", "keep_mask", "veto_rows", "mismatch_metrics", "rejection", "RejectionConfig"]


def _prepare(where, old_log_prob, rollout_log_prob, mask):
    for name, t in (("old_log_prob", old_log_prob), ("rollout_log_prob", rollout_log_prob)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{where}: {name} must be a floating-point tensor, got {got}")
    if old_log_prob.ndim != 2:
        raise ValueError(f"{where}: old_log_prob must be (B, T), got shape {tuple(old_log_prob.shape)}")
    rllab.check_mask(where, mask)
    rllab.check_same_shape(where, old_log_prob=old_log_prob, rollout_log_prob=rollout_log_prob, mask=mask)
    old, rollout = old_log_prob.detach(), rollout_log_prob.detach()
    ops.check_finite(where, "old_log_prob", old, mask)
    ops.check_finite(where, "rollout_log_prob", rollout, mask)
    dtype = torch.promote_types(torch.promote_types(old.dtype, rollout.dtype), torch.float32)
    zero = torch.zeros((), dtype=dtype, device=old.device)
    return torch.where(mask, old.to(dtype), zero), torch.where(mask, rollout.to(dtype), zero)


def _statistic(criterion: str, old, rollout, mask):
    """The criterion's statistic: (B, T) for token criteria, (B, 1) broadcastable for sequence ones."""
    level, _, estimator = criterion.rpartition("_")
    per_token = divergences(old, rollout)[estimator]
    if level == "token":
        return per_token
    return row_stat(level.split("_")[1], per_token, mask)[:, None]


def criteria(criterion: str | tuple[str, ...] | list[str], *, knob: str = "criterion") -> tuple[str, ...]:
    """The criteria named by ``criterion``: one name, a comma-separated string or a list of names.

    Refuses an empty list, an unknown name (listing :data:`CRITERIA`) and a name listed twice."""
    parts = criterion.split(",") if isinstance(criterion, str) else [p for c in criterion for p in str(c).split(",")]
    names = tuple(p.strip() for p in parts if p.strip())
    if not names:
        raise ValueError(f"{knob} = {criterion!r} names no criterion: must be one or more of {', '.join(CRITERIA)}")
    for name in names:
        if name not in CRITERIA:
            raise ValueError(
                f"{knob} = {criterion!r}: unknown criterion {name!r}; must be one or more of {', '.join(CRITERIA)}"
            )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{knob} = {criterion!r} lists {', '.join(map(repr, twice))} more than once")
    return names


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def resolve_criteria(criterion, upper, lower=None, *, names: tuple[str, str, str] = ("criterion", "upper", "lower")):
    """``((name, lower_ratio | None, upper), ...)``, one per criterion, from the knobs as given.

    ``upper``: one number shared by every criterion or one per criterion; ``lower``: None (1/upper
    for each k1 criterion), one number shared by the k1 criteria, or one per k1 criterion in order;
    non-k1 criteria take no lower bound (``lower_ratio`` None). ``names``: the knobs as the user
    spells them, for the errors."""
    crit = criteria(criterion, knob=names[0])
    uppers = _as_list(upper)
    if len(uppers) not in (1, len(crit)):
        raise ValueError(
            f"{names[1]} = {upper!r} gives {len(uppers)} thresholds for {len(crit)} criteria ({', '.join(crit)}): "
            f"give one shared by all or one per criterion"
        )
    uppers = uppers * len(crit) if len(uppers) == 1 else uppers
    for u in uppers:
        if not u > 0:
            raise ValueError(f"{names[1]} = {upper!r} is out of range: every threshold must be > 0")
    k1 = [c for c in crit if c.endswith("k1")]
    lowers = [None] * len(k1)
    if lower is not None:
        given = _as_list(lower)
        if not k1:
            raise ValueError(f"{names[2]} = {lower!r} only applies to k1 criteria, not {', '.join(map(repr, crit))}")
        if len(given) not in (1, len(k1)):
            raise ValueError(
                f"{names[2]} = {lower!r} gives {len(given)} lower bounds for {len(k1)} k1 criteria ({', '.join(k1)}): "
                f"give one shared by all or one per k1 criterion"
            )
        for lo in given:
            if not lo > 0:
                raise ValueError(f"{names[2]} = {lower!r} is out of range: every lower bound must be > 0")
        lowers = given * len(k1) if len(given) == 1 else given
    lower_of = dict(zip(k1, lowers))
    return tuple(
        (c, (1.0 / u if lower_of[c] is None else lower_of[c]) if c in lower_of else None, u)
        for c, u in zip(crit, uppers)
    )


def rejection_mask(*, old_log_prob, rollout_log_prob, mask, criterion, upper, lower=None):
    """(B, T) bool: True on valid tokens that pass every criterion (verl's ``modified_response_mask``).

    ``old_log_prob``, ``rollout_log_prob`` (B, T) float; ``mask`` (B, T) bool; ``criterion`` one
    of :data:`CRITERIA`, or several (comma-separated or a list); ``upper`` > 0, one shared or one
    per criterion; ``lower`` (k1 criteria only) > 0, one shared or one per k1 criterion, default
    1/upper.
    """
    where = f"rejection_mask({criterion!r})"
    try:
        specs = resolve_criteria(criterion, upper, lower)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    old, rollout = _prepare(where, old_log_prob, rollout_log_prob, mask)
    return _keep(specs, old, rollout, mask)[0]


def _keep(specs, old, rollout, mask):
    """``(keep (B, T) bool, {criterion: (passes (B, T) bool, statistic (B, T))})`` over the
    resolved ``specs``: a valid token is kept where it passes every criterion."""
    keep = mask
    per = {}
    for criterion, lower, upper in specs:
        stat = _statistic(criterion, old, rollout, mask)
        if lower is None:
            passes = stat <= upper
        else:
            passes = (stat >= math.log(lower)) & (stat <= math.log(upper))
        passes = mask & passes.expand_as(mask)
        keep = keep & passes
        per[criterion] = (passes, stat.expand_as(mask))
    return keep, per


def veto_rows(old_log_prob, rollout_log_prob, mask, threshold: float) -> torch.Tensor:
    """(B,) bool: rows with a valid token whose ratio exp(clamp(lr_t, ±20)) is below ``threshold``."""
    lr = torch.clamp(old_log_prob - rollout_log_prob, -SAFETY_BOUND, SAFETY_BOUND)
    return (mask & (lr < math.log(threshold))).any(-1)


# --------------------------------------------------------------------------- the registered correction


def _check_criteria(inst, attribute, value):
    criteria(value)


def check_rejects_something_only(criterion, upper, lower, veto: float | None = None,
                                 *, names: tuple[str, ...] = ("upper", "lower", "veto_threshold", "criterion")) -> None:
    """Refuse thresholds under which every token is rejected (a gradient of 0 at every step): a k1
    interval [lower, upper] that is empty — ``lower`` given or implied as 1/``upper`` — and a veto
    at or above ratio 1 (an on-policy token has π_train/π_rollout = 1; a row survives a veto ``v``
    only when every token is at least ``v``× likelier under the trainer). ``criterion`` may list
    several (:func:`resolve_criteria`). ``names``: the knobs as the user spells them (upper, lower,
    veto, criterion)."""
    specs = () if criterion is None or upper is None else resolve_criteria(
        criterion, upper, lower, names=(names[3], names[0], names[1])
    )
    for crit, lo, hi in specs:
        if lo is not None and lo > hi:
            said = f"{names[1]} = {lower!r}" if lower is not None else f"{names[1]} (unset: 1/{names[0]} = {lo:g})"
            raise ValueError(
                f"{said} exceeds {names[0]} = {upper!r}: criterion {crit!r} keeps a token only where "
                f"{names[1]} ≤ ratio ≤ {names[0]}, an empty interval, so every token would be rejected. "
                f"Set {names[0]} > 1 (e.g. 1.001) or an explicit {names[1]} ≤ {names[0]}."
            )
    if veto is not None and veto >= 1.0:
        raise ValueError(
            f"{names[2]} = {veto!r} ≥ 1: a row is dropped when one of its tokens has π_train/π_rollout below it, and "
            f"an on-policy token's ratio is 1, so every row would be rejected. It is meant for catastrophically "
            f"unlikely tokens (e.g. 1e-4)."
        )


def check_on_policy_weight_kept(c_min: float | None, c_max: float | None) -> None:
    """Refuse IcePop bounds [c_min, c_max] that exclude 1: every on-policy token's weight
    (π_train/π_rollout = 1) would be zeroed."""
    if c_min is None:
        return
    hi = DEFAULT_C_MAX if c_max is None else c_max
    if not c_min <= 1.0 <= hi:
        raise ValueError(
            f"c_min = {c_min!r}, c_max = {c_max!r}: weights outside [{c_min:g}, {hi:g}] are zeroed and an on-policy "
            f"token's weight is 1, so every on-policy token would be rejected; the interval must contain 1."
        )


DEFAULT_C_MAX = 2.0


def _check_c_min(inst, attribute, value):
    if value is not None and value > (DEFAULT_C_MAX if inst.c_max is None else inst.c_max):
        raise ValueError(f"c_min = {value!r} must not exceed c_max = {inst.c_max!r}")


@attrs.frozen
class RejectionConfig:
    """Knobs of ``rejection`` (defaults: verl's Geo-RS preset ``decoupled_geo_rs``, whose bounds are
    0.999_1.001; the default ``lower`` is 1/upper, symmetric in log space — set ``lower=0.999`` for
    the preset's exact bounds)."""

    criterion: StrOrStrs = rllab.knob(
        "seq_mean_k1", help="what is thresholded (verl's rollout_rs option); several (comma-separated or a list) "
        "must all pass. One or more of " + ", ".join(CRITERIA), validator=_check_criteria,
    )
    upper: FloatOrFloats = rllab.knob(
        1.001, help="upper threshold (k1: on the ratio scale; k2/k3: on the statistic); one shared by every "
        "criterion or a list with one per criterion",
    )
    lower: FloatOrFloatsOrNone = rllab.knob(
        None, help="k1 only: lower threshold on the ratio scale (None: 1/upper); one shared by the k1 criteria or "
        "a list with one per k1 criterion",
    )
    veto_threshold: float | None = rllab.knob(
        None, help="drop a whole row when one of its tokens has π_train/π_rollout below this (pre-0.9 verl; "
        "None: off)", gt=0.0,
    )
    is_level: str = rllab.knob(
        "none", help="importance weight multiplied into the kept tokens: none, token or sequence",
        choices=("none", "token", "sequence"),
    )
    c_max: float | None = rllab.knob(
        None, help="IS weights above are truncated (or masked with c_min); None: 2.0 (verl's default)", gt=0.0
    )
    c_min: float | None = rllab.knob(
        None, help="with c_min, IS weights outside [c_min, c_max] are zeroed (IcePop) instead of truncated",
        gt=0.0, validator=_check_c_min,
    )
    batch_normalize: bool = rllab.knob(
        False, help="divide the IS weights by their batch mean (verl's rollout_is_batch_normalize)"
    )
    narrow_mask: str = rllab.knob(
        "after_advantage",
        help="rejected tokens leave the rl step's response mask (normaliser, counts, KL, entropy), as in verl: "
        "after_advantage (the estimator sees every sampled token), before_advantage (verl's order), "
        "off (weight 0 only, they stay in the normaliser)",
        choices=NARROW,
    )

    def __attrs_post_init__(self):
        _weight_knobs_need_a_weight(self)
        check_rejects_something_only(self.criterion, self.upper, self.lower, self.veto_threshold)
        check_on_policy_weight_kept(self.c_min, self.c_max)

    @property
    def criteria(self):
        """The resolved criteria, ``((name, lower_ratio | None, upper), ...)``."""
        return resolve_criteria(self.criterion, self.upper, self.lower)


def _weight_knobs_need_a_weight(config) -> None:
    """Refuse c_max / c_min / batch_normalize when ``is_level`` is "none" (they would do nothing)."""
    if config.is_level != "none":
        return
    set_ = {k: getattr(config, k) for k in ("c_max", "c_min") if getattr(config, k) is not None}
    if config.batch_normalize:
        set_["batch_normalize"] = True
    if set_:
        shown = ", ".join(f"{k} = {v!r}" for k, v in set_.items())
        raise ValueError(f"{shown} shape(s) the IS weight, which is_level = 'none' turns off: set is_level 'token' or 'sequence'")


def importance_weights(old, rollout, mask, *, level: str, c_max: float, c_min: float | None, batch_normalize: bool):
    """verl's ``compute_rollout_correction_weights`` on zeroed (B, T) inputs: ``(weights, metrics)``.

    Token level ``exp(clamp(lr_t, ±20))``; sequence level ``exp(clamp(Σ_t lr_t, ±20))``
    broadcast. Truncated at ``c_max`` (``c_min`` None) or zeroed outside [``c_min``, ``c_max``].
    ``batch_normalize`` divides by the mean weight over valid tokens (token level) or over
    non-empty rows (sequence level) when that mean exceeds 1e-8 (metric ``tis/batch_norm_factor``).
    Metric ``tis/frac_truncated`` (``c_min`` None) or ``tis/frac_masked``: the share of valid
    tokens whose raw weight the bound changed.
    """
    log_w = old - rollout
    if level == "sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
    raw = torch.where(mask, torch.exp(torch.clamp(log_w, -SAFETY_BOUND, SAFETY_BOUND)), _zero(log_w))
    if c_min is None:
        weights = raw.clamp(max=c_max)
        changed, what = raw > c_max, "truncated"
    else:
        weights = torch.where((raw >= c_min) & (raw <= c_max), raw, _zero(raw))
        changed, what = (raw < c_min) | (raw > c_max), "masked"
    # the share of weighted tokens the bound changed, as token_truncate / token_mask report it
    metrics = {f"tis/frac_{what}": ops.masked_mean(changed.to(raw.dtype), mask).detach()}
    if batch_normalize:
        if level == "token":
            mean = ops.masked_mean(weights, mask)
        else:
            mean = ops.masked_mean(ops.masked_mean(weights, mask, dim=-1), mask.any(-1))
        scale = torch.where(mean > 1e-8, mean, torch.ones_like(mean))
        weights = weights / scale
        metrics["tis/batch_norm_factor"] = scale.detach()
    return weights, metrics


def _kept(old, rollout, mask, config):
    """(keep (B, T) bool, per-criterion (passes, statistic), vetoed (B,) bool or None) on zeroed inputs."""
    keep, per = _keep(config.criteria, old, rollout, mask)
    vetoed = None
    if config.veto_threshold is not None:
        vetoed = veto_rows(old, rollout, mask, config.veto_threshold)
        keep = keep & ~vetoed[:, None]
    return keep, per, vetoed


def keep_mask(*, old_log_prob, rollout_log_prob, mask, config):
    """(B, T) bool: the valid tokens ``rejection`` keeps (criterion and veto) — verl's
    ``modified_response_mask``, which a training step uses as its response mask."""
    old, rollout = _prepare("importance_correction 'rejection'", old_log_prob, rollout_log_prob, mask)
    return _kept(old, rollout, mask, config)[0]


def narrows_mask(config) -> str | None:
    """When the step narrows its response mask to :func:`keep_mask`: "after_advantage",
    "before_advantage", or None (``narrow_mask = "off"``)."""
    return None if config.narrow_mask == "off" else config.narrow_mask


def rejection(*, old_log_prob, rollout_log_prob, mask, config):
    """Rejection sampling on a divergence criterion (verl's ``rollout_rs``), times an optional IS weight.

    ``keep = rejection_mask(...)`` (B, T); weights ``keep × w`` with ``w`` from ``is_level``
    (1 for "none"). ``old_log_prob``, ``rollout_log_prob`` (B, T) float; ``mask`` (B, T) bool.
    Returns detached (B, T) weights (0 on masked and rejected tokens) and ``tis/…`` metrics.
    """
    old, rollout = _prepare("importance_correction 'rejection'", old_log_prob, rollout_log_prob, mask)
    keep, per, vetoed = _kept(old, rollout, mask, config)
    metrics = {}
    if vetoed is not None:
        metrics["tis/veto_seq_frac"] = ops.masked_mean(vetoed.to(old.dtype), mask.any(-1))
    if config.is_level == "none":
        w = mask.to(old.dtype)
    else:
        w, is_metrics = importance_weights(
            old, rollout, mask, level=config.is_level, c_max=DEFAULT_C_MAX if config.c_max is None else config.c_max,
            c_min=config.c_min,
            batch_normalize=config.batch_normalize,
        )
        metrics.update(is_metrics)
    weights = torch.where(keep, w, _zero(w))
    rows = mask.any(-1)
    metrics.update(
        {
            "tis/mean_weight": ops.masked_mean(weights, mask),
            "tis/rs_masked_frac": ops.masked_mean((~keep).to(old.dtype), mask),
            "tis/rs_seq_masked_frac": ops.masked_mean((mask & ~keep).any(-1).to(old.dtype), rows),
            "tis/rollout_kl": ops.masked_mean(rollout - old, mask),
        }
    )
    if len(per) == 1:
        ((_, stat),) = per.values()
        metrics["tis/rs_stat_mean"] = ops.masked_mean(stat, mask)
    else:
        for name, (passes, stat) in per.items():
            metrics[f"tis/rs_{name}_stat_mean"] = ops.masked_mean(stat, mask)
            metrics[f"tis/rs_{name}_masked_frac"] = ops.masked_mean((~passes).to(old.dtype), mask)
    metrics.update(mismatch_metrics(old, rollout, mask))
    return weights.detach(), {k: v.detach() for k, v in metrics.items()}
