"""rllab_policy_losses: policy losses and the clipped value loss.

Expected numbers are worked out by hand in the comments next to them (r is the ratio, A the
advantage, ε_low/ε_high the clip bounds); aggregation is token-mean unless a test says otherwise.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rllab
from rllab import ops

LAB = rllab.Lab()

POLICY_LOSSES = ["ppo_clip", "ppo_dual_clip", "gspo", "cispo", "vanilla_pg", "sapo", "clip_cov", "kl_cov"]
# knobs under which the generic tests exercise each loss's special path (clip_cov: some candidates)
KNOBS = {"clip_cov": {"clip_cov_lb": 0.05, "clip_cov_ratio": 0.1}, "kl_cov": {"kl_cov_ratio": 0.1}}


def token_mean(loss_mat, mask):
    return ops.masked_mean(loss_mat, mask)


def seq_mean_token_sum(loss_mat, mask):
    rows = mask.any(-1)
    per_row = ops.masked_sum(loss_mat, mask, dim=-1)
    return torch.where(rows, per_row, torch.zeros_like(per_row)).sum() / rows.sum().clamp(min=1)


def loss_fn(name, **knobs):
    return LAB.get("policy_loss", name, **{**KNOBS.get(name, {}), **knobs})


def run(name, log_prob, old_log_prob, advantages, mask=None, aggregate=token_mean, weights=None, **knobs):
    """(loss, metrics, d loss / d log_prob) of a registered policy loss."""
    log_prob = log_prob.detach().clone().requires_grad_(True)
    if mask is None:
        mask = torch.ones(log_prob.shape, dtype=torch.bool)
    loss, metrics = loss_fn(name, **knobs)(
        log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask, aggregate=aggregate,
        weights=weights,
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), metrics, grad


def from_ratios(log_prob, ratios, dtype=torch.float64):
    """(log_prob, old_log_prob) tensors with exp(log_prob − old) = ratios."""
    lp = torch.tensor(log_prob, dtype=dtype)
    return lp, lp - torch.log(torch.tensor(ratios, dtype=dtype))


def t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def close(a, b, rel=1e-6, abs_=1e-9):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    torch.testing.assert_close(a, b, rtol=rel, atol=abs_)


# --------------------------------------------------------------------------- registration


def test_everything_is_registered_with_aliases():
    names = LAB.names("policy_loss")
    for n in POLICY_LOSSES:
        assert n in names
    assert LAB.spec("policy_loss", "ppo").name == "ppo_clip"
    assert LAB.spec("policy_loss", "dual_clip").name == "ppo_dual_clip"
    assert LAB.spec("value_loss", "clipped").provider == "rllab_value_losses"
    assert LAB.get("policy_loss", "ppo_dual_clip").config.clip_c == 3.0
    assert LAB.get("value_loss", "clipped").config.value_clip == 0.5


# --------------------------------------------------------------------------- hand-computed values


def test_ppo_clip_asymmetric_by_hand():
    # r = [1.5, 0.5, 1.1, 0.7], A = [1, −1, −2, 2], ε_low = 0.2, ε_high = 0.28
    # tok0: max(−1.5, −1.28) = −1.28 clipped   tok1: max(0.5, 0.8) = 0.8 clipped
    # tok2: max(2.2, 2.2) = 2.2                tok3: max(−1.4, −1.6) = −1.4
    # loss = (−1.28 + 0.8 + 2.2 − 1.4)/4 = 0.08; clipfrac = 2/4
    lp, old = from_ratios([[-1.0, -0.5, -2.0, -0.1]], [[1.5, 0.5, 1.1, 0.7]])
    adv = t([[1.0, -1.0, -2.0, 2.0]])
    loss, m, grad = run("ppo_clip", lp, old, adv, clip_low=0.2, clip_high=0.28)
    close(loss, 0.08)
    close(m["actor/clipfrac"], 0.5)
    close(m["actor/clipfrac_high"], 0.25)  # tok0: A > 0, r = 1.5 above 1.28
    close(m["actor/clipfrac_low"], 0.25)  # tok1: A < 0, r = 0.5 below 0.8
    # approx_kl = −mean(log r) = −log(1.5·0.5·1.1·0.7)/4; k3 = mean(r − 1 − log r)
    close(m["actor/approx_kl"], 0.13726170914654712)
    close(m["actor/approx_kl_k3"], 0.08726170914654711)
    # d/d log π of −A·r is −A·r on unclipped tokens, 0 on clipped ones; /4 for the mean
    close(grad, t([[0.0, 0.0, 2.2 / 4, -1.4 / 4]]))


def test_ppo_clip_float32_and_weights_by_hand():
    lp, old = from_ratios([[-1.0, -0.5, -2.0, -0.1]], [[1.5, 0.5, 1.1, 0.7]], dtype=torch.float32)
    adv = t([[1.0, -1.0, -2.0, 2.0]], torch.float32)
    weights = t([[2.0, 1.0, 0.5, 0.0]], torch.float32)
    # per-token losses [−1.28, 0.8, 2.2, −1.4] · w = [−2.56, 0.8, 1.1, 0] → −0.66/4
    loss, _, grad = run("ppo_clip", lp, old, adv, weights=weights, clip_low=0.2, clip_high=0.28)
    assert loss.dtype == torch.float32
    close(loss, -0.165, rel=1e-6)
    close(grad, t([[0.0, 0.0, 2.2 * 0.5 / 4, 0.0]]), rel=1e-6, abs_=1e-7)


def test_ppo_dual_clip_by_hand():
    # r = [5, 2, 5, 0.5], A = [−1, −1, 1, −0.5], ε = 0.2, c = 3
    # tok0: ppo max(5, 1.2) = 5, A<0 cap −A·c = 3 → 3 (cap bit, no gradient)
    # tok1: ppo max(2, 1.2) = 2 < 3 → 2 (gradient −A·r = 2)
    # tok2: ppo max(−5, −1.2) = −1.2 clipped, A>0 so no cap
    # tok3: ppo max(0.25, 0.4) = 0.4 clipped, cap 1.5 → 0.4
    lp, old = from_ratios([[-1.0, -1.0, -1.0, -1.0]], [[5.0, 2.0, 5.0, 0.5]])
    adv = t([[-1.0, -1.0, 1.0, -0.5]])
    loss, m, grad = run("ppo_dual_clip", lp, old, adv)
    close(loss, (3 + 2 - 1.2 + 0.4) / 4)
    close(m["actor/clipfrac"], 0.5)
    close(m["actor/clipfrac_high"], 0.25)  # tok2: A > 0, r = 5 above 1.2
    close(m["actor/clipfrac_low"], 0.25)  # tok3: A < 0, r = 0.5 below 0.8 (tok0's cap is clipfrac_lower)
    close(m["actor/clipfrac_lower"], 0.25)
    close(m["actor/approx_kl"], -0.80471895621705)  # −log(5·2·5·0.5)/4
    close(m["actor/approx_kl_k3"], 1.3202810437829497)
    close(grad, t([[0.0, 2.0 / 4, 0.0, 0.0]]))
    # the same tokens under plain PPO-clip: tok0 keeps 5 and its gradient −A·r = 5
    loss_ppo, _, grad_ppo = run("ppo_clip", lp, old, adv)
    close(loss_ppo, (5 + 2 - 1.2 + 0.4) / 4)
    close(grad_ppo, t([[5.0 / 4, 2.0 / 4, 0.0, 0.0]]))


def test_gspo_by_hand():
    # row0: log r = [0.1, −0.3] → log s = −0.1, s = 0.9048374; A = 1: max(−s, −clip(s)) = −s (unclipped)
    # row1: log r = [0.2, 0.1, masked] → log s = 0.15, s = 1.1618342 > 1 + 4e-4; A = 1: −1.0004 (clipped)
    lp = t([[-1.0, -2.0, 0.0], [-0.5, -0.7, float("nan")]])
    old = lp - t([[0.1, -0.3, 0.0], [0.2, 0.1, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    adv = t([[1.0, 1.0, 5.0], [1.0, 1.0, 5.0]])
    loss, m, grad = run("gspo", lp, old, adv, mask=mask)
    s0 = 0.9048374180359595
    close(loss, (-2 * s0 - 2 * 1.0004) / 4)
    close(m["actor/clipfrac"], 0.5)
    close(m["actor/approx_kl"], -(0.1 - 0.3 + 0.2 + 0.1) / 4)
    # d s_{i,t} / d log π_t = s_i (the stop-gradients keep the row mean out of it)
    close(grad, t([[-s0 / 4, -s0 / 4, 0.0], [0.0, 0.0, 0.0]]))


def test_gspo_log_ratio_max():
    # log s = 12 is clamped to 10: with ε huge nothing is clipped, loss = −A·e^10
    lp, old = t([[0.0]]), t([[-12.0]])
    loss, _, grad = run("gspo", lp, old, t([[1.0]]), clip_low=0.5, clip_high=1e9)
    close(loss, -math.exp(10.0))
    close(grad, t([[0.0]]))  # clamp cuts the gradient, as verl's torch.clamp does
    loss, _, _ = run("gspo", lp, old, t([[1.0]]), clip_low=0.5, clip_high=1e9, log_ratio_max=None)
    close(loss, -math.exp(12.0))


def test_cispo_absolute_and_relative_by_hand():
    # r = [2, 6, 0.5], A = [1, 1, −1], log π = [−1, −2, −0.5]
    lp, old = from_ratios([[-1.0, -2.0, -0.5]], [[2.0, 6.0, 0.5]])
    adv = t([[1.0, 1.0, -1.0]])
    # absolute (TRL): sg(min(r, 5)) = [2, 5, 0.5]; −w·A·log π = [2, 10, −0.25]
    loss, m, grad = run("cispo", lp, old, adv)
    close(loss, 11.75 / 3)
    close(m["actor/clipfrac"], 1 / 3)
    close(grad, t([[-2 / 3, -5 / 3, 0.5 / 3]]))  # −sg(w)·A / 3: every token keeps a gradient
    # relative (verl): clip(r, 0.8, 1.28) = [1.28, 1.28, 0.8]; losses [1.28, 2.56, −0.4]
    loss, m, grad = run("cispo", lp, old, adv, clip_form="relative", clip_low=0.2, clip_high=0.28)
    close(loss, 3.44 / 3)
    close(m["actor/clipfrac"], 1.0)
    close(grad, t([[-1.28 / 3, -1.28 / 3, 0.8 / 3]]))
    # relative without a lower bound: r = 0.5 stays
    loss, m, _ = run("cispo", lp, old, adv, clip_form="relative", clip_high=0.28)
    close(loss, (1.28 + 2.56 - 0.25) / 3)
    close(m["actor/clipfrac"], 2 / 3)


def test_vanilla_pg_by_hand():
    lp, old = t([[-1.0, -2.0], [-0.5, 0.0]]), t([[-1.5, -2.0], [-0.5, -0.1]])
    adv = t([[2.0, -1.0], [0.5, 3.0]])
    mask = torch.tensor([[True, True], [True, False]])
    # −A·log π on valid tokens: [2, −2, 0.25] → 0.25/3
    loss, m, grad = run("vanilla_pg", lp, old, adv, mask=mask)
    close(loss, 0.25 / 3)
    close(grad, t([[-2 / 3, 1 / 3], [-0.5 / 3, 0.0]]))
    close(m["actor/approx_kl"], -0.5 / 3)  # old − log π = [−0.5, 0, 0]
    assert float(m["actor/clipfrac"]) == 0.0


def test_sapo_by_hand():
    # tok0: r = 1, A = 1, τ_pos = 1: gate = σ(0)·4 = 2 → loss −2, gradient −A·f'(1)·r = −1
    # tok1: r = e^0.5, A = −1, τ_neg = 1.05: gate = σ(1.05·(e^0.5 − 1))·4/1.05 = 2.5295122
    lp, old = t([[-1.0, -1.0]]), t([[-1.0, -1.5]])
    loss, m, grad = run("sapo", lp, old, t([[1.0, -1.0]]))
    close(loss, (-2.0 + 2.52951220360386) / 2)
    close(grad, t([[-0.5, 0.7356759157604019]]))  # f'(r) = 4σ(1 − σ); × r, × −A, /2
    assert float(m["actor/clipfrac"]) == 0.0


def test_kl_cov_by_hand():
    # A = [1, −1, 2, 0] (mean 0.5), log π = [−1, −2, −0.5, −3] (mean −1.625)
    # cov = [0.3125, 0.5625, 1.6875, 0.6875]: top-1 (ratio 0.25 of 4 tokens) is tok2
    # r = [1.2, 0.9, 1.5, 1]: −A·r = [−1.2, 0.9, −3, 0], tok2 += 0.1·log 1.5
    lp, old = from_ratios([[-1.0, -2.0, -0.5, -3.0]], [[1.2, 0.9, 1.5, 1.0]])
    adv = t([[1.0, -1.0, 2.0, 0.0]])
    loss, m, grad = run("kl_cov", lp, old, adv, kl_cov_ratio=0.25)
    close(loss, -0.8148633722972959)
    close(m["actor/kl_cov_frac"], 0.25)
    # gradient: −A·r everywhere, + κ·sign(log r) on tok2
    close(grad, t([[-1.2 / 4, 0.9 / 4, (-3.0 + 0.1) / 4, 0.0]]))


def test_clip_cov_by_hand():
    # same tokens, ε = 0.2: PPO clips tok2 (max(−3, −2.4)); candidates 0.5 < cov < 1 and not
    # clipped: tok1 (0.5625), tok3 (0.6875). clip_cov_ratio = 1 removes all candidates.
    lp, old = from_ratios([[-1.0, -2.0, -0.5, -3.0]], [[1.2, 0.9, 1.5, 1.0]])
    adv = t([[1.0, -1.0, 2.0, 0.0]])  # cov = [0.3125, 0.5625, 1.6875, 0.6875] as in kl_cov
    loss, m, grad = run("clip_cov", lp, old, adv, clip_cov_ratio=1.0, clip_cov_lb=0.5, clip_cov_ub=1.0)
    close(loss, (-1.2 + 0.0 - 2.4 + 0.0) / 4)
    close(m["actor/clip_cov_frac"], 0.5)
    close(m["actor/clipfrac"], 0.25)
    close(grad, t([[-1.2 / 4, 0.0, 0.0, 0.0]]))


def test_clip_cov_removes_max_1_floor_ratio_n_candidates_reproducibly():
    lp, old, adv, mask = random_batch(11, B=8, T=50)
    n_valid = int(mask.sum())
    for ratio in (0.001, 0.02, 0.05):
        _, m, grad = run("clip_cov", lp, old, adv, mask=mask, clip_cov_ratio=ratio, clip_cov_lb=0.0, clip_cov_ub=1e9)
        expected = max(1, int(ratio * n_valid))
        close(m["actor/clip_cov_frac"], expected / n_valid)
        # a rerun removes the same tokens (no global generator involved)
        _, m2, grad2 = run("clip_cov", lp, old, adv, mask=mask, clip_cov_ratio=ratio, clip_cov_lb=0.0, clip_cov_ub=1e9)
        assert torch.equal(grad, grad2)
    # another seed picks (almost surely) other tokens, the same number of them
    _, m3, grad3 = run("clip_cov", lp, old, adv, mask=mask, clip_cov_ratio=0.05, clip_cov_lb=0.0, clip_cov_ub=1e9, seed=7)
    close(m3["actor/clip_cov_frac"], m2["actor/clip_cov_frac"])
    assert not torch.equal(grad3, grad2)


def test_log_ratio_clamp_and_the_unclamped_option():
    # log r = 30 → clamped to 20 (verl); None keeps 30 (TRL)
    lp, old = t([[0.0, 0.0]]), t([[-30.0, 0.0]])
    adv = t([[-1.0, 0.0]])
    loss, m, grad = run("ppo_clip", lp, old, adv)
    close(loss, math.exp(20.0) / 2)
    close(m["actor/approx_kl"], -20.0 / 2)
    close(grad, t([[0.0, 0.0]]))  # the clamp is active: no gradient, as verl
    loss, m, grad = run("ppo_clip", lp, old, adv, log_ratio_clamp=None)
    close(loss, math.exp(30.0) / 2)
    close(m["actor/approx_kl"], -30.0 / 2)
    close(grad, t([[math.exp(30.0) / 2, 0.0]]))


def test_clipped_value_loss_by_hand():
    # tok0: V=1, V_old=0, R=0: (V−R)² = 1, V_clip = 0.5 → 0.25; max 1 (unclipped)
    # tok1: V=0.9, V_old=0, R=1: 0.01 vs V_clip = 0.5 → 0.25; max 0.25 (clipped, no gradient)
    # tok2: V=2, V_old=1.8, R=3: 1, V_clip = 2 → 1; max 1
    # loss = ½·(1 + 0.25 + 1)/3 = 0.375
    values = t([[1.0, 0.9, 2.0, 7.0]]).requires_grad_(True)
    old_values, returns = t([[0.0, 0.0, 1.8, float("nan")]]), t([[0.0, 1.0, 3.0, 0.0]])
    mask = torch.tensor([[True, True, True, False]])
    value_loss = LAB.get("value_loss", "clipped")
    loss, m = value_loss(values=values, old_values=old_values, returns=returns, mask=mask, aggregate=token_mean)
    close(loss, 0.375)
    close(m["critic/vf_clipfrac"], 1 / 3)
    close(m["critic/vpred_mean"], 3.9 / 3)
    (grad,) = torch.autograd.grad(loss, values)
    close(grad, t([[1 / 3, 0.0, -1 / 3, 0.0]]))  # ½·2(V − R)/3 where unclipped
    # no clipping: ½·(1 + 0.01 + 1)/3
    loss, m = LAB.get("value_loss", "clipped", value_clip=None)(
        values=values, old_values=old_values, returns=returns, mask=mask, aggregate=token_mean
    )
    close(loss, 0.335)
    assert float(m["critic/vf_clipfrac"]) == 0.0


def test_aggregate_is_the_callers():
    # −A·log π = [[2, −2], [1, *]] → seq-mean-token-sum = ((2 − 2) + 1)/2
    lp, old = t([[-1.0, -2.0], [-0.5, 0.0]]), t([[-1.0, -2.0], [-0.5, 0.0]])
    adv = t([[2.0, -1.0], [2.0, 3.0]])
    mask = torch.tensor([[True, True], [True, False]])
    loss, _, _ = run("vanilla_pg", lp, old, adv, mask=mask, aggregate=seq_mean_token_sum)
    close(loss, 0.5)


# --------------------------------------------------------------------------- identities


def random_batch(seed, B=5, T=7, scale=0.5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(B, T, generator=g, dtype=dtype) - 1.0
    old = lp + scale * torch.randn(B, T, generator=g, dtype=dtype)
    adv = torch.randn(B, T, generator=g, dtype=dtype)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[0] = False  # an all-masked row
    mask[1, 0] = True
    return lp, old, adv, mask


def test_dual_clip_with_infinite_c_is_ppo_clip():
    lp, old, adv, mask = random_batch(1, scale=1.5)
    a = run("ppo_dual_clip", lp, old, adv, mask=mask, clip_c=math.inf, clip_high=0.28)
    b = run("ppo_clip", lp, old, adv, mask=mask, clip_high=0.28)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    assert float(a[1]["actor/clipfrac_lower"]) == 0.0
    # and a finite c that bites somewhere differs
    c = run("ppo_dual_clip", lp, old, adv, mask=mask, clip_c=1.5)
    assert float(c[1]["actor/clipfrac_lower"]) > 0 and not torch.equal(c[0], b[0])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), clip_c=st.floats(1.0001, 10.0), scale=st.floats(0.0, 3.0))
def test_dual_clip_equals_ppo_clip_when_advantages_are_nonnegative(seed, clip_c, scale):
    lp, old, adv, mask = random_batch(seed, scale=scale)
    adv = adv.abs()
    adv[0, :2] = 0.0
    a = run("ppo_dual_clip", lp, old, adv, mask=mask, clip_c=clip_c)
    b = run("ppo_clip", lp, old, adv, mask=mask)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    assert float(a[1]["actor/clipfrac_lower"]) == 0.0


CLIPPED_AT_OLD = [
    ("ppo_clip", {}),
    ("ppo_dual_clip", {}),
    ("gspo", {}),
    ("cispo", {}),
    ("cispo", {"clip_form": "relative", "clip_low": 0.2, "clip_high": 0.28}),
    ("sapo", {}),
    ("kl_cov", {"kl_cov_ratio": 0.2}),
    ("clip_cov", {"clip_cov_ub": -1e9}),  # no candidates: pure PPO-clip
    ("vanilla_pg", {}),
]


@pytest.mark.parametrize("name,knobs", CLIPPED_AT_OLD, ids=lambda x: str(x))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_at_old_policy_every_loss_has_the_vanilla_gradient_and_zero_kl(name, knobs, dtype):
    lp, _, adv, mask = random_batch(3, dtype=dtype)
    old = lp.clone()
    _, m, grad = run(name, lp, old, adv, mask=mask, **knobs)
    _, _, grad_pg = run("vanilla_pg", lp, old, adv, mask=mask)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(grad, grad_pg, rtol=tol, atol=tol)
    assert float(m["actor/approx_kl"]) == 0.0
    assert float(m["actor/approx_kl_k3"]) == 0.0
    assert float(m["actor/clipfrac"]) == 0.0
    if "actor/clipfrac_lower" in m:
        assert float(m["actor/clipfrac_lower"]) == 0.0


def test_clip_cov_at_old_policy_removes_its_candidates():
    # the documented exception: Clip-Cov cuts high-covariance tokens even when r = 1
    lp, _, adv, mask = random_batch(4)
    _, m, grad = run("clip_cov", lp, lp.clone(), adv, mask=mask, clip_cov_lb=0.0, clip_cov_ub=1e9)
    _, _, grad_pg = run("vanilla_pg", lp, lp.clone(), adv, mask=mask)
    assert float(m["actor/clip_cov_frac"]) > 0 and not torch.equal(grad, grad_pg)
    assert float(m["actor/clipfrac"]) == 0.0 and float(m["actor/approx_kl"]) == 0.0


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_metrics_are_detached_namespaced_scalars(name):
    lp, old, adv, mask = random_batch(5)
    _, m, _ = run(name, lp, old, adv, mask=mask)
    for key in ("actor/approx_kl", "actor/approx_kl_k3", "actor/clipfrac"):
        assert key in m
    for key, value in m.items():
        assert key.startswith("actor/")
        assert isinstance(value, torch.Tensor) and value.ndim == 0 and not value.requires_grad
        assert math.isfinite(float(value))


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_unit_weights_change_nothing(name):
    lp, old, adv, mask = random_batch(6)
    a = run(name, lp, old, adv, mask=mask)
    b = run(name, lp, old, adv, mask=mask, weights=torch.ones_like(lp))
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])


# --------------------------------------------------------------------------- masking and padding


def _poison(x, mask, fill):
    return torch.where(mask, x, torch.full_like(x, fill))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), fill=st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30, -7.0]))
@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_masked_positions_change_nothing(name, seed, fill):
    lp, old, adv, mask = random_batch(seed, scale=1.0)
    weights = torch.rand(lp.shape, dtype=lp.dtype, generator=torch.Generator().manual_seed(seed))
    a = run(name, lp, old, adv, mask=mask, weights=weights)
    p = [_poison(x, mask, fill) for x in (lp, old, adv, weights)]
    b = run(name, p[0], p[1], p[2], mask=mask, weights=p[3])
    assert torch.isfinite(b[0]) and torch.isfinite(b[2]).all()
    assert torch.equal(a[0], b[0])
    assert torch.equal(a[2], b[2])
    assert (b[2][~mask] == 0).all()
    for k in a[1]:
        assert torch.equal(a[1][k], b[1][k]), k


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), pad=st.integers(1, 4))
@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_padding_changes_nothing(name, seed, pad):
    lp, old, adv, mask = random_batch(seed, scale=1.0)
    g = torch.Generator().manual_seed(seed + 1)

    def padded(x):
        return torch.cat([x, torch.randn(x.shape[0], pad, generator=g, dtype=x.dtype)], dim=1)

    mask_p = torch.cat([mask, torch.zeros(mask.shape[0], pad, dtype=torch.bool)], dim=1)
    a = run(name, lp, old, adv, mask=mask)
    b = run(name, padded(lp), padded(old), padded(adv), mask=mask_p)
    torch.testing.assert_close(a[0], b[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a[2], b[2][:, : lp.shape[1]], rtol=1e-12, atol=1e-12)
    for k in a[1]:
        torch.testing.assert_close(a[1][k], b[1][k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_all_masked_batch_is_finite(name):
    lp, old, adv, _ = random_batch(7)
    mask = torch.zeros(lp.shape, dtype=torch.bool)
    loss, m, grad = run(name, lp, old, adv, mask=mask)
    assert float(loss) == 0.0 and (grad == 0).all()
    assert all(math.isfinite(float(v)) for v in m.values())


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_nan_at_valid_position_names_the_rows(name):
    lp, old, adv, mask = random_batch(8)
    mask[2, 3] = mask[4, 1] = True
    lp[2, 3] = float("nan")
    old[4, 1] = float("inf")
    with pytest.raises(rllab.RowError) as e:
        run(name, lp, old, adv, mask=mask)
    assert e.value.rows == [2] and "log_prob" in str(e.value) and "[2]" in str(e.value)
    lp[2, 3] = 0.0
    with pytest.raises(rllab.RowError, match=r"old_log_prob .*\[4\]"):
        run(name, lp, old, adv, mask=mask)
    old[4, 1] = 0.0
    adv[4, 1] = float("nan")
    with pytest.raises(rllab.RowError, match=r"advantages .*\[4\]"):
        run(name, lp, old, adv, mask=mask)


def test_wrong_mask_dtype_or_shape_names_the_argument():
    lp, old, adv, mask = random_batch(9)
    with pytest.raises(TypeError, match="mask.*torch.bool.*float"):
        run("ppo_clip", lp, old, adv, mask=mask.double())
    with pytest.raises(ValueError, match=r"mask has shape \(5, 6\) but log_prob has shape \(5, 7\)"):
        run("ppo_clip", lp, old, adv, mask=mask[:, :6])
    with pytest.raises(ValueError, match=r"advantages has shape \(5, 1\) but log_prob has shape \(5, 7\)"):
        run("ppo_dual_clip", lp, old, adv[:, :1], mask=mask)
    with pytest.raises(ValueError, match=r"weights has shape \(5,\) but log_prob has shape \(5, 7\)"):
        run("gspo", lp, old, adv, mask=mask, weights=torch.ones(5, dtype=lp.dtype))
    with pytest.raises(ValueError, match=r"log_prob must be \(B, T\)"):
        run("cispo", lp[0], old[0], adv[0], mask=mask[0])


@pytest.mark.parametrize(
    "name,knob,value",
    [
        ("ppo_dual_clip", "clip_c", 0.5),
        ("ppo_dual_clip", "clip_c", 1.0),
        ("ppo_clip", "clip_low", -0.1),
        ("ppo_clip", "clip_high", -0.1),
        ("ppo_clip", "log_ratio_clamp", 0.0),
        ("gspo", "log_ratio_max", -1.0),
        ("cispo", "clip_form", "upper"),
        ("cispo", "clip_high", 0.0),
        ("sapo", "tau_pos", 0.0),
        ("kl_cov", "kl_cov_ratio", 0.0),
        ("clip_cov", "clip_cov_ratio", 1.5),
    ],
)
def test_knob_validation_names_the_knob(name, knob, value):
    with pytest.raises(rllab.ConfigError, match=knob):
        LAB.get("policy_loss", name, **{knob: value})


def test_dual_clip_c_error_message():
    with pytest.raises(rllab.ConfigError, match=r"clip_c = 0.5 is out of range: must be > 1.0"):
        rllab.Lab().get("policy_loss", "ppo_dual_clip", clip_c=0.5)


def test_cispo_clip_low_needs_the_relative_form():
    with pytest.raises(rllab.ConfigError, match="clip_low only applies with clip_form = 'relative'"):
        LAB.get("policy_loss", "cispo", clip_low=0.2)


def test_value_loss_knob_and_input_errors():
    with pytest.raises(rllab.ConfigError, match="value_clip"):
        LAB.get("value_loss", "clipped", value_clip=-0.5)
    v = t([[1.0, 2.0]])
    mask = torch.tensor([[True, True]])
    with pytest.raises(ValueError, match=r"returns has shape \(1, 1\) but values has shape \(1, 2\)"):
        LAB.get("value_loss", "clipped")(values=v, old_values=v, returns=v[:, :1], mask=mask, aggregate=token_mean)
    with pytest.raises(rllab.RowError, match=r"returns .*\[0\]"):
        LAB.get("value_loss", "clipped")(
            values=v, old_values=v, returns=t([[0.0, float("nan")]]), mask=mask, aggregate=token_mean
        )


def test_value_loss_masked_positions_and_padding():
    lp, old, adv, mask = random_batch(10)
    value_loss = LAB.get("value_loss", "clipped")
    values = lp.clone().requires_grad_(True)
    a, _ = value_loss(values=values, old_values=old, returns=adv, mask=mask, aggregate=token_mean)
    nan = float("nan")
    values_p = _poison(lp, mask, nan).requires_grad_(True)
    b, _ = value_loss(
        values=values_p, old_values=_poison(old, mask, nan), returns=_poison(adv, mask, nan), mask=mask,
        aggregate=token_mean,
    )
    assert torch.equal(a, b)
    (g,) = torch.autograd.grad(b, values_p)
    assert torch.isfinite(g).all() and (g[~mask] == 0).all()
    # V = V_old = R: both terms vanish
    same, m = value_loss(values=values, old_values=lp, returns=lp, mask=mask, aggregate=token_mean)
    assert float(same.detach()) == 0.0 and float(m["critic/vf_clipfrac"]) == 0.0


# --------------------------------------------------------------------------- fused actor loss


def _separate(lp, old, adv, mask, agg, ent, ref, beta, c_h, weights=None, clip_c=None, clip_high=0.2):
    """The loss a trainer builds from the registered components, and its gradients."""
    lp = lp.clone().requires_grad_(True)
    ent = None if ent is None else ent.clone().requires_grad_(True)
    if clip_c is None:
        pg_fn = LAB.get("policy_loss", "ppo_clip", clip_high=clip_high)
    else:
        pg_fn = LAB.get("policy_loss", "ppo_dual_clip", clip_high=clip_high, clip_c=clip_c)
    pg, m = pg_fn(log_prob=lp, old_log_prob=old, advantages=adv, mask=mask, aggregate=agg, weights=weights)
    total, parts = pg, {"loss/policy": pg}
    if ref is not None:
        kl = agg(LAB.get("kl_penalty", "k3")(log_prob=lp, ref_log_prob=ref), mask)
        total, parts["loss/kl"] = total + beta * kl, kl
    if ent is not None:
        e = agg(ent, mask)
        total, parts["loss/entropy"] = total - c_h * e, e
    inputs = [lp] + ([ent] if ent is not None else [])
    grads = torch.autograd.grad(total, inputs)
    return total.detach(), grads, {**m, **{k: v.detach() for k, v in parts.items()}}


def _fused(lp, old, adv, mask, agg, ent, ref, beta, c_h, weights=None, clip_c=None, clip_high=0.2):
    from rllab_policy_losses.fused import fused_ppo_loss

    lp = lp.clone().requires_grad_(True)
    ent = None if ent is None else ent.clone().requires_grad_(True)
    total, m = fused_ppo_loss(
        log_prob=lp, old_log_prob=old, advantages=adv, mask=mask, aggregate=agg, entropy=ent, ref_log_prob=ref,
        kl_coef=beta, entropy_coef=c_h, weights=weights, clip_c=clip_c, clip_high=clip_high,
    )
    inputs = [lp] + ([ent] if ent is not None else [])
    return total.detach(), torch.autograd.grad(total, inputs), m


def _lab_aggregate(mode, **bound):
    comp = LAB.get("loss_aggregation", mode)
    return lambda loss_mat, mask: comp(loss_mat=loss_mat, mask=mask, **bound)


FUSED_CASES = [
    ("token-mean", {}, {}),
    ("seq-mean-token-mean", {}, {"clip_c": 3.0}),
    ("seq-mean-token-sum-norm", {}, {"clip_high": 0.28}),
    ("token-sum", {}, {"weights": True}),
    ("token-mean", {"global_tokens": 100}, {"clip_c": 1.5, "weights": True}),
]


@pytest.mark.parametrize("mode,bound,extra", FUSED_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_equals_the_separate_components(mode, bound, extra, dtype):
    lp, old, adv, mask = random_batch(12, B=6, T=40, scale=1.0, dtype=dtype)
    g = torch.Generator().manual_seed(3)
    ref = lp + 0.5 * torch.randn(lp.shape, generator=g, dtype=dtype)
    ent = 3 * torch.rand(lp.shape, generator=g, dtype=dtype)
    extra = dict(extra)
    if extra.pop("weights", False):
        extra["weights"] = 2 * torch.rand(lp.shape, generator=g, dtype=dtype)
    agg = _lab_aggregate(mode, **bound)
    a = _separate(lp, old, adv, mask, agg, ent, ref, 0.1, 0.01, **extra)
    b = _fused(lp, old, adv, mask, agg, ent, ref, 0.1, 0.01, **extra)
    rel = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(b[0], a[0], rtol=rel, atol=rel * 1e-3)
    for ga, gb in zip(a[1], b[1]):
        scale = float(ga.abs().max())
        torch.testing.assert_close(gb, ga, rtol=rel, atol=rel * scale)
    for k, v in a[2].items():
        torch.testing.assert_close(b[2][k].to(torch.float64), v.to(torch.float64), rtol=10 * rel, atol=10 * rel, msg=k)


def test_fused_without_kl_or_entropy_and_with_masked_nan():
    lp, old, adv, mask = random_batch(13, scale=2.0)
    agg = _lab_aggregate("token-mean")
    a = _separate(lp, old, adv, mask, agg, None, None, 0.0, 0.0)
    nan = float("nan")
    b = _fused(_poison(lp, mask, nan), _poison(old, mask, -math.inf), _poison(adv, mask, nan), mask, agg,
               None, None, 0.0, 0.0)
    torch.testing.assert_close(b[0], a[0], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(b[1][0], a[1][0], rtol=1e-12, atol=1e-15)
    assert set(b[2]) == {"actor/approx_kl", "actor/approx_kl_k3", "actor/clipfrac", "actor/clipfrac_high", "actor/clipfrac_low", "loss/policy"}
    # an entropy that does not need a gradient: the bonus enters the value only
    ent = torch.rand(lp.shape, dtype=lp.dtype)
    c = _separate(lp, old, adv, mask, agg, ent, None, 0.0, 0.5)
    from rllab_policy_losses.fused import fused_ppo_loss

    lp_g = lp.clone().requires_grad_(True)
    total, m = fused_ppo_loss(log_prob=lp_g, old_log_prob=old, advantages=adv, mask=mask, aggregate=agg,
                              entropy=ent, entropy_coef=0.5)
    torch.testing.assert_close(total.detach(), c[0], rtol=1e-12, atol=1e-15)
    (g,) = torch.autograd.grad(total, lp_g)
    torch.testing.assert_close(g, c[1][0], rtol=1e-12, atol=1e-15)
    close(m["actor/entropy"], ops.masked_mean(ent, mask))


def test_fused_rejects_bad_input():
    from rllab_policy_losses.fused import fused_ppo_loss

    lp, old, adv, mask = random_batch(14)
    mask[3, 3] = True
    ref = lp.clone()
    ref[3, 3] = float("nan")
    with pytest.raises(rllab.RowError, match=r"ref_log_prob .*\[3\]"):
        fused_ppo_loss(log_prob=lp, old_log_prob=old, advantages=adv, mask=mask, aggregate=token_mean,
                       ref_log_prob=ref)
    with pytest.raises(ValueError, match=r"entropy has shape \(5, 6\) but log_prob has shape \(5, 7\)"):
        fused_ppo_loss(log_prob=lp, old_log_prob=old, advantages=adv, mask=mask, aggregate=token_mean,
                       entropy=lp[:, :6])
    with pytest.raises(ValueError, match="clip_c"):
        fused_ppo_loss(log_prob=lp, old_log_prob=old, advantages=adv, mask=mask, aggregate=token_mean, clip_c=1.0)


def test_fused_all_masked_is_zero():
    from rllab_policy_losses.fused import fused_ppo_loss

    lp, old, adv, _ = random_batch(15)
    lp = lp.requires_grad_(True)
    mask = torch.zeros(lp.shape, dtype=torch.bool)
    total, m = fused_ppo_loss(log_prob=lp, old_log_prob=old, advantages=adv, mask=mask, aggregate=token_mean,
                              ref_log_prob=old, kl_coef=0.1)
    (g,) = torch.autograd.grad(total, lp)
    assert float(total.detach()) == 0.0 and (g == 0).all() and all(math.isfinite(float(v)) for v in m.values())


@pytest.mark.slow
def test_fused_compiled_matches_to_float_rounding():
    lp, old, adv, mask = random_batch(16, B=8, T=64, scale=1.0, dtype=torch.float32)
    ref = lp + 0.3
    ent = torch.rand(lp.shape)
    agg = _lab_aggregate("seq-mean-token-mean")
    a = _separate(lp, old, adv, mask, agg, ent, ref, 0.1, 0.01, clip_c=3.0)
    from rllab_policy_losses.fused import fused_ppo_loss

    lp_g, ent_g = lp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
    total, m = fused_ppo_loss(log_prob=lp_g, old_log_prob=old, advantages=adv, mask=mask, aggregate=agg, entropy=ent_g,
                              ref_log_prob=ref, kl_coef=0.1, entropy_coef=0.01, clip_c=3.0, compile=True)
    grads = torch.autograd.grad(total, [lp_g, ent_g])
    torch.testing.assert_close(total.detach(), a[0], rtol=1e-5, atol=1e-8)
    for ga, gb in zip(a[1], grads):
        torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-6 * float(ga.abs().max()))
    for k, v in a[2].items():
        torch.testing.assert_close(m[k].to(torch.float64), v.to(torch.float64), rtol=1e-5, atol=1e-7, msg=k)
