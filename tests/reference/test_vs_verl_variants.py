"""rllab's later variants against verl 0.9.1 on identical inputs: the policy losses ``geo_mean``,
``dppo_tv``, ``dppo_kl``, ``dro``; the rollout-correction rejection sampling, batch
normalisation, bypass mode and off-policy metrics of ``rollout_corr_helper``; the advantage
estimators ``gdpo``, ``optimal_token_baseline`` and ``tir_optimal_token_baseline``.

Values, gradients and the metrics both report must agree to float32 rounding (≤ 1e-5 relative)
over the shapes and masks of :mod:`test_vs_verl` (full, right-padded, with holes, with fully
masked rows). Where rllab's default differs, verl is compared with the knob that reproduces it
and the difference is named in the test. Runs with ``RLLAB_REQUIRE_REFERENCE=1`` in CI.
"""

from __future__ import annotations

import pytest
import torch

from .test_vs_verl import (
    VERL,
    aggregate_fn,
    assert_close,
    ca,
    cases,
    component,
    gen,
    leaf,
    make_index,
    make_mask,
    metric,
)

# =========================================================================== policy losses


def _inputs(B, T, kind, seed, *, spread=0.3, seq_adv=False, extreme=False):
    g = gen(seed, "variants-pg", B, T, kind, spread, seq_adv, extreme)
    mask = make_mask(kind, B, T, g)
    old = -torch.rand(B, T, generator=g) * 3 - 0.01
    log_prob = old + torch.randn(B, T, generator=g) * spread
    if extreme:
        far = torch.rand(B, T, generator=g) < 0.2
        log_prob = torch.where(far, old + torch.sign(torch.randn(B, T, generator=g)) * 25, log_prob)
    adv = torch.randn(B, 1 if seq_adv else T, generator=g).expand(B, T).clone()
    adv[torch.rand(B, T, generator=g) < 0.1] = 0.0
    weights = torch.where(mask, torch.rand(B, T, generator=g) + 0.5, 0.0)
    return log_prob, old, adv, mask, weights


# name -> (rllab knobs, verl loss name, verl ActorConfig fields, metric map rllab -> verl)
LOSSES = {
    "geo_mean": (
        dict(clip_low=0.4, clip_high=0.4, count_empty_rows=True), "geo_mean",
        dict(clip_ratio_low=0.4, clip_ratio_high=0.4),
        {"actor/approx_kl": "actor/ppo_kl", "actor/clipfrac": "actor/pg_clipfrac",
         "actor/clipfrac_lower": "actor/pg_clipfrac_lower"},
    ),
    "geo_mean-asym": (
        dict(clip_low=0.1, clip_high=0.3, count_empty_rows=True, log_ratio_clamp=None), "geo_mean",
        dict(clip_ratio_low=0.1, clip_ratio_high=0.3),
        {"actor/clipfrac": "actor/pg_clipfrac", "actor/clipfrac_lower": "actor/pg_clipfrac_lower"},
    ),
    "dppo_tv": (
        dict(clip_low=0.05, clip_high=0.08, clip_c=3.0), "dppo_tv",
        dict(clip_ratio_low=0.05, clip_ratio_high=0.08, clip_ratio_c=3.0),
        {"actor/approx_kl": "actor/ppo_kl", "actor/clipfrac": "actor/pg_clipfrac",
         "actor/truncfrac": "actor/pg_clipfrac_lower"},
    ),
    "dppo_tv-c20": (
        dict(), "dppo_tv", dict(clip_ratio_c=20.0),
        {"actor/approx_kl": "actor/ppo_kl", "actor/clipfrac": "actor/pg_clipfrac",
         "actor/truncfrac": "actor/pg_clipfrac_lower"},
    ),
    # an unmodified verl ActorConfig (clip_ratio 0.2, clip_ratio_c 3.0) is rllab's dppo_tv at clip_c=3
    "dppo_tv-verl_defaults": (
        dict(clip_c=3.0), "dppo_tv", dict(),
        {"actor/approx_kl": "actor/ppo_kl", "actor/clipfrac": "actor/pg_clipfrac",
         "actor/truncfrac": "actor/pg_clipfrac_lower"},
    ),
    "dppo_kl": (
        dict(clip_low=0.02, clip_high=0.03, clip_c=3.0), "dppo_kl",
        dict(clip_ratio_low=0.02, clip_ratio_high=0.03, clip_ratio_c=3.0),
        {"actor/approx_kl": "actor/ppo_kl", "actor/clipfrac": "actor/pg_clipfrac",
         "actor/truncfrac": "actor/pg_clipfrac_lower"},
    ),
    "dppo_kl-c20": (
        dict(), "dppo_kl", dict(clip_ratio_c=20.0),
        {"actor/approx_kl": "actor/ppo_kl", "actor/clipfrac": "actor/pg_clipfrac",
         "actor/truncfrac": "actor/pg_clipfrac_lower"},
    ),
    "dro": (dict(beta=0.5), "dro", dict(policy_loss=dict(dro_beta=0.5)), {"actor/approx_kl": "actor/ppo_kl"}),
    "dro-small": (dict(beta=0.01), "dro", dict(policy_loss=dict(dro_beta=0.01)), {"actor/approx_kl": "actor/ppo_kl"}),
}


