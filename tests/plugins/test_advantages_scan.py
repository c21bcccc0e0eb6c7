"""Tests of the backward-scan estimators: gae, reinforce, reinforce_plus_plus.

References are float64 per-token loops written the way verl 0.9.1 writes them (skip masked
steps, carry ``next_value`` and the running advantage / return through them).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rllab
from rllab.ops import RowError

LAB = rllab.Lab()


def estimator(name, **knobs):
    return LAB.get("advantage_estimator", name, **knobs)


# --------------------------------------------------------------------------- loop references


def loop_gae(r, v, m, gamma, lam):
    """verl's compute_gae_advantage_return before whitening: (advantages, returns), float64."""
    r, v, m = r.double(), v.double(), m.double()
    next_value = torch.zeros(r.shape[0], dtype=torch.float64)
    last = torch.zeros(r.shape[0], dtype=torch.float64)
    out = []
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        new = delta + gamma * lam * last
        next_value = v[:, t] * m[:, t] + (1 - m[:, t]) * next_value
        last = new * m[:, t] + (1 - m[:, t]) * last
        out.append(last)
    adv = torch.stack(out[::-1], dim=1) if out else torch.zeros_like(r)
    return adv, adv + v


def loop_return(r, m, gamma):
    """verl's reinforce_plus_plus return loop, float64: 0 at masked positions."""
    r, m = r.double(), m.double()
    running = torch.zeros(r.shape[0], dtype=torch.float64)
    out = torch.zeros_like(r)
    for t in reversed(range(r.shape[1])):
        new = r[:, t] + gamma * running
        out[:, t] = new * m[:, t]
        running = new * m[:, t] + (1 - m[:, t]) * running
    return out


def verl_whiten(x, m):
    """verl's masked_whiten (unbiased var, +1e-8), float64."""
    x, w = x.double(), m.double()
    n = w.sum()
    mean = (x * w).sum() / n
    var = (((x - mean) ** 2) * w).sum() / n * n / (n - 1)
    return (x - mean) / torch.sqrt(var + 1e-8)


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-12)).item()


# --------------------------------------------------------------------------- hand-computed


R3 = torch.tensor([[0.0, 0.0, 1.0]])
V3 = torch.tensor([[0.5, 0.2, 0.4]])
# γ = 0.9, λ = 0.8, γλ = 0.72:
#   δ2 = 1 − 0.4 = 0.6                    A2 = 0.6
#   δ1 = 0.9·0.4 − 0.2 = 0.16             A1 = 0.16 + 0.72·0.6 = 0.592
#   δ0 = 0.9·0.2 − 0.5 = −0.32            A0 = −0.32 + 0.72·0.592 = 0.10624
A3 = [0.10624, 0.592, 0.6]
RET3 = [0.60624, 0.792, 1.0]


def test_gae_hand_computed_no_whitening():
    est = estimator("gae", gamma=0.9, lam=0.8, whiten=False)
    adv, ret = est(token_rewards=R3, values=V3, mask=torch.ones(1, 3, dtype=torch.bool), index=torch.zeros(1))
    torch.testing.assert_close(adv, torch.tensor([A3]), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ret, torch.tensor([RET3]), rtol=1e-6, atol=1e-7)


def test_gae_hand_computed_skips_masked_tokens():
    # The same three valid tokens with an observation token between them and a padded tail.
    # The reward 5 and value 9 on masked tokens are dropped; the chain is unbroken.
    r = torch.tensor([[0.0, 5.0, 0.0, 1.0, 7.0]])
    v = torch.tensor([[0.5, 9.0, 0.2, 0.4, 9.0]])
    m = torch.tensor([[True, False, True, True, False]])
    adv, ret = estimator("gae", gamma=0.9, lam=0.8, whiten=False)(token_rewards=r, values=v, mask=m, index=None)
    torch.testing.assert_close(adv, torch.tensor([[0.10624, 0.0, 0.592, 0.6, 0.0]]), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ret, torch.tensor([[0.60624, 0.0, 0.792, 1.0, 0.0]]), rtol=1e-6, atol=1e-7)
    # verl's values at masked positions: the advantage carried from the next valid token, A + V.
    adv, ret = estimator("gae", gamma=0.9, lam=0.8, whiten=False, remask=False)(
        token_rewards=r, values=v, mask=m, index=None
    )
    torch.testing.assert_close(adv, torch.tensor([[0.10624, 0.592, 0.592, 0.6, 0.0]]), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ret, torch.tensor([[0.60624, 9.592, 0.792, 1.0, 9.0]]), rtol=1e-6, atol=1e-7)


