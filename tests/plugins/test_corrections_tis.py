"""rllab_corrections: importance corrections for the rollout/training mismatch.

The hand case: per-token weights w = exp(old − rollout) are
row 0: [3, 0.5, 1.5], row 1: [0.25, 2.5, (masked)]; sequence weights are the row products
W_0 = 3·0.5·1.5 = 2.25 and W_1 = 0.25·2.5 = 0.625. There are 5 valid tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rllab
from rllab import ops

LAB = rllab.Lab()
MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "none"]


def hand_case(dtype=torch.float64):
    mask = torch.tensor([[True, True, True], [True, True, False]])
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.2, 0.0]], dtype=dtype)
    log_w = torch.log(torch.tensor([[3.0, 0.5, 1.5], [0.25, 2.5, 1.0]], dtype=torch.float64)).to(dtype)
    old = rollout + log_w
    old[1, 2] = float("nan")  # masked: must not matter
    return old, rollout, mask


def correct(name, old, rollout, mask, **knobs):
    return LAB.get("importance_correction", name, **knobs)(old_log_prob=old, rollout_log_prob=rollout, mask=mask)


def close(a, b, rel=1e-6, abs_=1e-9):
    torch.testing.assert_close(
        torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), rtol=rel, atol=abs_
    )


ROLLOUT_KL = -math.log(3 * 0.5 * 1.5 * 0.25 * 2.5) / 5  # mean(rollout − old) = −mean(log w)


def test_registered_with_aliases_and_default_cap():
    assert set(MODES) <= set(LAB.names("importance_correction"))
    assert LAB.spec("importance_correction", "tis").name == "token_truncate"
    assert LAB.spec("importance_correction", "mis").name == "token_mask"
    assert LAB.get("importance_correction", "token_truncate").config.c_max == 2.0
    assert LAB.get("importance_correction", "sequence_mask").config.c_min is None


def test_token_truncate_by_hand():
    w, m = correct("token_truncate", *hand_case())
    close(w, [[2.0, 0.5, 1.5], [0.25, 2.0, 0.0]])
    close(m["tis/mean_weight"], 6.25 / 5)
    close(m["tis/frac_truncated"], 2 / 5)
    close(m["tis/rollout_kl"], ROLLOUT_KL)
    # with C_min = 0.3 the 0.25 is raised to 0.3 (TRL's clip_min on truncation)
    w, m = correct("token_truncate", *hand_case(), c_min=0.3)
    close(w, [[2.0, 0.5, 1.5], [0.3, 2.0, 0.0]])
    close(m["tis/frac_truncated"], 3 / 5)
    # TRL's default cap
    w, _ = correct("token_truncate", *hand_case(), c_max=3.0)
    close(w, [[3.0, 0.5, 1.5], [0.25, 2.5, 0.0]])


def test_token_mask_by_hand():
    w, m = correct("token_mask", *hand_case(), c_min=0.3)
    close(w, [[0.0, 0.5, 1.5], [0.0, 0.0, 0.0]])
    close(m["tis/mean_weight"], 2.0 / 5)
    close(m["tis/frac_masked"], 3 / 5)
    close(m["tis/rollout_kl"], ROLLOUT_KL)
    w, m = correct("token_mask", *hand_case())  # no lower bound
    close(w, [[0.0, 0.5, 1.5], [0.25, 0.0, 0.0]])
    close(m["tis/frac_masked"], 2 / 5)


def test_sequence_truncate_by_hand():
    w, m = correct("sequence_truncate", *hand_case())
    close(w, [[2.0, 2.0, 2.0], [0.625, 0.625, 0.0]])
    close(m["tis/mean_weight"], (6.0 + 1.25) / 5)
    close(m["tis/frac_truncated"], 3 / 5)
    close(m["tis/seq_frac_truncated"], 1 / 2)
    close(m["tis/rollout_kl"], ROLLOUT_KL)


def test_sequence_mask_by_hand():
    w, m = correct("sequence_mask", *hand_case())
    close(w, [[0.0, 0.0, 0.0], [0.625, 0.625, 0.0]])
    close(m["tis/mean_weight"], 1.25 / 5)
    close(m["tis/frac_masked"], 3 / 5)
    close(m["tis/seq_frac_masked"], 1 / 2)
    w, m = correct("sequence_mask", *hand_case(), c_min=0.7, c_max=3.0)  # W_1 = 0.625 < 0.7
    close(w, [[2.25, 2.25, 2.25], [0.0, 0.0, 0.0]])
    close(m["tis/seq_frac_masked"], 1 / 2)


def test_none_is_the_mask():
    old, rollout, mask = hand_case()
    w, m = correct("none", old, rollout, mask)
    assert torch.equal(w, mask.to(w.dtype))
    close(m["tis/mean_weight"], 1.0)
    close(m["tis/rollout_kl"], ROLLOUT_KL)
    w, m = LAB.get("importance_correction", "none")(old_log_prob=old, rollout_log_prob=None, mask=mask)
    assert torch.equal(w, mask.to(w.dtype)) and float(m["tis/rollout_kl"]) == 0.0


def test_log_weights_are_clamped_at_20():
    mask = torch.ones(1, 3, dtype=torch.bool)
    old = torch.tensor([[50.0, -50.0, 0.0]])
    rollout = torch.zeros(1, 3)
    w, _ = correct("token_truncate", old, rollout, mask, c_max=math.inf)
    close(w, [[math.exp(20.0), math.exp(-20.0), 1.0]])
    # the sequence sum 0 is not clamped; a row summing to 30 is
    w, _ = correct("sequence_truncate", old, rollout, mask, c_max=math.inf)
    close(w, [[1.0, 1.0, 1.0]])
    w, _ = correct("sequence_truncate", torch.tensor([[10.0, 10.0, 10.0]]), rollout, mask, c_max=math.inf)
    close(w, [[math.exp(20.0)] * 3])


def test_weights_are_detached_float32_at_least():
    old, rollout, mask = hand_case(torch.bfloat16)
    old = old.clone().requires_grad_(True)
    for name in MODES:
        w, m = correct(name, old, rollout, mask)
        assert not w.requires_grad and w.dtype == torch.float32
        assert all(not v.requires_grad and v.ndim == 0 for v in m.values())
        assert all(k.startswith("tis/") for k in m)


# --------------------------------------------------------------------------- identities and invariances


def random_batch(seed, B=6, T=9, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    rollout = torch.randn(B, T, generator=g, dtype=torch.float64) - 1
    old = rollout + scale * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[0] = False
    return old, rollout, mask


@pytest.mark.parametrize("name", MODES)
@pytest.mark.parametrize("knobs", [{}, {"c_min": 0.5}, {"c_max": 1.0, "c_min": 1.0}])
def test_rollout_equal_to_old_gives_weight_one(name, knobs):
    old, _, mask = random_batch(1)
    if name == "none":
        knobs = {}
    w, m = correct(name, old, old.clone(), mask, **knobs)
    assert torch.equal(w, mask.to(w.dtype))
    assert float(m["tis/rollout_kl"]) == 0.0
    assert all(float(v) == 0.0 for k, v in m.items() if "frac" in k)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), fill=st.sampled_from([float("nan"), float("inf"), -float("inf"), 99.0]))
@pytest.mark.parametrize("name", MODES)
def test_masked_positions_change_nothing(name, seed, fill):
    old, rollout, mask = random_batch(seed, scale=1.0)
    a = correct(name, old, rollout, mask, **({} if name == "none" else {"c_min": 0.2}))
    poison = lambda x: torch.where(mask, x, torch.full_like(x, fill))  # noqa: E731
    b = correct(name, poison(old), poison(rollout), mask, **({} if name == "none" else {"c_min": 0.2}))
    assert torch.equal(a[0], b[0])
    assert (b[0][~mask] == 0).all()
    for k in a[1]:
        assert torch.equal(a[1][k], b[1][k]), k


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), pad=st.integers(1, 5))
@pytest.mark.parametrize("name", MODES)
def test_padding_changes_nothing(name, seed, pad):
    old, rollout, mask = random_batch(seed, scale=1.0)
    g = torch.Generator().manual_seed(seed)
    grow = lambda x: torch.cat([x, torch.randn(x.shape[0], pad, generator=g, dtype=x.dtype)], 1)  # noqa: E731
    mask_p = torch.cat([mask, torch.zeros(mask.shape[0], pad, dtype=torch.bool)], 1)
    a = correct(name, old, rollout, mask)
    b = correct(name, grow(old), grow(rollout), mask_p)
    torch.testing.assert_close(b[0][:, : old.shape[1]], a[0], rtol=1e-12, atol=0)
    assert (b[0][:, old.shape[1] :] == 0).all()
    for k in a[1]:
        torch.testing.assert_close(a[1][k], b[1][k], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", MODES)
def test_all_masked_and_empty_batches_are_finite(name):
    old, rollout, _ = random_batch(2)
    for mask, o, r in (
        (torch.zeros(old.shape, dtype=torch.bool), old, rollout),
        (torch.zeros(0, 4, dtype=torch.bool), old[:0, :4], rollout[:0, :4]),
    ):
        w, m = correct(name, o, r, mask)
        assert (w == 0).all() and all(math.isfinite(float(v)) for v in m.values())


def test_weights_feed_a_policy_loss():
    # sequence_truncate weights times PPO-clip equal the hand product of per-token loss and weight
    old, rollout, mask = hand_case()
    w, _ = correct("sequence_truncate", old, rollout, mask)
    lp = torch.where(mask, old, torch.zeros_like(old)).detach()  # r = 1: per-token loss −A
    adv = torch.tensor([[1.0, -2.0, 0.5], [4.0, 1.0, 0.0]], dtype=torch.float64)
    loss, _ = LAB.get("policy_loss", "ppo_clip")(
        log_prob=lp, old_log_prob=lp, advantages=adv, mask=mask, aggregate=ops.masked_mean, weights=w
    )
    # −(1 − 2 + 0.5)·2 − (4 + 1)·0.625 = 1 − 3.125, over 5 tokens
    close(loss, (1.0 - 3.125) / 5)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", MODES)
def test_nan_at_valid_position_names_rows(name):
    old, rollout, mask = random_batch(3)
    mask[4, 2] = True
    rollout[4, 2] = float("nan")
    with pytest.raises(rllab.RowError, match=r"rollout_log_prob .*\[4\]") as e:
        correct(name, old, rollout, mask)
    assert e.value.rows == [4]


def test_wrong_mask_dtype_or_shape():
    old, rollout, mask = random_batch(4)
    with pytest.raises(TypeError, match="mask.*torch.bool"):
        correct("token_truncate", old, rollout, mask.int())
    with pytest.raises(ValueError, match=r"rollout_log_prob has shape \(6, 8\) but old_log_prob has shape \(6, 9\)"):
        correct("token_mask", old, rollout[:, :8], mask)
    with pytest.raises(ValueError, match=r"mask has shape \(6, 8\) but old_log_prob has shape \(6, 9\)"):
        correct("sequence_mask", old, rollout, mask[:, :8])


@pytest.mark.parametrize(
    "knobs,match",
    [
        ({"c_max": 0.0}, "c_max"),
        ({"c_max": -1.0}, "c_max"),
        ({"c_min": -0.1}, "c_min"),
        ({"c_min": 3.0}, "c_min = 3.0 must not exceed c_max = 2.0"),
        ({"cmax": 2.0}, "no knob 'cmax'; did you mean 'c_max'"),
    ],
)
def test_knob_validation(knobs, match):
    with pytest.raises(rllab.ConfigError, match=match):
        LAB.get("importance_correction", "token_mask", **knobs)
