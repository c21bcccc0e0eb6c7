"""rllab_policy_losses.variants and the off-policy sequence mask: hand-computed values and identities.

r is the ratio, lr = log r, A the advantage; aggregation is token-mean unless a test says
otherwise. Every expected number is worked out in the comment beside it.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import rllab
from rllab import ops

LAB = rllab.Lab()


def token_mean(loss_mat, mask):
    return ops.masked_mean(loss_mat, mask)


def seq_mean(loss_mat, mask):
    rows = mask.any(-1)
    per_row = ops.masked_sum(loss_mat, mask, dim=-1)
    return torch.where(rows, per_row, 0.0).sum() / rows.sum().clamp(min=1)


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def run(name, log_prob, old_log_prob, advantages, mask=None, aggregate=token_mean, weights=None, **knobs):
    log_prob = log_prob.detach().clone().requires_grad_(True)
    if mask is None:
        mask = torch.ones(log_prob.shape, dtype=torch.bool)
    loss, metrics = LAB.get("policy_loss", name, **knobs)(
        log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask, aggregate=aggregate,
        weights=weights,
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), metrics, grad


def close(a, b, tol=1e-12):
    if isinstance(a, torch.Tensor) and a.dtype == torch.float32:  # fractions are float32 metrics
        tol = max(tol, 1e-7)
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               rtol=tol, atol=tol)


# --------------------------------------------------------------------------- geo_mean


def test_geo_mean_positive_advantage_clips_above():
    # lr = [0.1, 0.5], A = +1, ε = 0.4: terms min(lr, clip(lr)) = [0.1, 0.4]; ρ = e^0.25;
    # loss = −1·e^0.25; dρ/dlr_0 = ρ/2, the clipped token has no gradient; clipfrac 1/2
    old = t([[-1.0, -1.0]])
    loss, m, grad = run("geo_mean", old + t([[0.1, 0.5]]), old, t([[1.0, 1.0]]))
    close(loss, -math.exp(0.25))
    close(grad, [[-math.exp(0.25) / 2, 0.0]])
    close(m["actor/clipfrac"], 0.5)
    close(m["actor/clipfrac_lower"], 0.0)


def test_geo_mean_negative_advantage_clips_below():
    # lr = [−0.5, 0.1], A = −1: terms max(lr, clip(lr)) = [−0.4, 0.1]; ρ = e^−0.15; loss = +e^−0.15;
    # gradient ρ/2 on the unclipped token; clipfrac_lower 1/2
    old = t([[-1.0, -1.0]])
    loss, m, grad = run("geo_mean", old + t([[-0.5, 0.1]]), old, t([[-1.0, -1.0]]))
    close(loss, math.exp(-0.15))
    close(grad, [[0.0, math.exp(-0.15) / 2]])
    close(m["actor/clipfrac_lower"], 0.5)
    close(m["actor/clipfrac"], 0.0)


def test_geo_mean_rows_empty_rows_and_weights():
    # row 0: lr [0.2, 0], A 2 → ρ = e^0.1, L = −2e^0.1; row 1: lr [0.3, ·], A −1 (one token) → L = e^0.3;
    # row 2 empty. Mean over non-empty rows: (−2e^0.1 + e^0.3)/2; over all 3 (verl): /3.
    old = t([[-1.0, -1.0], [-2.0, -2.0], [-1.0, -1.0]])
    lr = t([[0.2, 0.0], [0.3, 9.0], [0.0, 0.0]])
    adv = t([[2.0, 2.0], [-1.0, 5.0], [3.0, 3.0]])
    mask = torch.tensor([[True, True], [True, False], [False, False]])
    rows = [-2 * math.exp(0.1), math.exp(0.3)]
    loss, _, _ = run("geo_mean", old + lr, old, adv, mask)
    close(loss, sum(rows) / 2)
    loss, _, _ = run("geo_mean", old + lr, old, adv, mask, count_empty_rows=True)
    close(loss, sum(rows) / 3)
    # weights: row 0 × geometric mean √(4·1) = 2 (+1e-10 inside the log), row 1 × 0.5
    w = t([[4.0, 1.0], [0.5, 0.0], [0.0, 0.0]])
    loss, _, _ = run("geo_mean", old + lr, old, adv, mask, weights=w)
    close(loss, (rows[0] * 2 + rows[1] * 0.5) / 2, tol=1e-9)


def test_geo_mean_ignores_aggregate():
    old = t([[-1.0, -1.0]])
    a = run("geo_mean", old + 0.1, old, t([[1.0, 1.0]]), aggregate=token_mean)[0]
    b = run("geo_mean", old + 0.1, old, t([[1.0, 1.0]]), aggregate=lambda m, k: 1e6 * m.sum())[0]
    assert a == b


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lr=st.floats(-1.5, 1.5), adv=st.floats(-3, 3), eps_low=st.floats(0.05, 0.9), eps_high=st.floats(0.05, 0.9),
)
def test_geo_mean_on_one_token_rows_is_ppo_clip_with_log_bounds(lr, adv, eps_low, eps_high):
    """With one token per row, GMPO is PPO-clip with the ratio bounds (e^−ε_low, e^ε_high)."""
    assume(abs(lr - eps_high) > 1e-6 and abs(lr + eps_low) > 1e-6)  # at a bound the two pick different sides
    old = t([[-1.0]])
    ours, _, g1 = run("geo_mean", old + lr, old, t([[adv]]), clip_low=eps_low, clip_high=eps_high)
    ppo, _, g2 = run(
        "ppo_clip", old + lr, old, t([[adv]]), aggregate=seq_mean,
        clip_low=1 - math.exp(-eps_low), clip_high=math.exp(eps_high) - 1,
    )
    close(ours, ppo, tol=1e-9)
    close(g1, g2, tol=1e-9)


def test_geo_mean_declares_its_reduction():
    assert LAB.spec("policy_loss", "geo_mean").trait("aggregation") == "seq-mean"
    assert LAB.spec("policy_loss", "ppo_clip").trait("aggregation") is None


# --------------------------------------------------------------------------- dppo


def test_dppo_tv_trust_region_on_probabilities():
    # p_old = 0.5. Row 0, A = +1: p = 0.6 → p − p_old = 0.1 ≤ 0.2 valid, r = 1.2: loss −1.2·log 0.6,
    # gradient −A·r = −1.2; p = 0.8 → 0.3 > 0.2 outside: loss 0, gradient 0.
    # Row 1, A = −1: p = 0.4 → −0.1 ≥ −0.2 valid, r = 0.8: loss 0.8·log 0.4, gradient 0.8;
    # p = 0.2 → −0.3 outside.
    old = torch.log(t([[0.5, 0.5], [0.5, 0.5]]))
    logp = torch.log(t([[0.6, 0.8], [0.4, 0.2]]))
    adv = t([[1.0, 1.0], [-1.0, -1.0]])
    loss, m, grad = run("dppo_tv", logp, old, adv)
    close(loss, (-1.2 * math.log(0.6) + 0.8 * math.log(0.4)) / 4)
    close(grad, [[-1.2 / 4, 0.0], [0.8 / 4, 0.0]])
    close(m["actor/clipfrac"], 0.5)
    close(m["actor/truncfrac"], 0.0)


def test_dppo_truncates_the_detached_ratio():
    # p_old 0.5 → p 0.6, r = 1.2 > c = 1.1: weight 1.1; loss −1.1·log 0.6; truncfrac 1
    old, logp = torch.log(t([[0.5]])), torch.log(t([[0.6]]))
    loss, m, grad = run("dppo_tv", logp, old, t([[1.0]]), clip_c=1.1)
    close(loss, -1.1 * math.log(0.6))
    close(grad, [[-1.1]])
    close(m["actor/truncfrac"], 1.0)


def test_dppo_kl_binary_kl_region():
    # p_old 0.5 → p 0.8: D = 0.5·log(0.5/0.8) + 0.5·log((0.5 + 1e-8)/(0.2 + 1e-8)) ≈ 0.2231.
    # A > 0 and p > p_old: trusted iff D ≤ ε_high. A < 0 and p ≥ p_old: always trusted.
    d = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log((0.5 + 1e-8) / (0.2 + 1e-8))
    old, logp = torch.log(t([[0.5]])), torch.log(t([[0.8]]))
    r = 0.8 / 0.5
    for eps, trusted in ((d - 1e-4, False), (d + 1e-4, True)):
        loss, m, _ = run("dppo_kl", logp, old, t([[1.0]]), clip_high=eps)
        close(loss, -r * math.log(0.8) if trusted else 0.0)
        close(m["actor/clipfrac"], 0.0 if trusted else 1.0)
    loss, _, _ = run("dppo_kl", logp, old, t([[-1.0]]), clip_low=1e-6)
    close(loss, r * math.log(0.8))


@settings(max_examples=40, deadline=None)
@given(lr=st.lists(st.floats(-1, 1), min_size=3, max_size=3), adv=st.lists(st.floats(-2, 2), min_size=3, max_size=3))
def test_dppo_without_region_or_cap_has_the_unclipped_ppo_gradient(lr, adv):
    """Thresholds of 1 trust every token (probabilities differ by < 1); c = ∞ truncates nothing:
    −A·sg(r)·log π then has PPO's unclipped gradient −A·r·∇log π."""
    old = t([[-1.2, -1.5, -2.0]])  # log π = old + lr stays ≤ 0: valid probabilities
    for name in ("dppo_tv", "dppo_kl"):
        knobs = dict(clip_low=1.0, clip_high=1.0) if name == "dppo_tv" else dict(clip_low=1e9, clip_high=1e9)
        _, _, g1 = run(name, old + t([lr]), old, t([adv]), clip_c=math.inf, **knobs)
        _, _, g2 = run("ppo_clip", old + t([lr]), old, t([adv]), clip_low=1.0, clip_high=1e9)
        close(g1, g2, tol=1e-9)