def test_gae_hand_computed_whitened():
    adv, ret = estimator("gae", gamma=0.9, lam=0.8)(
        token_rewards=R3, values=V3, mask=torch.ones(1, 3, dtype=torch.bool), index=None
    )
    mean = sum(A3) / 3
    var = sum((a - mean) ** 2 for a in A3) / 2  # unbiased
    expected = [(a - mean) / math.sqrt(var + 1e-8) for a in A3]
    torch.testing.assert_close(adv, torch.tensor([expected]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ret, torch.tensor([RET3]), rtol=1e-6, atol=1e-7)  # returns are not whitened


def test_reinforce_hand_computed():
    r = torch.tensor([[1.0, 100.0, 2.0, 0.0, 3.0]])
    m = torch.tensor([[True, False, True, True, False]])
    # valid rewards 1, 2, 0 with γ = 0.5: G = [1 + 0.5·(2 + 0.5·0), 2, 0] = [2, 2, 0]
    adv, ret = estimator("reinforce", gamma=0.5)(token_rewards=r, mask=m, index=torch.zeros(1))
    torch.testing.assert_close(adv, torch.tensor([[2.0, 0.0, 2.0, 0.0, 0.0]]))
    torch.testing.assert_close(ret, adv)


def test_reinforce_plus_plus_hand_computed():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    m = torch.tensor([[True, True, True], [True, True, False]])
    # γ = 0.5: row 0 G = [0.25, 0.5, 1]; row 1 G = [1, 2, 0 (masked)]
    adv, ret = estimator("reinforce_plus_plus", gamma=0.5)(token_rewards=r, mask=m, index=None)
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    valid = [0.25, 0.5, 1.0, 1.0, 2.0]
    mean = sum(valid) / 5  # 0.95
    std = math.sqrt(sum((g - mean) ** 2 for g in valid) / 4 + 1e-8)
    expected = [[(g - mean) / std for g in (0.25, 0.5, 1.0)], [(1.0 - mean) / std, (2.0 - mean) / std, 0.0]]
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- identities


def _batch(B, T, seed, holes=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    m = torch.arange(T)[None, :] < lengths[:, None]
    if holes:  # observation spans inside the response
        m &= torch.rand(B, T, generator=g) > 0.25
    return r, v, m


def test_gae_gamma_lambda_one_is_reward_to_go_minus_value():
    r, v, m = _batch(6, 40, seed=1)
    adv, ret = estimator("gae", whiten=False)(token_rewards=r, values=v, mask=m, index=None)
    rtg = torch.where(m, r, 0.0).flip(-1).cumsum(-1).flip(-1)  # reward-to-go over valid tokens
    expected = torch.where(m, rtg - v, 0.0)
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, torch.where(m, rtg, 0.0), rtol=1e-5, atol=1e-5)


def test_gae_lambda_zero_is_one_step_td():
    r, v, m = _batch(4, 30, seed=2, holes=False)
    adv, _ = estimator("gae", gamma=0.7, lam=0.0, whiten=False)(token_rewards=r, values=v, mask=m, index=None)
    v_next = torch.cat([torch.where(m, v, 0.0)[:, 1:], torch.zeros(4, 1)], dim=1)
    torch.testing.assert_close(adv, torch.where(m, r + 0.7 * v_next - v, 0.0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["gae", "reinforce", "reinforce_plus_plus"])
def test_masked_positions_change_nothing(name):
    r, v, m = _batch(5, 33, seed=3)
    est = estimator(name, gamma=0.95)
    base = est(token_rewards=r, values=v, mask=m, index=None)
    junk = torch.full_like(r, float("nan"))
    junk[:, ::2] = 1e6
    r2, v2 = torch.where(m, r, junk), torch.where(m, v, -junk)
    other = est(token_rewards=r2, values=v2, mask=m, index=None)
    for a, b in zip(base, other):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert torch.isfinite(a).all()


@pytest.mark.parametrize("name", ["gae", "reinforce", "reinforce_plus_plus"])
def test_appending_padding_changes_nothing(name):
    r, v, m = _batch(5, 21, seed=4)
    est = estimator(name, gamma=0.9, **({"lam": 0.9} if name == "gae" else {}))
    base = est(token_rewards=r, values=v, mask=m, index=None)
    pad = 50
    r2 = torch.cat([r, torch.randn(5, pad)], dim=1)
    v2 = torch.cat([v, torch.randn(5, pad)], dim=1)
    m2 = torch.cat([m, torch.zeros(5, pad, dtype=torch.bool)], dim=1)
    padded = est(token_rewards=r2, values=v2, mask=m2, index=None)
    for a, b in zip(base, padded):
        torch.testing.assert_close(b[:, :21], a, rtol=1e-6, atol=1e-6)
        assert (b[:, 21:] == 0).all()


def test_unwhitened_rows_are_independent():
    r, v, m = _batch(6, 25, seed=5)
    est = estimator("gae", gamma=0.99, lam=0.9, whiten=False)
    full, _ = est(token_rewards=r, values=v, mask=m, index=None)
    for i in (0, 3, 5):
        one, _ = est(token_rewards=r[i : i + 1], values=v[i : i + 1], mask=m[i : i + 1], index=None)
        torch.testing.assert_close(one[0], full[i], rtol=1e-6, atol=1e-6)  # matmul blocking may differ


# --------------------------------------------------------------------------- against the loop


masks = st.integers(1, 6).flatmap(
    lambda B: st.integers(1, 90).flatmap(
        lambda T: st.tuples(
            st.just(B),
            st.just(T),
            st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B),
        )
    )
)
coef = st.one_of(st.sampled_from([0.0, 0.5, 0.95, 1.0]), st.floats(0.0, 1.0))


@settings(max_examples=60, deadline=None)
@given(shape=masks, gamma=coef, lam=coef, seed=st.integers(0, 2**31 - 1))
def test_gae_matches_loop_on_random_masks(shape, gamma, lam, seed):
    B, T, rows = shape
    holes = torch.tensor(rows, dtype=torch.bool)
    prefix = torch.arange(T)[None, :] < holes.sum(dim=1, keepdim=True)  # same lengths, no holes
    g = torch.Generator().manual_seed(seed)
    r, v = torch.randn(B, T, generator=g, dtype=torch.float64), torch.randn(B, T, generator=g, dtype=torch.float64)
    for m in (holes, prefix):
        _check_gae_against_loop(r, v, m, gamma, lam)


def _check_gae_against_loop(r, v, m, gamma, lam):
    ref_adv, ref_ret = loop_gae(r, v, m, gamma, lam)

    adv, ret = estimator("gae", gamma=gamma, lam=lam, whiten=False, remask=False)(
        token_rewards=r, values=v, mask=m, index=None
    )
    torch.testing.assert_close(adv, ref_adv, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-10, atol=1e-10)

    adv32, ret32 = estimator("gae", gamma=gamma, lam=lam, whiten=False)(
        token_rewards=r.float(), values=v.float(), mask=m, index=None
    )
    scale = ref_adv.abs().max().clamp(min=1.0)
    torch.testing.assert_close(adv32.double(), torch.where(m, ref_adv, 0.0), rtol=1e-5, atol=1e-5 * scale.item())
    torch.testing.assert_close(ret32.double(), torch.where(m, ref_ret, 0.0), rtol=1e-5, atol=1e-5 * scale.item())

    if m.sum() > 1:
        white, _ = estimator("gae", gamma=gamma, lam=lam, remask=False)(token_rewards=r, values=v, mask=m, index=None)
        torch.testing.assert_close(white, verl_whiten(ref_adv, m), rtol=1e-8, atol=1e-8)


@settings(max_examples=40, deadline=None)
@given(shape=masks, gamma=coef, seed=st.integers(0, 2**31 - 1))
def test_returns_match_loop_on_random_masks(shape, gamma, seed):
    B, T, rows = shape
    holes = torch.tensor(rows, dtype=torch.bool)
    prefix = torch.arange(T)[None, :] < holes.sum(dim=1, keepdim=True)
    r = torch.randn(B, T, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    for m in (holes, prefix):
        _check_returns_against_loop(r, m, gamma)


def _check_returns_against_loop(r, m, gamma):
    ref = loop_return(r, m, gamma)
    adv, ret = estimator("reinforce", gamma=gamma)(token_rewards=r, mask=m, index=None)
    torch.testing.assert_close(ret, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(adv, ref, rtol=1e-10, atol=1e-10)
    adv, ret = estimator("reinforce_plus_plus", gamma=gamma)(token_rewards=r, mask=m, index=None)
    torch.testing.assert_close(ret, ref, rtol=1e-10, atol=1e-10)
    if m.sum() > 1:
        torch.testing.assert_close(adv, torch.where(m, verl_whiten(ref, m), 0.0), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.8), (1.0, 0.95)])
def test_default_knobs_on_holes_match_loop(gamma, lam):
    """Defaults (remask, whiten) on rows with observation spans: the no-packing path (γλ = 1)
    and the packed one (γλ < 1) both give verl's values at valid positions and 0 elsewhere,
    whatever sits at masked positions."""
    r, v, m = _batch(6, 70, seed=11, dtype=torch.float64)
    m[0] = False  # an all-masked row
    m[1] = True  # a full row
    ref_adv, ref_ret = loop_gae(r, v, m, gamma, lam)
    junk = torch.full_like(r, float("nan"))
    r, v = torch.where(m, r, junk), torch.where(m, v, junk)
    adv, ret = estimator("gae", gamma=gamma, lam=lam)(token_rewards=r, values=v, mask=m, index=None)
    torch.testing.assert_close(ret, torch.where(m, ref_ret, 0.0), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(adv, torch.where(m, verl_whiten(ref_adv, m), 0.0), rtol=1e-8, atol=1e-8)
    adv, ret = estimator("gae", gamma=gamma, lam=lam, whiten=False)(token_rewards=r, values=v, mask=m, index=None)
    torch.testing.assert_close(adv, torch.where(m, ref_adv, 0.0), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ret, torch.where(m, ref_ret, 0.0), rtol=1e-10, atol=1e-10)
    for gamma_r in (1.0, gamma * lam):
        ref = loop_return(torch.where(m, r, 0.0), m, gamma_r)
        for name in ("reinforce", "reinforce_plus_plus"):
            _, ret = estimator(name, gamma=gamma_r)(token_rewards=r, mask=m, index=None)
            torch.testing.assert_close(ret, ref, rtol=1e-10, atol=1e-10)



@pytest.mark.parametrize("c", [0.0, 0.01, 0.3, 0.95, 0.999, 1.0])
@pytest.mark.parametrize("T", [1, 7, 8, 9, 33, 127, 128, 129, 257, 4097, 16385, 16513])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_discounted_reverse_cumsum_block_boundaries(c, T, dtype):
    """Lengths around the blocks of the blocked scan (128 tokens near c = 1, 40 / log2(1/c)
    otherwise, then 128² at the next level) and of the log-step scan."""
    from rllab_advantages.gae import discounted_reverse_cumsum

    x = torch.randn(3, T, dtype=torch.float64, generator=torch.Generator().manual_seed(T))
    ref = loop_return(x, torch.ones(3, T, dtype=torch.bool), c)
    got = discounted_reverse_cumsum(x.to(dtype), c).double()
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    assert rel_err(got, ref) < tol


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.999, 0.95), (0.99, 0.999)])
def test_long_sequences_stay_within_float32_rounding(gamma, lam):
    # 5000 tokens: three levels of the blocked scan; float32 must stay within 1e-5 of float64.
    r, v, m = _batch(3, 5000, seed=6)
    ref_adv, ref_ret = loop_gae(r, v, m, gamma, lam)
    adv, ret = estimator("gae", gamma=gamma, lam=lam, whiten=False)(token_rewards=r, values=v, mask=m, index=None)
    assert rel_err(adv, torch.where(m, ref_adv, 0.0)) < 1e-5
    assert rel_err(ret, torch.where(m, ref_ret, 0.0)) < 1e-5
    adv, _ = estimator("gae", gamma=gamma, lam=lam)(token_rewards=r, values=v, mask=m, index=None)
    assert rel_err(adv, torch.where(m, verl_whiten(ref_adv, m), 0.0)) < 1e-5
    _, ret = estimator("reinforce_plus_plus", gamma=gamma * lam)(token_rewards=r, mask=m, index=None)
    assert rel_err(ret, loop_return(r, m, gamma * lam)) < 1e-5


