"""ReMax: hand-computed values, input errors, and the rl step sampling its greedy baseline."""

from __future__ import annotations

import pytest
import torch

import rllab

LAB = rllab.Lab()


def test_remax_by_hand():
    # row 0: rewards (0, 0, 1) → returns (1, 1, 1), baseline 0.25 → advantages 0.75
    # row 1: rewards (0.5, 0.5, pad) → returns (1, 0.5, 0), baseline 1 → (0, −0.5, 0)
    r = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]])
    m = torch.tensor([[True, True, True], [True, True, False]])
    adv, ret = LAB.get("advantage_estimator", "remax")(token_rewards=r, mask=m, index=None, reward_baselines=torch.tensor([0.25, 1.0]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.5, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.75, 0.75], [0.0, -0.5, 0.0]]))


def test_remax_needs_its_baselines():
    remax = LAB.get("advantage_estimator", "remax")
    r, m = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="needs reward_baselines"):
        remax(token_rewards=r, mask=m, index=None)
    with pytest.raises(ValueError, match=r"reward_baselines must be a \(2,\) tensor, got shape \(3,\)"):
        remax(token_rewards=r, mask=m, index=None, reward_baselines=torch.zeros(3))