# --------------------------------------------------------------------------- dro


def test_dro_value_and_gradient():
    # log π = −1, log π_old = −1.2 (lr 0.2), A = 1.5, β = 0.5: loss = −(−1.5 − 0.25·0.04) = 1.51;
    # gradient −(A − β·lr) = −1.4
    loss, m, grad = run("dro", t([[-1.0]]), t([[-1.2]]), t([[1.5]]), beta=0.5)
    close(loss, 1.51)
    close(grad, [[-1.4]])
    close(m["actor/approx_kl"], -0.2)


def test_dro_needs_beta():
    with pytest.raises(Exception, match="beta"):
        LAB.get("policy_loss", "dro")
    with pytest.raises(ValueError, match="beta"):
        LAB.get("policy_loss", "dro", beta=0.0)


# --------------------------------------------------------------------------- vespo


def test_vespo_gamma_weight():
    # lr = [0.1, 0.2] → log w = 0.3. A = +1: k 2, λ 3: φ = exp(3 + 0.6 − 3e^0.3);
    # loss = −φ·mean(log π), gradient −φ/2 per token. A = −1: k 3, λ 2: φ = exp(2 + 0.9 − 2e^0.3)
    old = t([[-1.0, -2.0]])
    logp = old + t([[0.1, 0.2]])
    for a, phi in ((1.0, math.exp(3 + 0.6 - 3 * math.exp(0.3))), (-1.0, math.exp(2 + 0.9 - 2 * math.exp(0.3)))):
        loss, m, grad = run("vespo", logp, old, t([[a, a]]))
        close(loss, -phi * a * float(logp.mean()))
        close(grad, [[-phi * a / 2, -phi * a / 2]])
        close(m["actor/vespo_phi_mean"], phi)