# --------------------------------------------------------------------------- edge cases


def test_all_masked_row_is_zero_and_does_not_change_statistics():
    r, v, m = _batch(4, 12, seed=7)
    est = estimator("gae", gamma=0.9, lam=0.95)
    base, base_ret = est(token_rewards=r, values=v, mask=m, index=None)
    r2 = torch.cat([r, torch.full((1, 12), 3.0)])
    v2 = torch.cat([v, torch.full((1, 12), float("nan"))])
    m2 = torch.cat([m, torch.zeros(1, 12, dtype=torch.bool)])
    adv, ret = est(token_rewards=r2, values=v2, mask=m2, index=None)
    assert (adv[4] == 0).all() and (ret[4] == 0).all()
    torch.testing.assert_close(adv[:4], base, rtol=0, atol=0)
    torch.testing.assert_close(ret[:4], base_ret, rtol=0, atol=0)
    for name in ("reinforce", "reinforce_plus_plus"):
        a, rt = estimator(name)(token_rewards=r2, mask=m2, index=None)
        a0, rt0 = estimator(name)(token_rewards=r, mask=m, index=None)
        assert (a[4] == 0).all() and (rt[4] == 0).all()
        torch.testing.assert_close(a[:4], a0, rtol=0, atol=0)


@pytest.mark.parametrize("remask", [True, False])
def test_at_most_one_valid_token_is_finite(remask):
    r = torch.tensor([[0.0, 2.0, 0.0], [1.0, 1.0, 1.0]])
    v = torch.tensor([[0.5, 0.5, 0.5], [0.1, 0.2, 0.3]])
    one = torch.tensor([[False, True, False], [False, False, False]])
    adv, ret = estimator("gae", remask=remask)(token_rewards=r, values=v, mask=one, index=None)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert adv[0, 1] == 0  # a lone valid token: centred, nothing to scale by
    assert ret[0, 1] == pytest.approx(2.0)  # returns are A + V = (2 − 0.5) + 0.5
    if not remask:  # centred only: the carried A minus the mean, not blown up by rsqrt(1e-8)
        torch.testing.assert_close(adv[0], torch.tensor([0.0, 0.0, -1.5]))
    none = torch.zeros(2, 3, dtype=torch.bool)
    adv, ret = estimator("gae", remask=remask)(token_rewards=r, values=v, mask=none, index=None)
    assert (adv == 0).all() and torch.isfinite(ret).all()
    adv, ret = estimator("reinforce_plus_plus")(token_rewards=r, mask=one, index=None)
    assert (adv == 0).all() and ret[0, 1] == 2.0


