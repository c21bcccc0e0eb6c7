"""The rl algorithm's KL options against their references (TRL 1.16 and verl 0.9.1 formulas)."""

from __future__ import annotations

import pytest
import torch
from rllab_algorithms.rl import kl_times_ratio, penalty_row_mean

import rllab


def _inputs(seed=0, B=5, T=7):
    g = torch.Generator().manual_seed(seed)
    log_prob = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    old = log_prob.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = log_prob.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[2] = False  # an empty row
    mask[0, 0] = True
    return log_prob, old, ref, mask


def _k3(log_prob, ref):
    return torch.exp(ref - log_prob) - (ref - log_prob) - 1  # TRL's per_token_kl (β > 0)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_kl_times_ratio_matches_trl_use_bias_correction_kl(level):
    log_prob, old, ref, mask = _inputs()
    ours = kl_times_ratio(_k3(log_prob, ref), log_prob, old, mask, level)
    # TRL 1.16 GRPOTrainer._compute_loss: coef_1 = exp(log_importance_weights), per_token_kl *= coef_1
    log_ratio = log_prob - old
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    theirs = _k3(log_prob, ref) * torch.exp(log_ratio)
    torch.testing.assert_close(ours[mask], theirs[mask], rtol=1e-12, atol=1e-12)
    assert torch.all(ours[~mask] == 0)
    # gradients too (the ratio keeps its gradient, as TRL's coef_1): through a token-mean loss
    (g_ours,) = torch.autograd.grad((ours * mask).sum() / mask.sum(), log_prob)
    (g_theirs,) = torch.autograd.grad((theirs * mask).sum() / mask.sum(), log_prob)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-12)


def test_kl_times_ratio_on_policy_keeps_the_value_but_not_the_gradient():
    log_prob, _, ref, mask = _inputs(seed=1)
    kl = _k3(log_prob, ref)
    out = kl_times_ratio(kl, log_prob, log_prob.detach(), mask, "token")
    torch.testing.assert_close(out[mask], kl[mask])
    # d/dθ [kl·r] at r = 1 is ∇kl + kl·∇log π: per token, ∂/∂lp = ∂kl/∂lp + kl
    (g,) = torch.autograd.grad(out[mask].sum(), log_prob, retain_graph=True)
    (g_kl,) = torch.autograd.grad(kl[mask].sum(), log_prob)
    torch.testing.assert_close(g[mask], (g_kl + kl.detach())[mask])


def test_penalty_row_mean_matches_verl_apply_kl_penalty():
    _, old, ref, mask = _inputs(seed=2)
    kld = old - ref
    ours = penalty_row_mean(kld, mask)
    # verl 0.9.1 apply_kl_penalty: masked_mean(kld, mask, axis=-1) (÷ (n + 1e-8)), then the mean over rows
    rows = (kld * mask).sum(-1) / (mask.sum(-1) + 1e-8)
    torch.testing.assert_close(ours, rows.mean(), rtol=1e-7, atol=1e-12)
    # by hand on a 2×2 with an empty row: row 0 mean (1 + 3)/2 = 2, row 1 (empty) 0 → 1
    x = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    m = torch.tensor([[True, True], [False, False]])
    assert penalty_row_mean(x, m).item() == 1.0


def test_kl_options_need_the_matching_kl_in():
    lab = rllab.Lab()
    with pytest.raises(rllab.ConfigError, match="kl_importance_ratio = 'token' applies only with kl_in = 'loss'"):
        lab.get("algorithm", "rl", kl_importance_ratio="token")
    with pytest.raises(rllab.ConfigError, match="kl_measure = 'penalty_row_mean' applies only with kl_in = 'reward'"):
        lab.get("algorithm", "rl", kl_in="loss", kl_measure="penalty_row_mean")