def test_vespo_folds_importance_weights_into_w():
    # weights [2, 1]: log w = 0.3 + log 2; they do not multiply the loss
    old = t([[-1.0, -2.0]])
    logp = old + t([[0.1, 0.2]])
    lw = 0.3 + math.log(2.0)
    phi = math.exp(3 + 2 * lw - 3 * math.exp(lw))
    loss, _, _ = run("vespo", logp, old, t([[1.0, 1.0]]), weights=t([[2.0, 1.0]]))
    close(loss, -phi * float(logp.mean()))


@settings(max_examples=40, deadline=None)
@given(adv=st.lists(st.floats(-2, 2), min_size=4, max_size=4))
def test_vespo_on_policy_is_vanilla_pg(adv):
    """φ(1) = e^λ·1·e^−λ = 1 for any (k, λ): on-policy VESPO is REINFORCE, value and gradient."""
    logp = t([[-0.3, -1.0], [-2.0, -0.1]])
    a = t(adv).view(2, 2)
    l1, _, g1 = run("vespo", logp, logp, a, k_neg=7.0, lambda_pos=0.5)
    l2, _, g2 = run("vanilla_pg", logp, logp, a)
    close(l1, l2, tol=1e-12)
    close(g1, g2, tol=1e-12)


# --------------------------------------------------------------------------- off-policy sequence mask