@pytest.mark.parametrize("name", ["gae", "reinforce", "reinforce_plus_plus"])
@pytest.mark.parametrize("shape", [(0, 7), (3, 0), (0, 0)])
def test_empty_batch(name, shape):
    x = torch.zeros(shape)
    adv, ret = estimator(name)(token_rewards=x, values=x, mask=torch.zeros(shape, dtype=torch.bool), index=None)
    assert adv.shape == shape and ret.shape == shape


@pytest.mark.parametrize("name", ["gae", "reinforce", "reinforce_plus_plus"])
def test_non_finite_rewards_at_valid_positions_name_the_rows(name):
    r, v, m = _batch(5, 10, seed=8, holes=False)
    m[:, 0] = True
    r[1, 0] = float("nan")
    r[3, 0] = float("inf")
    with pytest.raises(RowError, match=r"token_rewards.*\[1, 3\]") as info:
        estimator(name)(token_rewards=r, values=v, mask=m, index=None)
    assert info.value.rows == [1, 3]


def test_non_finite_values_name_the_rows():
    r, v, m = _batch(4, 10, seed=9, holes=False)
    m[:, 0] = True
    v[2, 0] = float("-inf")
    with pytest.raises(RowError, match=r"values.*\[2\]"):
        estimator("gae")(token_rewards=r, values=v, mask=m, index=None)