def _run(variant, log_prob, old, adv, mask, weights, mode):
    knobs, verl_name, verl_cfg, _ = LOSSES[variant]
    loss_fn = component("policy_loss", variant.split("-")[0], **knobs)
    lp_ours, lp_ref = leaf(log_prob), leaf(log_prob)
    loss, metrics = loss_fn(
        log_prob=lp_ours, old_log_prob=old, advantages=adv, mask=mask, aggregate=aggregate_fn(mode), weights=weights
    )
    ref_loss, ref_metrics = ca.get_policy_loss_fn(verl_name)(
        old, lp_ref, adv, mask.float(), mode, VERL.actor_config(**verl_cfg), weights
    )
    assert_close(loss, ref_loss, f"{variant} loss")
    loss.backward()
    ref_loss.backward()
    assert_close(lp_ours.grad, lp_ref.grad, f"{variant} gradient")
    for ours_key, ref_key in LOSSES[variant][3].items():
        assert_close(metric(metrics, ours_key), ref_metrics[ref_key], f"{variant} {ours_key}")


# geo_mean ignores the aggregation mode (test_geo_mean_ignores_aggregation): one mode is enough
_MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize(
    "variant, mode",
    [(v, m) for v in LOSSES for m in _MODES if not (v.startswith("geo_mean") and m != "token-mean")],
)
def test_policy_loss_matches_verl(variant, mode):
    """Every shape and mask kind; importance weights on every other case."""
    for i, (cid, B, T, kind, seed) in enumerate(cases(seeds=(0, 1))):
        seq_adv = variant.startswith("geo_mean")
        log_prob, old, adv, mask, weights = _inputs(B, T, kind, seed, spread=0.3, seq_adv=seq_adv)
        try:
            _run(variant, log_prob, old, adv, mask, weights if i % 2 else None, mode)
        except AssertionError as e:
            raise AssertionError(f"{cid} ({mode}{', weights' if i % 2 else ''}): {e}") from None


@pytest.mark.parametrize("variant", ["geo_mean-asym", "dppo_tv", "dppo_kl", "dro"])
def test_policy_loss_wide_ratios_match_verl(variant):
    """Log-ratios spread over ±1.5: most tokens leave the trust region or get truncated."""
    for cid, B, T, kind, seed in cases(seeds=(0,)):
        log_prob, old, adv, mask, weights = _inputs(B, T, kind, seed, spread=1.5)
        try:
            _run(variant, log_prob, old, adv, mask, weights, "token-mean")
        except AssertionError as e:
            raise AssertionError(f"{cid}: {e}") from None


