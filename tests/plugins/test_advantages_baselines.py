"""rllab_advantages.baselines: gdpo, normalize_then_sum and the optimal token baselines, by hand."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rllab
from rllab import ops

LAB = rllab.Lab()


def t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def close(a, b, tol=1e-12):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               rtol=tol, atol=tol)


def est(name, **knobs):
    return LAB.get("advantage_estimator", name, **knobs)


def outcome(scores, T=1):
    """(token_rewards (B, T) with the score on the last token, full mask)."""
    r = torch.zeros(len(scores), T, dtype=torch.float64)
    r[:, -1] = t(scores)
    return r, torch.ones(len(scores), T, dtype=torch.bool)


# --------------------------------------------------------------------------- gdpo


def test_gdpo_normalises_each_component_then_whitens():
    # two groups of two rows, components c1 = [1, 0, 3, 3], c2 = [0, 2, 1, 0], weights (1, 0.5):
    # per group (r − mean)/(std + ε), std of two values a, b is |a − b|/√2:
    #   c1: group 0 → ±1/√2 (row 0 +), group 1 → 0, 0;  c2: group 0 → −/+1/√2, group 1 → +/−1/√2
    # sum = [1/√2 − 0.5/√2, −1/√2 + 0.5/√2, 0.5/√2, −0.5/√2] = [h, −h, h, −h] with h = 0.5/√2
    # (group 1's equal c1 gives 0/(0 + ε) = 0); whitening over 4 tokens: mean 0, unbiased var 4h²/3 → A = ±√3/2
    r, mask = outcome([0.0, 0.0, 0.0, 0.0])
    comps = t([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [3.0, 0.0]])
    adv, ret = est("gdpo", reward_weights=(1.0, 0.5))(
        token_rewards=r, mask=mask, index=torch.tensor([0, 0, 1, 1]), reward_components=comps
    )
    q = math.sqrt(3) / 2
    close(adv[:, 0], [q, -q, q, -q], tol=1e-5)  # ε = 1e-6 on the stds, 1e-8 in the whitening
    close(ret, adv)


def test_gdpo_single_component_is_grpo_then_whitened():
    r, mask = outcome([1.0, 0.0, 1.0, 1.0, 0.0, 2.0], T=3)
    mask[1, 2] = False
    r = torch.where(mask, r, 0.0)
    r[1, 1] = 0.0
    index = torch.tensor([0, 0, 1, 1, 2, 2])
    adv, _ = est("gdpo")(token_rewards=r, mask=mask, index=index)
    grpo, _ = est("grpo")(token_rewards=r, mask=mask, index=index)
    close(adv, torch.where(mask, ops.masked_whiten(grpo, mask), 0.0), tol=1e-10)


def test_gdpo_refuses_weights_it_cannot_apply():
    r, mask = outcome([1.0, 0.0])
    with pytest.raises(ValueError, match="reward_weights"):
        est("gdpo", reward_weights=(1.0, 2.0))(token_rewards=r, mask=mask, index=torch.tensor([0, 0]))


# --------------------------------------------------------------------------- normalize_then_sum


def test_normalize_then_sum_by_hand():
    # one component; groups {0, 1}: scores 2, 0 → ±1/√2·(√2/(√2 + ε))... with ε = 0: ±1/√2;
    # group {2}: singleton → 0. s = [1/√2, −1/√2, 0]: mean 0, unbiased std 1/√2 → A = [1, −1, 0]
    r, mask = outcome([2.0, 0.0, 5.0], T=2)
    adv, _ = est("normalize_then_sum", epsilon=0.0)(token_rewards=r, mask=mask, index=torch.tensor([7, 7, 3]))
    close(adv, [[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=6, max_size=6), st.lists(st.floats(0.1, 2), min_size=2, max_size=2))
def test_normalize_then_sum_is_standardised_over_rows(vals, w):
    r, mask = outcome([0.0] * 3)
    comps = t(vals).view(3, 2)
    comps = torch.cat([comps, comps + 1.0])  # two groups of three (ids 0, 1)
    r, mask = outcome([0.0] * 6)
    adv, _ = est("normalize_then_sum", reward_weights=tuple(w))(
        token_rewards=r, mask=mask, index=torch.tensor([0, 0, 0, 1, 1, 1]), reward_components=comps
    )
    a = adv[:, 0]
    close(a.mean(), 0.0, tol=1e-9)
    if a.abs().max() > 1e-3:
        assert a.std() < 1.0 + 1e-9  # (s − mean)/(std + ε) has std just below 1


# --------------------------------------------------------------------------- optimal token baselines


def _otb_inputs(pi, sps):
    return torch.log(t(pi)), t(sps)


def test_optimal_token_baseline_by_hand():
    # one group of two rows, T = 2, rewards on the last token: row 0 → 1, row 1 → 0 (row 1 one token shorter)
    # π = 0.5 everywhere, Σπ² = 0.5: w = 1 − 1 + 0.5 = 0.5 per token; W = cumsum → [0.5, 1.0]
    # returns G: row 0 [1, 1]; row 1 (mask [T, F], reward on token 0) [0, 0]
    # t = 0: B = (1·0.5 + 0·0.5)/(0.5 + 0.5) = 0.5; t = 1: only row 0 valid → B = 1
    # zero tail off: A = row 0 [0.5, 0]; row 1 [−0.5]
    # zero tail on: row 0 is the unique longest (2 > 1): its baseline from t = 1 on is 0 → A[0, 1] = 1
    r = t([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    logp, sps = _otb_inputs([[0.5, 0.5], [0.5, 0.5]], [[0.5, 0.5], [0.5, 0.5]])
    kw = dict(token_rewards=r, mask=mask, index=torch.tensor([4, 4]), old_log_prob=logp, sum_pi_squared=sps)
    adv, ret = est("optimal_token_baseline", handle_zero_tail=False, epsilon=0.0)(**kw)
    close(adv, [[0.5, 0.0], [-0.5, 0.0]])
    close(ret, [[1.0, 1.0], [0.0, 0.0]])
    adv, _ = est("optimal_token_baseline", epsilon=0.0)(**kw)
    close(adv, [[0.5, 1.0], [-0.5, 0.0]])


def test_tir_aligns_rows_by_valid_token_index():
    # row 0 has a masked observation token at t = 1: valid tokens at t = 0, 2; row 1 valid at t = 0, 1.
    # Packed, both rows have 2 tokens: k = 0 and k = 1 line up. π = 0.5, Σπ² = 0.5 → W = [0.5, 1.0].
    # rewards: row 0 gets 2 on its last valid token (t = 2), row 1 gets 0.
    # G packed: row 0 [2, 2], row 1 [0, 0]; B_k = (2·W_k + 0)/(2·W_k) = 1 → A row 0 [1, 1], row 1 [−1, −1]
    r = t([[0.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, False, True], [True, True, False]])
    logp, sps = _otb_inputs([[0.5] * 3] * 2, [[0.5] * 3] * 2)
    kw = dict(token_rewards=r, mask=mask, index=torch.tensor([0, 0]), old_log_prob=logp, sum_pi_squared=sps)
    adv, _ = est("tir_optimal_token_baseline", epsilon=0.0)(**kw)
    close(adv, [[1.0, 0.0, 1.0], [-1.0, -1.0, 0.0]])
    # aligned by position instead, t = 2 is valid for row 0 only and its W there is 1.0 vs row 1's
    # t = 1 (masked for row 0): the position-aligned baseline differs
    adv_pos, _ = est("optimal_token_baseline", epsilon=0.0)(**kw)
    assert not torch.allclose(adv_pos, adv)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-2, 2), min_size=8, max_size=8), st.lists(st.floats(0.05, 0.95), min_size=8, max_size=8))
def test_otb_with_uniform_weights_is_the_group_mean_of_returns(rewards, pis):
    """With equal W across a group (same π and Σπ² everywhere) and equal lengths, B_t is the group
    mean of G_t, and the advantages sum to 0 over the group at every position."""
    r = t(rewards).view(4, 2)
    mask = torch.ones(4, 2, dtype=torch.bool)
    logp = torch.log(t([pis[0]] * 8).view(4, 2))
    sps = torch.full((4, 2), pis[0] ** 2 + 0.01, dtype=torch.float64)
    adv, ret = est("optimal_token_baseline", epsilon=0.0)(
        token_rewards=r, mask=mask, index=torch.tensor([0, 0, 1, 1]), old_log_prob=logp, sum_pi_squared=sps
    )
    close(adv[0] + adv[1], torch.zeros(2), tol=1e-9)
    close(adv[2] + adv[3], torch.zeros(2), tol=1e-9)
    close(adv[0], ret[0] - (ret[0] + ret[1]) / 2, tol=1e-9)


def test_otb_declares_its_inputs():
    assert LAB.spec("advantage_estimator", "optimal_token_baseline").requires == ("old_log_prob", "sum_pi_squared")
    r, mask = outcome([1.0, 0.0])
    with pytest.raises(ValueError, match="sum_pi_squared"):
        est("optimal_token_baseline")(token_rewards=r, mask=mask, index=torch.tensor([0, 0]))