def test_huge_finite_rewards_are_not_rejected():
    # The fast finiteness check sums the tensor; an overflowing sum must fall back, not fail.
    r = torch.full((2, 4), 3e38)
    m = torch.ones(2, 4, dtype=torch.bool)
    _, ret = estimator("reinforce", gamma=0.0)(token_rewards=r, mask=m, index=None)
    assert (ret == 3e38).all()


def test_bad_arguments():
    r, v, m = _batch(2, 5, seed=10)
    with pytest.raises(ValueError, match="requires values"):
        estimator("gae")(token_rewards=r, mask=m, index=None)
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        estimator("gae")(token_rewards=r, values=v, mask=m.float(), index=None)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 4\) but expected \(2, 5\)"):
        estimator("reinforce")(token_rewards=r, mask=m[:, :4], index=None)
    with pytest.raises(ValueError, match=r"values has shape \(2, 4\) but token_rewards has shape \(2, 5\)"):
        estimator("gae")(token_rewards=r, values=v[:, :4], mask=m, index=None)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        estimator("reinforce_plus_plus")(token_rewards=r[0], mask=m[0], index=None)


def test_dtypes():
    r, v, m = _batch(3, 9, seed=11)
    adv, ret = estimator("gae")(token_rewards=r.double(), values=v.double(), mask=m, index=None)
    assert adv.dtype == ret.dtype == torch.float64
    adv, ret = estimator("gae")(token_rewards=r.bfloat16(), values=v.bfloat16(), mask=m, index=None)
    assert adv.dtype == ret.dtype == torch.float32