@pytest.mark.parametrize("name", ["vespo", "ppo_clip", "cispo", "sapo", "gspo"])
def test_off_policy_mask_drops_drifted_negative_rows(name):
    # row 0: A < 0, mean(old − log π) = 0.5 > δ = 0.1 → dropped; row 1: same drift, A > 0 → kept;
    # row 2: A < 0, drift 0.05 ≤ δ → kept. The loss equals the loss of rows 1, 2 alone
    # (token-sum aggregation, so the normaliser does not move).
    old = t([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    logp = old + t([[-0.5, -0.5], [-0.5, -0.5], [-0.05, -0.05]])
    adv = t([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]])
    total = lambda m, k: ops.masked_sum(m, k)  # noqa: E731
    loss, metrics, grad = run(name, logp, old, adv, aggregate=total, off_policy_mask_threshold=0.1)
    kept, _, grad_kept = run(name, logp[1:], old[1:], adv[1:], aggregate=total)
    close(loss, kept)
    close(grad[0], [0.0, 0.0])
    close(grad[1:], grad_kept)
    close(metrics["actor/off_policy_masked_frac"], 1 / 3)


def test_off_policy_mask_uses_rollout_log_prob_when_given():
    # drift measured from rollout_log_prob: log π_rollout − log π = 0.5 > δ → row dropped,
    # although old_log_prob == log_prob
    logp = t([[-1.0, -1.0]])
    fn = LAB.get("policy_loss", "ppo_clip", off_policy_mask_threshold=0.1)
    kw = dict(log_prob=logp, old_log_prob=logp, advantages=t([[-1.0, -1.0]]), mask=torch.ones(1, 2, dtype=torch.bool),
              aggregate=token_mean)
    close(fn(**kw)[0], 1.0)
    close(fn(**kw, rollout_log_prob=logp + 0.5)[0], 0.0)


def test_off_policy_mask_threshold_must_be_positive():
    with pytest.raises(ValueError, match="off_policy_mask_threshold"):
        LAB.get("policy_loss", "vespo", off_policy_mask_threshold=0.0)


def test_off_policy_mask_errors_name_the_loss_and_rows():
    logp = t([[-1.0, -1.0], [-1.0, -1.0]])
    fn = LAB.get("policy_loss", "cispo", off_policy_mask_threshold=0.1)
    kw = dict(log_prob=logp, old_log_prob=logp, advantages=t([[1.0, 1.0], [1.0, 1.0]]),
              mask=torch.tensor([[True, True], [True, False]]), aggregate=token_mean)
    bad = t([[-1.0, -1.0], [-1.0, float("nan")]])
    fn(**kw, rollout_log_prob=bad)  # NaN under the mask is ignored
    with pytest.raises(rllab.RowError, match=r"cispo.*rows \[0\]"):
        fn(**kw, rollout_log_prob=t([[float("inf"), -1.0], [-1.0, -1.0]]))
    with pytest.raises(ValueError, match="cispo: rollout_log_prob has shape"):
        fn(**kw, rollout_log_prob=logp[:1])