def test_geo_mean_default_leaves_empty_rows_out():
    """rllab's default mean is over non-empty rows; verl's torch.mean counts every row."""
    B, T = 6, 9
    log_prob, old, adv, mask, _ = _inputs(B, T, "empty_rows", 3, seq_adv=True)
    assert (~mask.any(-1)).any()
    ours, _ = component("policy_loss", "geo_mean")(
        log_prob=log_prob, old_log_prob=old, advantages=adv, mask=mask, aggregate=None
    )
    ref, _ = ca.get_policy_loss_fn("geo_mean")(
        old, log_prob, adv, mask.float(), "token-mean", VERL.actor_config(clip_ratio_low=0.4, clip_ratio_high=0.4)
    )
    rows = mask.any(-1).sum()
    assert_close(ours, ref * B / rows, "geo_mean over non-empty rows = verl × B / S")


def test_geo_mean_clamp_keeps_extreme_rows_finite():
    """A token with A < 0 whose log-ratio rose by 200 nats: verl's unclamped ρ overflows (inf loss);
    rllab's default clamps log r at 20 and stays finite; log_ratio_clamp=None is verl's."""
    old = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    log_prob = old + torch.tensor([[0.1, 0.1], [200.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    ours, _ = component("policy_loss", "geo_mean")(
        log_prob=log_prob, old_log_prob=old, advantages=adv, mask=mask, aggregate=None
    )
    assert torch.isfinite(ours)
    unclamped, _ = component("policy_loss", "geo_mean", log_ratio_clamp=None)(
        log_prob=log_prob, old_log_prob=old, advantages=adv, mask=mask, aggregate=None
    )
    ref, _ = ca.get_policy_loss_fn("geo_mean")(
        old, log_prob, adv, mask.float(), "token-mean", VERL.actor_config(clip_ratio_low=0.4, clip_ratio_high=0.4)
    )
    assert torch.isinf(ref) and torch.isinf(unclamped)
    # row 1: ρ = exp((20 + 0)/2) with the clamp: loss = (−exp(0.1)·1 + exp(10)) / 2
    assert_close(ours, (-torch.exp(torch.tensor(0.1)) + torch.exp(torch.tensor(10.0))) / 2, "clamped geo_mean")


def test_geo_mean_ignores_aggregation():
    log_prob, old, adv, mask, _ = _inputs(6, 9, "holes", 0, seq_adv=True)
    fn = component("policy_loss", "geo_mean")
    losses = [
        fn(log_prob=log_prob, old_log_prob=old, advantages=adv, mask=mask, aggregate=aggregate_fn(mode))[0]
        for mode in ("token-mean", "token-sum", "seq-mean-token-mean")
    ]
    assert losses[0] == losses[1] == losses[2]


@pytest.mark.parametrize("variant", ["dppo_tv", "dppo_kl", "dro"])
def test_policy_loss_extreme_ratios_match_verl(variant):
    """Log-ratios of ±25 nats, beyond the ±20 clamp both apply (dro clamps none, like verl)."""
    for cid, B, T, kind, seed in cases(seeds=(0,)):
        log_prob, old, adv, mask, weights = _inputs(B, T, kind, seed, extreme=True)
        try:
            _run(variant, log_prob, old, adv, mask, weights, "token-mean")
        except AssertionError as e:
            raise AssertionError(f"{cid}: {e}") from None


# =========================================================================== rollout corrections

RC = VERL.rollout_corr


class _TensorDict:
    """Stands in for verl's ``DataProto`` (stubbed by the loader): ``from_dict(tensors=...).batch``."""

    def __init__(self, tensors):
        self.batch = tensors

    @classmethod
    def from_dict(cls, tensors):
        return cls(tensors)


@pytest.fixture(autouse=True)
def _data_proto(monkeypatch):
    monkeypatch.setattr(RC, "DataProto", _TensorDict)
RS_CRITERIA = [
    ("token_k1", 2.0, 0.6), ("token_k2", 0.05, None), ("token_k3", 0.05, None),
    ("seq_sum_k1", 1.5, None), ("seq_sum_k2", 0.3, None), ("seq_sum_k3", 0.3, None),
    ("seq_mean_k1", 1.05, 0.97), ("seq_mean_k2", 0.02, None), ("seq_mean_k3", 0.02, None),
    ("seq_max_k2", 0.1, None), ("seq_max_k3", 0.1, None),
]


def _rs_spec(upper, lower):
    return f"{lower}_{upper}" if lower is not None else upper


def _ic_inputs(B, T, kind, seed, spread=0.3):
    g = gen(seed, "variants-ic", B, T, kind, spread)
    mask = make_mask(kind, B, T, g)
    old = -torch.rand(B, T, generator=g) * 4
    rollout = old + torch.randn(B, T, generator=g) * spread
    return old, rollout, mask


@pytest.mark.parametrize("criterion, upper, lower", RS_CRITERIA)
def test_rejection_mask_matches_verl(criterion, upper, lower):
    from rllab_corrections.rejection import rejection_mask

    kept_any = rejected_any = False
    for cid, B, T, kind, seed in cases(seeds=(0, 1)):
        old, rollout, mask = _ic_inputs(B, T, kind, seed)
        keep = rejection_mask(
            old_log_prob=old, rollout_log_prob=rollout, mask=mask, criterion=criterion, upper=upper, lower=lower
        )
        ref_mask, ref_metrics = RC.compute_rollout_rejection_mask(
            log_ratio=old - rollout, response_mask=mask.float(), rollout_rs=criterion,
            rollout_rs_threshold=_rs_spec(upper, lower),
        )
        assert torch.equal(keep, ref_mask.bool()), f"{criterion} {cid}: keep mask differs"
        kept_any |= bool(keep.any())
        rejected_any |= bool((mask & ~keep).any())
        corr = component("importance_correction", "rejection", criterion=criterion, upper=upper, lower=lower)
        weights, metrics = corr(old_log_prob=old, rollout_log_prob=rollout, mask=mask)
        assert_close(weights, ref_mask, f"{criterion} {cid} weights (is_level none)")
        assert_close(metric(metrics, "tis/rs_masked_frac"), ref_metrics["rollout_rs_masked_fraction"], f"{criterion} {cid} frac")
        assert_close(metric(metrics, "tis/rs_stat_mean"), ref_metrics[f"rollout_rs_{criterion}_mean"], f"{criterion} {cid} stat")
        if mask.any(-1).all():  # verl's sequence share is over all rows, rllab's over non-empty ones
            assert_close(
                metric(metrics, "tis/rs_seq_masked_frac"), ref_metrics["rollout_rs_seq_masked_fraction"], f"{criterion} {cid}"
            )
    assert kept_any and rejected_any, f"{criterion}: thresholds must keep some tokens and reject others"


# several criteria (verl's comma-separated rollout_rs): rllab knobs, verl's rollout_rs_threshold
RS_SEVERAL = [
    (dict(criterion="token_k1,seq_max_k3", upper=[1.5, 0.1], lower=0.7), "0.7_1.5,0.1"),
    (dict(criterion=["seq_mean_k1", "token_k2"], upper=[1.05, 0.05]), f"{1 / 1.05}_1.05,0.05"),
    (dict(criterion="token_k1, seq_sum_k1, seq_mean_k3", upper=[2.0, 1.5, 0.02], lower=[0.6, 0.5]),
     "0.6_2.0,0.5_1.5,0.02"),
    (dict(criterion="seq_sum_k2,token_k3", upper=0.3), "0.3"),  # one threshold shared by every criterion
]


@pytest.mark.parametrize("knobs, threshold", RS_SEVERAL, ids=[k["criterion"] if isinstance(k["criterion"], str)
                                                              else ",".join(k["criterion"]) for k, _ in RS_SEVERAL])
def test_several_rejection_criteria_match_verl(knobs, threshold):
    """A token is kept where it passes every listed criterion: verl's combined mask, its total and
    per-criterion rejected shares and statistic means."""
    from rllab_corrections.rejection import criteria, rejection_mask

    names = criteria(knobs["criterion"])
    corr = component("importance_correction", "rejection", **knobs)
    kept_any = rejected_any = False
    rejects = dict.fromkeys(names, 0.0)
    for cid, B, T, kind, seed in cases(seeds=(0, 1)):
        old, rollout, mask = _ic_inputs(B, T, kind, seed)
        keep = rejection_mask(old_log_prob=old, rollout_log_prob=rollout, mask=mask, **knobs)
        ref_mask, ref_metrics = RC.compute_rollout_rejection_mask(
            log_ratio=old - rollout, response_mask=mask.float(), rollout_rs=",".join(names),
            rollout_rs_threshold=threshold,
        )
        assert torch.equal(keep, ref_mask.bool()), f"{names} {cid}: keep mask differs"
        kept_any |= bool(keep.any())
        rejected_any |= bool((mask & ~keep).any())
        weights, metrics = corr(old_log_prob=old, rollout_log_prob=rollout, mask=mask)
        assert_close(weights, ref_mask, f"{names} {cid} weights")
        assert_close(metric(metrics, "tis/rs_masked_frac"), ref_metrics["rollout_rs_masked_fraction"], f"{cid} frac")
        for name in names:
            assert_close(metric(metrics, f"tis/rs_{name}_stat_mean"), ref_metrics[f"rollout_rs_{name}_mean"], f"{name} {cid}")
            assert_close(metric(metrics, f"tis/rs_{name}_masked_frac"),
                         ref_metrics[f"rollout_rs_{name}_masked_fraction"], f"{name} {cid} frac")
            rejects[name] += float(metrics[f"tis/rs_{name}_masked_frac"])
    assert kept_any and rejected_any, f"{names}: thresholds must keep some tokens and reject others"
    assert all(rejects.values()), f"every criterion must reject somewhere for the AND to be exercised: {rejects}"


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("icepop", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_rejection_with_is_weights_matches_verl(level, icepop, normalize):
    """verl's full pipeline: IS weights × the rejection mask (Geo-RS, seq_mean_k1)."""
    threshold = "0.5_2.0" if icepop else 2.0
    corr = component(
        "importance_correction", "rejection", criterion="seq_mean_k1", upper=1.1, lower=0.9, is_level=level,
        c_max=2.0, c_min=0.5 if icepop else None, batch_normalize=normalize,
    )
    for cid, B, T, kind, seed in cases(seeds=(0, 1)):
        old, rollout, mask = _ic_inputs(B, T, kind, seed, spread=0.15 if level == "sequence" else 0.4)
        weights, metrics = corr(old_log_prob=old, rollout_log_prob=rollout, mask=mask)
        try:
            proto, ref_mask, ref_metrics = RC.compute_rollout_correction_and_rejection_mask(
                old_log_prob=old, rollout_log_prob=rollout, response_mask=mask.float(), rollout_is=level,
                rollout_is_threshold=threshold, rollout_is_batch_normalize=normalize, rollout_rs="seq_mean_k1",
                rollout_rs_threshold="0.9_1.1",
            )
        except ZeroDivisionError:  # verl's ESS metric when IcePop zeroes every weight
            continue
        ref = proto.batch["rollout_is_weights"] * ref_mask
        assert_close(weights, ref, f"{level} icepop={icepop} normalize={normalize} {cid}")
        if normalize:
            assert_close(
                metric(metrics, "tis/batch_norm_factor"), ref_metrics["rollout_corr/rollout_is_batch_norm_factor"], cid
            )


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_batch_normalize_matches_verl(mode):
    level = mode.split("_")[0]
    masked = mode.endswith("mask")
    corr = component("importance_correction", mode, c_max=2.0, c_min=0.5 if masked else None, batch_normalize=True)
    for cid, B, T, kind, seed in cases(seeds=(0, 1)):
        old, rollout, mask = _ic_inputs(B, T, kind, seed, spread=0.15 if level == "sequence" else 0.5)
        weights, metrics = corr(old_log_prob=old, rollout_log_prob=rollout, mask=mask)
        try:
            ref, ref_metrics = RC.compute_rollout_correction_weights(
                log_ratio=old - rollout, response_mask=mask.float(), rollout_is=level,
                rollout_is_threshold="0.5_2.0" if masked else 2.0, rollout_is_batch_normalize=True,
            )
        except ZeroDivisionError:
            continue
        assert_close(weights, ref, f"{mode} {cid}")
        assert_close(metric(metrics, "tis/batch_norm_factor"), ref_metrics["rollout_is_batch_norm_factor"], cid)


def test_mismatch_metrics_match_verl():
    corr = component("importance_correction", "rejection", criterion="token_k2", upper=100.0, lower=None)
    for cid, B, T, kind, seed in cases(seeds=(0, 1)):
        old, rollout, mask = _ic_inputs(B, T, kind, seed)
        _, metrics = corr(old_log_prob=old, rollout_log_prob=rollout, mask=mask)
        _, _, ref = RC.compute_rollout_correction_and_rejection_mask(
            old_log_prob=old, rollout_log_prob=rollout, response_mask=mask.float(), rollout_is=None,
            rollout_rs=",".join(c for c, _, _ in RS_CRITERIA), rollout_rs_threshold="100",
        )
        for n in ("k1", "k2", "k3"):
            assert_close(metric(metrics, f"tis/{n}_token"), ref[f"rollout_corr/rollout_rs_token_{n}_mean"], f"{n} {cid}")
            for kind_ in ("sum", "mean") + (("max",) if n != "k1" else ()):
                assert_close(
                    metric(metrics, f"tis/{n}_seq_{kind_}"), ref[f"rollout_corr/rollout_rs_seq_{kind_}_{n}_seq_mean"],
                    f"{n} seq_{kind_} {cid}",
                )
        assert_close(metric(metrics, "tis/k1_token"), ref["rollout_corr/kl"], f"kl {cid}")
        assert_close(metric(metrics, "tis/k3_token"), ref["rollout_corr/k3_kl"], f"k3_kl {cid}")
        assert_close(metric(metrics, "tis/chi2_token"), ref["rollout_corr/chi2_token"], f"chi2_token {cid}")
        if mask.any(-1).all():
            assert_close(metric(metrics, "tis/chi2_seq"), ref["rollout_corr/chi2_seq"], f"chi2_seq {cid}")


BYPASS = {
    "ppo_clip": (dict(), dict(loss_type="ppo_clip", rollout_is=None)),
    "ppo_clip-geo_rs": (
        dict(rs_criterion="seq_mean_k1", rs_upper=1.05, rs_lower=0.95),
        dict(loss_type="ppo_clip", rollout_is=None, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.95_1.05"),
    ),
    "reinforce": (dict(loss_type="reinforce"), dict(loss_type="reinforce", rollout_is=None)),
    "reinforce-seq_tis": (
        dict(loss_type="reinforce", is_level="sequence"), dict(loss_type="reinforce", rollout_is="sequence"),
    ),
    "reinforce-token_tis-k3_rs": (
        dict(loss_type="reinforce", is_level="token", rs_criterion="seq_max_k3", rs_upper=0.05),
        dict(loss_type="reinforce", rollout_is="token", rollout_rs="seq_max_k3", rollout_rs_threshold=0.05),
    ),
    "reinforce-icepop-normalized": (
        dict(loss_type="reinforce", is_level="token", c_min=0.5, batch_normalize=True),
        dict(loss_type="reinforce", rollout_is="token", rollout_is_threshold="0.5_2.0", rollout_is_batch_normalize=True),
    ),
}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("variant", list(BYPASS))
def test_bypass_mode_matches_verl(variant, mode, monkeypatch):
    # verl's bypass loss imports rollout_corr_helper when called; serve the loaded module (the
    # loader keeps no verl package in sys.modules, and the real one would import Ray)
    import sys
    import types

    for name in ("verl", "verl.trainer", "verl.trainer.ppo"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo.rollout_corr_helper", RC)
    knobs, rc = BYPASS[variant]
    fn = component("policy_loss", "bypass_mode", **knobs)
    cfg = VERL.actor_config(policy_loss=dict(rollout_correction=RC.RolloutCorrectionConfig(**rc)))
    for cid, B, T, kind, seed in cases(seeds=(0,)):
        log_prob, rollout, adv, mask, _ = _inputs(B, T, kind, seed, spread=0.2)
        lp, lp_ref = leaf(log_prob), leaf(log_prob)
        loss, metrics = fn(log_prob=lp, old_log_prob=rollout, advantages=adv, mask=mask, aggregate=aggregate_fn(mode))
        try:
            ref_loss, ref_metrics = ca.get_policy_loss_fn("bypass_mode")(rollout, lp_ref, adv, mask.float(), mode, cfg)
        except ZeroDivisionError:
            continue
        what = f"bypass {variant} ({mode}) {cid}"
        if torch.isnan(ref_loss):  # every token rejected: verl divides 0 by 0, rllab aggregates to 0
            assert float(loss.detach()) == 0.0, what
            continue
        assert_close(loss, ref_loss, f"{what} loss")
        loss.backward()
        ref_loss.backward()
        assert_close(lp.grad, lp_ref.grad, f"{what} gradient")
        assert_close(metric(metrics, "actor/approx_kl"), ref_metrics["actor/ppo_kl"], f"{what} approx_kl")
        if variant.startswith("ppo_clip"):
            assert_close(metric(metrics, "actor/clipfrac"), ref_metrics["actor/pg_clipfrac"], f"{what} clipfrac")


# =========================================================================== advantage estimators

LAYOUTS = ["groups", "mixed", "singletons"]


def _adv_case(B, T, kind, seed, layout, K=0):
    g = gen(seed, "variants-adv", B, T, kind, layout, K)
    mask = make_mask(kind, B, T, g)
    index = make_index(layout, B, g)
    rewards = torch.where(torch.rand(B, T, generator=g) < 0.3, torch.randn(B, T, generator=g), 0.0)
    rewards = torch.where(mask, rewards, 0.0)
    old = -torch.rand(B, T, generator=g) * 3 - 0.01
    pi = torch.exp(old)
    sps = pi**2 + torch.rand(B, T, generator=g) * (1 - pi**2)
    comps = torch.randn(B, K, generator=g) if K else None
    rho = torch.rand(B, T, generator=g) + 0.5
    return rewards, mask, index, old, sps, comps, rho


def _adv_check(what, ours, ref, mask):
    assert_close(torch.where(mask, ours, 0.0), torch.where(mask, ref, 0.0), what)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("norm", [True, False])
def test_gdpo_single_component_matches_verl(layout, norm):
    fn = component("advantage_estimator", "gdpo", norm_by_std=norm, mask_scores=False)
    for cid, B, T, kind, seed in cases(seeds=(0, 1)):
        rewards, mask, index, *_ = _adv_case(B, T, kind, seed, layout)
        if mask.sum() < 2:
            continue  # verl's masked_whiten raises with fewer than two valid tokens
        adv, ret = fn(token_rewards=rewards, mask=mask, index=index)
        ref, _ = ca.compute_gdpo_outcome_advantage(
            rewards, mask.float(), index.numpy(), epsilon=1e-6, norm_adv_by_std_in_grpo=norm
        )
        _adv_check(f"gdpo {layout} {cid}", adv, ref, mask)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("weights", [None, (1.0, 0.5, 2.0)])
def test_gdpo_components_match_verl(layout, weights):
    """verl reads the components from the batch by key and places them on the last response token."""
    fn = component("advantage_estimator", "gdpo", mask_scores=False, reward_weights=weights)
    for cid, B, T, kind, seed in cases(seeds=(0,)):
        if kind in ("holes", "empty_rows"):
            continue  # verl places a component at attention-length − 1: right padding only
        rewards, mask, index, _, _, comps, _ = _adv_case(B, T, kind, seed, layout, K=3)
        if mask.sum() < 2:
            continue
        adv, _ = fn(token_rewards=rewards, mask=mask, index=index, reward_components=comps)
        cfg = {"gdpo_reward_keys": ["a", "b", "c"], "gdpo_reward_weights": list(weights) if weights else None}
        batch = {"prompts": torch.zeros(B, 2), "attention_mask": torch.cat([torch.ones(B, 2, dtype=torch.long), mask.long()], dim=1)}
        non_tensor = {k: comps[:, i].numpy() for i, k in enumerate("abc")}
        ref, _ = ca.compute_gdpo_outcome_advantage(
            rewards, mask.float(), index.numpy(), config=cfg, non_tensor_batch=non_tensor, batch=batch
        )
        _adv_check(f"gdpo components {layout} {cid}", adv, ref, mask)


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
@pytest.mark.parametrize("layout", ["groups", "mixed"])
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("with_is", [False, True])
def test_optimal_token_baselines_match_verl(name, layout, zero_tail, with_is):
    tir = name.startswith("tir")
    knobs = dict(handle_zero_tail=zero_tail) if tir else dict(handle_zero_tail=zero_tail, count_empty_rows=True)
    fn = component("advantage_estimator", name, **knobs)
    verl_fn = (
        ca.compute_multi_turn_optimal_token_baseline_advantage if tir else ca.compute_optimal_token_baseline_advantage
    )
    for cid, B, T, kind, seed in cases(seeds=(0, 1)):
        rewards, mask, index, old, sps, _, rho = _adv_case(B, T, kind, seed, layout)
        adv, ret = fn(
            token_rewards=rewards, mask=mask, index=index, old_log_prob=old, sum_pi_squared=sps,
            weights=rho if with_is else None,
        )
        ref_adv, ref_ret = verl_fn(
            rewards, mask.float(), index.numpy(), old_log_probs=old, sum_pi_squared=sps,
            rollout_is_weights=rho if with_is else None, handle_zero_tail=zero_tail,
        )
        _adv_check(f"{name} {layout} {cid} advantages", adv, ref_adv, mask)
        _adv_check(f"{name} {layout} {cid} returns", ret, ref_ret, mask)


def test_optimal_token_baseline_default_leaves_empty_rows_out():
    """A group of one real row plus an empty row: verl computes a baseline (N = 2) — the row's own
    reward-to-go, so A = 0 — rllab treats the row as a group of one (A = G). (With the zero tail on
    both agree: the lone row is also the unique longest.)"""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [False, False]])
    index = torch.tensor([0, 0])
    old = torch.full((2, 2), -1.0)
    sps = torch.full((2, 2), 0.5)
    ours, _ = component("advantage_estimator", "optimal_token_baseline", handle_zero_tail=False)(
        token_rewards=rewards, mask=mask, index=index, old_log_prob=old, sum_pi_squared=sps
    )
    ref, _ = ca.compute_optimal_token_baseline_advantage(
        rewards, mask.float(), index.numpy(), old, sps, handle_zero_tail=False
    )
    assert_close(ours[0], torch.tensor([1.0, 1.0]), "singleton: advantage = reward-to-go")
    assert_close(ref[0], torch.tensor([0.0, 0.0]), "verl: the empty row makes a group of two")


# =========================================================================== remax


@pytest.mark.parametrize("cid,B,T,kind,seed", list(cases()))
def test_remax_matches_verl(cid, B, T, kind, seed):
    g = gen(seed, "remax", B, T, kind)
    mask = make_mask(kind, B, T, g)
    rewards = torch.where(mask, torch.randn(B, T, generator=g), 0.0)  # process rewards on every valid token
    baselines = torch.rand(B, generator=g)
    adv, ret = component("advantage_estimator", "remax")(token_rewards=rewards, mask=mask, index=None, reward_baselines=baselines)
    ref_adv, ref_ret = ca.compute_remax_outcome_advantage(token_level_rewards=rewards, reward_baselines=baselines, response_mask=mask.float())
    # valid positions agree; rllab zeroes masked positions (verl keeps reward-to-go at observation tokens)
    assert_close(adv[mask], ref_adv[mask], f"remax advantages {cid}")
    assert_close(ret[mask], ref_ret[mask], f"remax returns {cid}")
    assert torch.all(adv[~mask] == 0) and torch.all(ret[~mask] == 0)