def test_no_gradient_flows():
    r, v, m = _batch(3, 9, seed=12)
    v.requires_grad_(True)
    adv, ret = estimator("gae")(token_rewards=r, values=v, mask=m, index=None)
    assert not adv.requires_grad and not ret.requires_grad


# --------------------------------------------------------------------------- registration, knobs


def test_registration():
    spec = LAB.spec("advantage_estimator", "gae")
    assert spec.requires == ("values",)
    assert spec.provider == "rllab_advantages"
    assert LAB.spec("advantage_estimator", "reinforce++").name == "reinforce_plus_plus"
    assert LAB.spec("advantage_estimator", "reinforce").requires == ()
    knobs = {k.name: k.default for k in spec.knobs()}
    assert knobs == {"gamma": 1.0, "lam": 1.0, "whiten": True, "remask": True}


@pytest.mark.parametrize(
    "name,knobs,match",
    [
        ("gae", {"gamma": 1.5}, "gamma = 1.5 is out of range"),
        ("gae", {"lam": -0.1}, "lam = -0.1 is out of range"),
        ("gae", {"whiten": "yes"}, "wrong type"),
        ("gae", {"lamda": 0.9}, "did you mean 'lam'"),
        ("reinforce", {"gamma": -1.0}, "out of range"),
        ("reinforce_plus_plus", {"lam": 0.9}, "has no knob 'lam'"),
    ],
)
def test_knob_validation(name, knobs, match):
    with pytest.raises(rllab.ConfigError, match=match):
        estimator(name, **knobs)


