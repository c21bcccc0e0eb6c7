"""rllab_corrections.rejection and rllab_corrections.bypass: hand-computed rejection masks, weights and losses.

lr = old_log_prob − rollout_log_prob (log π_train/π_rollout); k1 = −lr, k2 = ½lr², k3 = e^lr − 1 − lr.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rllab
from rllab import ops
from rllab_corrections.rejection import rejection_mask

LAB = rllab.Lab()


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def close(a, b, tol=1e-12):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               rtol=tol, atol=tol)


def keep(lr, criterion, upper, lower=None, mask=None):
    rollout = torch.full_like(lr, -2.0)
    mask = torch.ones(lr.shape, dtype=torch.bool) if mask is None else mask
    return rejection_mask(old_log_prob=rollout + lr, rollout_log_prob=rollout, mask=mask, criterion=criterion,
                          upper=upper, lower=lower).tolist()


def test_token_k1_bounds_are_on_the_ratio_scale_with_default_lower():
    # k1 = [−0.1, 1.0, −0.5, 0.8]; bounds [log ½, log 2] = [−0.693, 0.693] (lower = 1/upper)
    assert keep(t([[0.1, -1.0, 0.5, -0.8]]), "token_k1", 2.0) == [[True, False, True, False]]
    # explicit lower 0.9: [−0.105, 0.693] → −0.5 now fails
    assert keep(t([[0.1, -1.0, 0.5, -0.8]]), "token_k1", 2.0, 0.9) == [[True, False, False, False]]


def test_geometric_mean_rejection_drops_whole_rows():
    # seq_mean_k1: row 0 mean k1 = −0.2 < log 0.9 = −0.105 → rejected; row 1 mean 0 → kept;
    # row 2's masked token (lr 5) is not part of its mean (−0.05) → kept
    lr = t([[0.1, 0.3], [0.05, -0.05], [0.05, 5.0]])
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    assert keep(lr, "seq_mean_k1", 1.1, 0.9, mask) == [[False, False], [True, True], [True, False]]


def test_sequence_sum_and_max_criteria():
    # seq_max_k2, upper 0.1: row 0 max ½·0.5² = 0.125 → vetoed; row 1 max ½·0.2² = 0.02 → kept
    lr = t([[0.1, 0.5], [0.1, 0.2]])
    assert keep(lr, "seq_max_k2", 0.1) == [[False, False], [True, True]]
    # seq_sum_k3, upper 0.02: row 0 Σ = (e^.1 − 1.1) + (e^.5 − 1.5) = 0.00517 + 0.14872 → rejected;
    # row 1 Σ = 0.00517 + 0.02140 = 0.02657 → rejected at 0.02, kept at 0.03
    k3 = lambda x: math.exp(x) - 1 - x  # noqa: E731
    assert k3(0.1) + k3(0.2) == pytest.approx(0.026574, abs=1e-6)
    assert keep(lr, "seq_sum_k3", 0.02) == [[False, False], [False, False]]
    assert keep(lr, "seq_sum_k3", 0.03) == [[False, False], [True, True]]


def test_rejection_correction_times_token_weights():
    # is_level token, c_max 2: w = min(e^lr, 2); token_k2 upper 0.1 rejects |lr| > √0.2 = 0.447
    lr = t([[0.1, 0.9, -0.3]])
    rollout = torch.full_like(lr, -2.0)
    corr = LAB.get("importance_correction", "rejection", criterion="token_k2", upper=0.1, is_level="token")
    w, m = corr(old_log_prob=rollout + lr, rollout_log_prob=rollout, mask=torch.ones(1, 3, dtype=torch.bool))
    close(w, [[math.exp(0.1), 0.0, math.exp(-0.3)]])
    close(m["tis/rs_masked_frac"], 1 / 3)
    close(m["tis/k2_token"], (0.01 + 0.81 + 0.09) / 2 / 3)
    close(m["tis/frac_truncated"], 1 / 3)  # e^0.9 > c_max = 2 (rejected as well)


def test_rejection_reports_the_share_of_weights_its_bound_changed():
    # c_min 0.8, c_max 2: e^0.1 kept, e^0.9 = 2.46 and e^-0.3 = 0.74 leave the band; the last token is padding
    lr = t([[0.1, 0.9, -0.3, 5.0]])
    rollout = torch.full_like(lr, -2.0)
    mask = torch.tensor([[True, True, True, False]])
    corr = LAB.get("importance_correction", "rejection", criterion="token_k2", upper=10.0, is_level="token", c_min=0.8)
    w, m = corr(old_log_prob=rollout + lr, rollout_log_prob=rollout, mask=mask)
    close(w, [[math.exp(0.1), 0.0, 0.0, 0.0]])
    close(m["tis/frac_masked"], 2 / 3)
    assert "tis/frac_truncated" not in m


def test_batch_normalize_makes_the_mean_weight_one():
    # token_truncate: w = [e^0.1, 2 (truncated e^0.9), e^−0.3] → divided by their mean
    lr = t([[0.1, 0.9, -0.3]])
    rollout = torch.full_like(lr, -2.0)
    w_raw = [math.exp(0.1), 2.0, math.exp(-0.3)]
    mean = sum(w_raw) / 3
    corr = LAB.get("importance_correction", "token_truncate", batch_normalize=True)
    w, m = corr(old_log_prob=rollout + lr, rollout_log_prob=rollout, mask=torch.ones(1, 3, dtype=torch.bool))
    close(w, [[x / mean for x in w_raw]])
    close(m["tis/batch_norm_factor"], mean)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=6, max_size=6), st.sampled_from(["token_truncate", "sequence_truncate",
                                                                            "token_mask", "sequence_mask"]))
def test_batch_normalized_weights_average_one(lrs, mode):
    lr = t(lrs).view(2, 3)
    rollout = torch.full_like(lr, -2.0)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    knobs = {"c_min": 0.2, "c_max": 5.0} if mode.endswith("mask") else {}
    w, _ = LAB.get("importance_correction", mode, batch_normalize=True, **knobs)(
        old_log_prob=rollout + lr, rollout_log_prob=rollout, mask=mask
    )
    level_mean = ops.masked_mean(w, mask) if mode.startswith("token") else ops.masked_mean(w, mask, dim=-1).mean()
    if float(ops.masked_mean(w, mask)) > 0:
        close(level_mean, 1.0, tol=1e-9)


def test_rejection_config_refuses_knobs_that_cannot_apply():
    with pytest.raises(rllab.ConfigError, match="lower"):
        LAB.get("importance_correction", "rejection", criterion="seq_max_k3", upper=0.1, lower=0.5)
    with pytest.raises(rllab.ConfigError, match="rs_upper"):
        LAB.get("policy_loss", "bypass_mode", rs_criterion="token_k3")
    with pytest.raises(rllab.ConfigError, match="reinforce"):
        LAB.get("policy_loss", "bypass_mode", is_level="token")


# --------------------------------------------------------------------------- bypass mode


def _bypass(lr, adv, mask=None, **knobs):
    rollout = torch.full_like(lr, -2.0)
    lp = (rollout + lr).clone().requires_grad_(True)
    mask = torch.ones(lr.shape, dtype=torch.bool) if mask is None else mask
    loss, m = LAB.get("policy_loss", "bypass_mode", **knobs)(
        log_prob=lp, old_log_prob=rollout, advantages=adv, mask=mask, aggregate=ops.masked_mean
    )
    loss.backward()
    return loss.detach(), m, lp.grad


def test_bypass_reinforce_with_token_weights_over_kept_tokens():
    # lr = [0.1, 0.9, −0.3], A = [1, 2, −1]; token_k2 upper 0.1 rejects the middle token, which
    # also leaves the normaliser: loss = −(1·e^0.1·(−1.9) + (−1)·e^−0.3·(−2.3)) / 2
    lr, adv = t([[0.1, 0.9, -0.3]]), t([[1.0, 2.0, -1.0]])
    loss, m, grad = _bypass(lr, adv, loss_type="reinforce", is_level="token", rs_criterion="token_k2", rs_upper=0.1)
    close(loss, -(math.exp(0.1) * -1.9 + -math.exp(-0.3) * -2.3) / 2)
    close(grad, [[-math.exp(0.1) / 2, 0.0, math.exp(-0.3) / 2]])
    close(m["tis/rs_masked_frac"], 1 / 3)


def test_bypass_ppo_clip_is_dual_clip_on_the_rollout_ratio():
    # r = e^lr: [e^0.1, e^0.5, e^2]; A = [1, 1, −1]: clip(e^0.5) = 1.2 → −1.2; A < 0 and r = e^2 > 3?
    # e^2 = 7.39: max(7.39, 1.2) = 7.39 capped at c = 3 → 3. loss = (−e^0.1 − 1.2 + 3) / 3
    lr, adv = t([[0.1, 0.5, 2.0]]), t([[1.0, 1.0, -1.0]])
    loss, m, grad = _bypass(lr, adv)
    close(loss, (-math.exp(0.1) - 1.2 + 3.0) / 3)
    close(grad, [[-math.exp(0.1) / 3, 0.0, 0.0]])
    close(m["actor/clipfrac_lower"], 1 / 3)


def test_weight_knobs_need_a_weight():
    with pytest.raises(rllab.ConfigError, match="is_level"):
        LAB.get("importance_correction", "rejection", c_max=3.0)
    with pytest.raises(rllab.ConfigError, match="is_level"):
        LAB.get("policy_loss", "bypass_mode", loss_type="reinforce", batch_normalize=True)
    with pytest.raises(rllab.ConfigError, match="ppo_clip"):
        LAB.get("policy_loss", "bypass_mode", loss_type="reinforce", clip_c=5.0)
    # c_max takes effect once there is a weight: e^0.9 truncated at 1.5 instead of 2
    lr = t([[0.9]])
    rollout = torch.full_like(lr, -2.0)
    corr = LAB.get("importance_correction", "rejection", criterion="token_k2", upper=1.0, is_level="token", c_max=1.5)
    w, _ = corr(old_log_prob=rollout + lr, rollout_log_prob=rollout, mask=torch.ones(1, 1, dtype=torch.bool))
    close(w, [[1.5]])


def test_mismatch_metrics_by_hand():
    # row 0: lr [0.2, −0.4]; row 1: lr [0.6] (one valid token); row 2 empty
    # k1 = −lr; k2 = ½lr²; k3 = e^lr − 1 − lr
    from rllab_corrections.rejection import mismatch_metrics

    lr = t([[0.2, -0.4], [0.6, 9.0], [5.0, 5.0]])
    mask = torch.tensor([[True, True], [True, False], [False, False]])
    rollout = torch.full_like(lr, -1.0)
    m = mismatch_metrics(torch.where(mask, rollout + lr, 0.0), torch.where(mask, rollout, 0.0), mask)
    k3 = lambda x: math.exp(x) - 1 - x  # noqa: E731
    close(m["tis/k1_token"], -(0.2 - 0.4 + 0.6) / 3)
    close(m["tis/k1_seq_sum"], (0.2 + (-0.6)) / 2)  # rows: −(0.2 − 0.4) = 0.2, −0.6
    close(m["tis/k1_seq_mean"], (0.1 + (-0.6)) / 2)
    close(m["tis/k2_seq_max"], (0.08 + 0.18) / 2)  # max ½lr²: row 0 ½·0.16, row 1 ½·0.36
    close(m["tis/k3_seq_sum"], (k3(0.2) + k3(-0.4) + k3(0.6)) / 2)
    close(m["tis/chi2_token"], (math.exp(0.4) + math.exp(-0.8) + math.exp(1.2)) / 3 - 1)
    close(m["tis/chi2_seq"], (math.exp(2 * -0.2) + math.exp(2 * 0.6)) / 2 - 1)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-1.5, 1.5), min_size=12, max_size=12),
    st.lists(st.booleans(), min_size=12, max_size=12),
    st.sampled_from(["token_k1", "token_k3", "seq_sum_k2", "seq_mean_k1", "seq_max_k3"]),
    st.floats(1.01, 3.0),
)
def test_rejection_mask_properties(lrs, valid, criterion, upper):
    lr = t(lrs).view(3, 4)
    mask = torch.tensor(valid).view(3, 4)
    rollout = torch.full_like(lr, -2.0)
    kw = dict(rollout_log_prob=rollout, mask=mask, criterion=criterion, upper=upper)
    keep = rejection_mask(old_log_prob=rollout + lr, **kw)
    assert not (keep & ~mask).any()  # only valid tokens are kept
    if criterion.startswith("seq"):  # a sequence criterion keeps or drops a row whole
        for row_keep, row_mask in zip(keep, mask):
            assert row_keep[row_mask].all() or not row_keep.any()
    # equal policies: every divergence is 0 and every bound admits it
    assert torch.equal(rejection_mask(old_log_prob=rollout.clone(), **kw), mask)
    # masked values never matter
    noisy = torch.where(mask, rollout + lr, torch.full_like(lr, float("nan")))
    assert torch.equal(rejection_mask(old_log_prob=noisy, **kw), keep)


def test_veto_drops_rows_with_one_catastrophic_token():
    # veto 1e-4 = e^−9.21: row 0 has a token with lr = −10 (ratio 4.5e−5) → all of row 0 dropped;
    # row 1's lr = −10 sits under the mask → kept; row 2's worst lr = −9 (ratio 1.2e−4) → kept
    lr = t([[0.0, -10.0, 0.1], [0.0, 0.0, -10.0], [-9.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, True]])
    rollout = torch.full_like(lr, -12.0)
    corr = LAB.get("importance_correction", "rejection", criterion="token_k2", upper=100.0, veto_threshold=1e-4)
    w, m = corr(old_log_prob=rollout + lr, rollout_log_prob=rollout, mask=mask)
    close(w, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    close(m["tis/veto_seq_frac"], 1 / 3)
    # without the veto every valid token passes token_k2 ≤ 100
    w, _ = LAB.get("importance_correction", "rejection", criterion="token_k2", upper=100.0)(
        old_log_prob=rollout + lr, rollout_log_prob=rollout, mask=mask
    )
    close(w, mask.double())
    # with an IS weight on the kept tokens the veto still drops row 0 and is still reported;
    # the kept tokens carry their ratio e^lr truncated at c_max = 2
    w, m = LAB.get("importance_correction", "rejection", criterion="token_k2", upper=100.0, veto_threshold=1e-4,
                   is_level="token")(old_log_prob=rollout + lr, rollout_log_prob=rollout, mask=mask)
    close(w, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [math.exp(-9.0), 1.0, 1.0]])
    close(m["tis/veto_seq_frac"], 1 / 3)


@pytest.mark.parametrize(
    "name, knobs, match",
    [
        ("rejection", {"upper": 0.5}, r"lower \(unset: 1/upper = 2\) exceeds upper = 0.5.*every token would be rejected"),
        ("rejection", {"upper": 1.5, "lower": 2.0}, r"lower = 2.0 exceeds upper = 1.5"),
        ("rejection", {"criterion": "token_k2", "upper": 1.0, "veto_threshold": 2.0}, r"veto_threshold = 2.0 ≥ 1.*every row"),
        ("rejection", {"is_level": "token", "c_min": 0.1, "c_max": 0.5}, r"c_min = 0.1, c_max = 0.5.*must contain 1"),
        ("bypass_mode", {"rs_criterion": "token_k1", "rs_upper": 0.5}, r"rs_lower \(unset: 1/rs_upper = 2\) exceeds rs_upper"),
        ("bypass_mode", {"rs_criterion": "seq_mean_k1", "rs_upper": 1.5, "rs_lower": 2.0}, r"rs_lower = 2.0 exceeds"),
    ],
)
def test_thresholds_that_reject_every_token_are_refused(name, knobs, match):
    """Class: a knob that trains nothing. Thresholds under which every on-policy token is rejected
    (gradient 0 at every step, exit 0) are refused at config load, naming the knob and the bound."""
    kind = "importance_correction" if name == "rejection" else "policy_loss"
    with pytest.raises(rllab.ConfigError, match=match):
        LAB.get(kind, name, **knobs)
    LAB.get("importance_correction", "rejection", upper=1.0)  # lower = upper = 1: exact on-policy tokens pass


# --------------------------------------------------------------------------- several criteria


def test_several_criteria_keep_a_token_only_where_all_pass():
    # lr rows: [0.1, −1.0, 0.5] and [0.05, 0.05, −0.05]
    # token_k1 in [½, 2] (k1 = −lr in [−0.693, 0.693]): rejects row 0's −1.0 token only
    # seq_max_k3 ≤ 0.1: row 0 max k3 = e^0.5 − 1.5 = 0.1487 (the −1.0 token: e^−1 = 0.3679 − 1 + 1 = 0.3679)
    #   → row 0 vetoed; row 1 max = e^0.05 − 1.05 = 0.00127 → kept
    lr = t([[0.1, -1.0, 0.5], [0.05, 0.05, -0.05]])
    assert keep(lr, "token_k1", 2.0) == [[True, False, True], [True, True, True]]
    assert keep(lr, "seq_max_k3", 0.1) == [[False, False, False], [True, True, True]]
    both = [[False, False, False], [True, True, True]]
    assert keep(lr, "token_k1,seq_max_k3", [2.0, 0.1]) == both
    assert keep(lr, ["token_k1", "seq_max_k3"], (2.0, 0.1)) == both
    # seq_max_k3 loosened to 0.2: row 0 max is the −1.0 token's 0.368 → still vetoed; at 0.4 only
    # token_k1's rejection of that token is left
    assert keep(lr, "token_k1,seq_max_k3", [2.0, 0.4]) == [[True, False, True], [True, True, True]]
    # one threshold shared: 2.0 for both (seq_max_k3 ≤ 2 keeps every row)
    assert keep(lr, "token_k1,seq_max_k3", 2.0) == [[True, False, True], [True, True, True]]
    # lower applies to the k1 criteria in order: token_k1 [0.99, 2] rejects k1 = −0.1, −0.5 (lr 0.1, 0.5),
    # seq_mean_k1 [0.5, 2]: row means of k1 are 0.133 and −0.0167 → both kept
    assert keep(lr, "token_k1,seq_mean_k1,seq_max_k3", [2.0, 2.0, 0.4], [0.99, 0.5]) == [
        [False, False, False], [False, False, True]]


def test_several_criteria_in_the_correction_report_each_share():
    lr = t([[0.1, -1.0, 0.5], [0.05, 0.05, -0.05]])
    rollout = torch.full_like(lr, -2.0)
    corr = LAB.get("importance_correction", "rejection", criterion="token_k1,seq_max_k3", upper=[2.0, 0.1])
    w, m = corr(old_log_prob=rollout + lr, rollout_log_prob=rollout, mask=torch.ones(2, 3, dtype=torch.bool))
    close(w, [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    close(m["tis/rs_masked_frac"], 3 / 6)
    close(m["tis/rs_token_k1_masked_frac"], 1 / 6)
    close(m["tis/rs_seq_max_k3_masked_frac"], 3 / 6)
    k3 = lambda x: math.exp(x) - 1 - x  # noqa: E731
    close(m["tis/rs_seq_max_k3_stat_mean"], (k3(-1.0) * 3 + k3(0.05) * 3) / 6)
    close(m["tis/rs_token_k1_stat_mean"], -sum(lr.flatten().tolist()) / 6)
    assert "tis/rs_stat_mean" not in m  # one per criterion instead


def test_several_criteria_from_the_command_line_and_in_bypass_mode():
    from rllab.config import parse_overrides

    (key, value), = parse_overrides(["correction.upper=[2.0, 0.1]"])
    corr = LAB.get("importance_correction", "rejection", criterion=["token_k1", "seq_max_k3"], upper=value)
    assert corr.config.criteria == (("token_k1", 0.5, 2.0), ("seq_max_k3", None, 0.1))
    # bypass mode takes the same lists
    lr = t([[0.1, -1.0, 0.5], [0.05, 0.05, -0.05]])
    _, m, grad = _bypass(lr, torch.ones_like(lr), rs_criterion="token_k1,seq_max_k3", rs_upper=[2.0, 0.1])
    close(m["tis/rs_masked_frac"], 3 / 6)
    assert grad[0].abs().sum() == 0 and (grad[1] != 0).all()  # row 0 rejected, row 1 trained


@pytest.mark.parametrize(
    "knobs, match",
    [
        ({"criterion": "token_k1,seq_max_k9"}, r"unknown criterion 'seq_max_k9'; must be one or more of token_k1, .*seq_max_k3"),
        ({"criterion": "seq_max_k1"}, r"unknown criterion 'seq_max_k1'"),
        ({"criterion": "token_k1,token_k1"}, r"lists 'token_k1' more than once"),
        ({"criterion": " , "}, r"names no criterion"),
        ({"criterion": "token_k1,seq_max_k3", "upper": [2.0, 0.1, 0.2]},
         r"upper = \(2.0, 0.1, 0.2\) gives 3 thresholds for 2 criteria \(token_k1, seq_max_k3\)"),
        ({"criterion": "token_k1,seq_mean_k1,seq_max_k3", "upper": 2.0, "lower": [0.5, 0.6, 0.7]},
         r"lower = .* gives 3 lower bounds for 2 k1 criteria \(token_k1, seq_mean_k1\)"),
        ({"criterion": "token_k2,seq_max_k3", "upper": 2.0, "lower": 0.5}, r"lower = 0.5 only applies to k1 criteria"),
        ({"criterion": "token_k1,seq_max_k3", "upper": [2.0, -0.1]}, r"every threshold must be > 0"),
        ({"criterion": "token_k1,seq_max_k3", "upper": [0.5, 0.1]},
         r"lower \(unset: 1/upper = 2\) exceeds upper.*criterion 'token_k1'"),
        ({"criterion": "token_k1", "upper": "2.0"}, r"wrong type"),
    ],
)
def test_bad_criterion_lists_are_refused_by_name(knobs, match):
    with pytest.raises(rllab.ConfigError, match=match) as e:
        LAB.get("importance_correction", "rejection", **knobs)
    assert "rejection" in str(e.value)
    with pytest.raises(rllab.ConfigError, match=r"rs_criterion = 'token_k1,tok_k2': unknown criterion 'tok_k2'"):
        LAB.get("policy_loss", "bypass_mode", rs_criterion="token_k1,tok_k2", rs_upper=2.0)