@pytest.mark.parametrize("c", [0.01, 0.1, 0.5, 0.9, 0.99, 0.9999])
@pytest.mark.parametrize("T", [100, 1000, 20000])
@pytest.mark.parametrize("holes", [True, False])
def test_every_scan_path_matches_the_reference_loop_on_long_rows(c, T, holes):
    """The blocked scan (running products or powers, block ends scanned again in float64) and
    the log-step scan agree with the reference loop to float32 rounding (no worse than the loop
    itself in float32), over rows long enough for several levels."""
    from rllab_advantages.scan import _log_step_skip_scan, reference_skip_scan, skip_scan

    g = torch.Generator().manual_seed(T)
    B = 3
    x = torch.randn(B, T, generator=g, dtype=torch.float64)
    if holes:
        m = torch.rand(B, T, generator=g) > 0.3
        m[:, T // 3 : T // 3 + T // 10] = False  # a long observation span
    else:
        m = torch.arange(T)[None, :] < torch.tensor([[T], [T // 2], [1]])
    m[0] = False  # an all-masked row
    x[~m] = float("nan")  # ignored wherever it sits
    ref = reference_skip_scan(torch.where(m, x, 0.0), m, c)
    scale = ref.abs().max()
    loop32 = reference_skip_scan(torch.where(m, x, 0.0).float(), m, c).double()
    loop_dev = ((loop32 - ref).abs().max() / scale).item()
    paths = {"skip_scan": lambda x: skip_scan(x, m, c), "log-step": lambda x: _log_step_skip_scan(x, m, c, holes)}
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, max(2e-6, 1.5 * loop_dev))):
        for name, scan in paths.items():
            got = scan(x.to(dtype)).double()
            assert ((got - ref).abs().max() / scale).item() < tol, (name, dtype, c, T)
            assert (got[0] == 0).all()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.booleans(), min_size=1, max_size=70), min_size=1, max_size=4),
    c=st.one_of(st.sampled_from([0.0, 1e-30, 0.01, 2.0**-5, 0.5, 1.0]), st.floats(0.0, 1.0)),
    seed=st.integers(0, 3),
)
def test_skip_scan_is_the_reference_recurrence(rows, c, seed):
    """skip_scan, whichever path the mask and c pick, equals the documented per-token loop."""
    from rllab_advantages.scan import discounted_reverse_cumsum, reference_skip_scan, skip_scan

    T = max(len(r) for r in rows)
    m = torch.tensor([r + [False] * (T - len(r)) for r in rows])
    x = torch.randn(m.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ref = reference_skip_scan(x, m, c)
    torch.testing.assert_close(skip_scan(x, m, c), ref, rtol=1e-9, atol=1e-9)
    all_valid = torch.ones_like(m)
    torch.testing.assert_close(discounted_reverse_cumsum(x, c), reference_skip_scan(x, all_valid, c), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("remask", [True, False])
@pytest.mark.parametrize("holes", [False, True])
def test_non_finite_values_count_only_at_valid_positions(remask, holes):
    """Non-finite values at masked positions pass (with remask=False they show up in the
    results, as in verl); one at a valid position names its row."""
    r, v, m = _batch(6, 12, seed=3, holes=holes)
    m[:, 0] = True
    m[:, -1] = False
    est = estimator("gae", gamma=0.9, lam=0.8, remask=remask)
    v_masked = v.clone()
    v_masked[:, -1] = float("nan")
    adv, ret = est(token_rewards=r, values=v_masked, mask=m, index=None)
    assert torch.isfinite(adv[m]).all() and torch.isfinite(ret[m]).all()
    assert remask == bool(torch.isfinite(ret).all())
    v_valid = v.clone()
    v_valid[4, 0] = float("nan")
    with pytest.raises(RowError, match=r"values.*\[4\]"):
        est(token_rewards=r, values=v_valid, mask=m, index=None)
