"""rllab.ops against hand-computed values and properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllab import ops


def test_masked_mean_sum_hand_values():
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    m = torch.tensor([[True, True, False], [True, False, True]])
    assert ops.masked_sum(x, m).item() == 13.0
    assert ops.masked_mean(x, m).item() == 13.0 / 4
    assert ops.masked_mean(x, m, dim=-1).tolist() == [1.5, 5.0]


def test_masked_var_is_unbiased_hand_value():
    x = torch.tensor([1.0, 2.0, 4.0, 100.0])
    m = torch.tensor([True, True, True, False])
    # mean 7/3; squared deviations 16/9 + 1/9 + 25/9 = 42/9; unbiased: /2
    assert ops.masked_var(x, m).item() == pytest.approx(42 / 9 / 2, rel=1e-6)
    assert ops.masked_var(x, m, unbiased=False).item() == pytest.approx(42 / 9 / 3, rel=1e-6)


def test_masked_whiten_hand_value():
    x = torch.tensor([1.0, 2.0, 4.0, 7.0])
    m = torch.tensor([True, True, True, False])
    mean, var = 7 / 3, 42 / 9 / 2
    expected = [(v - mean) / math.sqrt(var + 1e-8) for v in [1.0, 2.0, 4.0, 7.0]]
    assert ops.masked_whiten(x, m).tolist() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("n_valid", [0, 1])
def test_degenerate_masks_give_finite_results(n_valid):
    x = torch.tensor([3.0, float("nan"), 5.0])
    m = torch.tensor([True, False, False]) if n_valid else torch.zeros(3, dtype=torch.bool)
    assert ops.masked_mean(x, m).item() == (3.0 if n_valid else 0.0)
    assert ops.masked_var(x, m).item() == 0.0
    w = ops.masked_whiten(x, m)
    assert torch.isfinite(w[m]).all() and (w[m] == 0).all()


def test_group_stats_hand_values_and_singletons():
    values = torch.tensor([1.0, 3.0, 5.0, 7.0, 9.0])
    index = torch.tensor([10, 10, 42, 42, 7])
    count, mean, std = ops.group_stats(values, index)
    assert count.tolist() == [2, 2, 2, 2, 1]
    assert mean.tolist() == [2, 2, 6, 6, 9]
    assert std.tolist() == pytest.approx([math.sqrt(2)] * 4 + [0.0])


def test_group_stats_valid_excludes_rows():
    values = torch.tensor([1.0, 3.0, 100.0])
    index = torch.tensor([0, 0, 0])
    count, mean, std = ops.group_stats(values, index, valid=torch.tensor([True, True, False]))
    assert count.tolist() == [2, 2, 2] and mean.tolist() == [2, 2, 2]
    assert std[0].item() == pytest.approx(math.sqrt(2))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(-10, 10)), min_size=1, max_size=20))
def test_group_stats_matches_a_loop(rows):
    index = torch.tensor([r[0] for r in rows])
    values = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    count, mean, std = ops.group_stats(values, index)
    for i, g in enumerate(index.tolist()):
        members = values[index == g]
        assert count[i] == len(members)
        assert mean[i].item() == pytest.approx(members.mean().item(), abs=1e-9)
        expected_std = members.std().item() if len(members) > 1 else 0.0
        assert std[i].item() == pytest.approx(expected_std, abs=1e-9)


def test_check_finite_names_rows():
    x = torch.tensor([[0.0, 1.0], [float("nan"), 1.0], [2.0, float("inf")], [0.0, float("nan")]])
    m = torch.tensor([[True, True], [True, True], [True, True], [True, False]])
    with pytest.raises(ops.RowError) as e:
        ops.check_finite("estimator", "scores", x, m)
    assert e.value.rows == [1, 2]
    assert "rows [1, 2]" in str(e.value) and "scores" in str(e.value) and "estimator" in str(e.value)
    ops.check_finite("estimator", "scores", x[:1], m[:1])


# --------------------------------------------------------------------------- masking helpers


def test_scalar_zero_matches_dtype_and_device():
    z = ops.scalar_zero(torch.ones(2, 3, dtype=torch.float64))
    assert z.shape == () and z.dtype == torch.float64 and z.item() == 0.0


def test_zero_masked_values_and_no_leak_through_gradient():
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("inf"), 5.0, -6.0]], requires_grad=True)
    m = torch.tensor([[True, False, True], [False, True, True]])
    out = ops.zero_masked(x, m)
    assert out.tolist() == [[1.0, 0.0, 3.0], [0.0, 5.0, -6.0]]
    (out * torch.arange(1.0, 7.0).view(2, 3)).sum().backward()
    assert x.grad.tolist() == [[1.0, 0.0, 3.0], [0.0, 5.0, 6.0]]


def test_zero_masked_finite_shortcut_equals_select():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g)
    m = torch.rand(4, 5, generator=g) > 0.4
    assert torch.equal(ops.zero_masked(x, m, finite=True), ops.zero_masked(x, m))
    # without autograd both select bit for bit (NaN at a masked position gives +0); with it the
    # shortcut multiplies, which is only valid on finite input: NaN * False is NaN
    x[0, 0], m[0, 0] = float("nan"), False
    assert ops.zero_masked(x, m)[0, 0].item() == 0.0
    assert ops.zero_masked(x, m, finite=True)[0, 0].item() == 0.0
    assert math.isnan(ops.zero_masked(x.requires_grad_(), m, finite=True)[0, 0].item())


def test_check_token_tensor_names_component_argument_and_shapes():
    x, m = torch.zeros(2, 5), torch.ones(2, 5, dtype=torch.bool)
    ops.check_token_tensor("estimator 'x'", "token_rewards", x, m, floating=True)
    with pytest.raises(ValueError, match=r"^estimator 'x': token_rewards must be a \(B, T\) tensor, got \(5,\)$"):
        ops.check_token_tensor("estimator 'x'", "token_rewards", x[0], m)
    with pytest.raises(ValueError, match=r"token_rewards must be a \(B, T\) tensor, got list"):
        ops.check_token_tensor("estimator 'x'", "token_rewards", [1.0], m)
    with pytest.raises(TypeError, match=r"estimator 'x': token_rewards must be a float tensor, got torch.int64"):
        ops.check_token_tensor("estimator 'x'", "token_rewards", x.long(), m, floating=True)
    ops.check_token_tensor("agg", "loss_mat", x.long(), m)  # floating not asked for
    with pytest.raises(ValueError, match=r"^agg: mask has shape \(2, 4\) but expected \(2, 5\)$"):
        ops.check_token_tensor("agg", "loss_mat", x, m[:, :4])
    with pytest.raises(TypeError, match=r"agg: mask must have dtype torch.bool, got torch.float32"):
        ops.check_token_tensor("agg", "loss_mat", x, m.float())


def test_check_inputs_errors_name_the_argument_and_both_shapes():
    lp, m = torch.zeros(3, 4), torch.ones(3, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^loss 'a': adv has shape \(3, 1\) but lp has shape \(3, 4\)$"):
        ops.check_inputs("loss 'a'", m, lp=lp, adv=torch.zeros(3, 1))
    with pytest.raises(ValueError, match=r"^loss 'a': mask has shape \(3, 2\) but lp has shape \(3, 4\)$"):
        ops.check_inputs("loss 'a'", m[:, :2], lp=lp)
    with pytest.raises(ValueError, match=r"^loss 'a': lp must be \(B, T\), got shape \(4,\)$"):
        ops.check_inputs("loss 'a'", m[0], lp=lp[0])
    with pytest.raises(TypeError, match=r"^loss 'a': adv must be a floating-point tensor, got torch.int64$"):
        ops.check_inputs("loss 'a'", m, lp=lp, adv=lp.long())
    with pytest.raises(TypeError, match=r"^loss 'a': adv must be a torch.Tensor, got float$"):
        ops.check_inputs("loss 'a'", m, lp=lp, adv=1.0)
    with pytest.raises(TypeError, match=r"mask must have dtype torch.bool"):
        ops.check_inputs("loss 'a'", m.float(), lp=lp)


def test_check_inputs_finiteness_report():
    m = torch.tensor([[True, True], [True, False], [True, True]])
    lp = torch.zeros(3, 2)
    assert ops.check_inputs("w", m, lp=lp, weights=None) is True
    masked_nan = lp.clone()
    masked_nan[1, 1] = float("nan")
    assert ops.check_inputs("w", m, lp=lp, adv=masked_nan) is False  # only under the mask: no error
    bad = masked_nan.clone()
    bad[2, 0] = float("-inf")
    with pytest.raises(ops.RowError, match=r"^w: adv is not finite in rows \[2\]") as e:
        ops.check_inputs("w", m, lp=lp, adv=bad)
    assert e.value.rows == [2]
    # finite entries whose sum overflows are not an error
    huge = torch.full((3, 2), 3e38)
    assert ops.check_inputs("w", m, lp=huge) is True


def test_masked_whiten_remask_shift_and_zero_hint():
    x = torch.tensor([[1.0, 2.0, 99.0], [4.0, float("nan"), 0.0]], dtype=torch.float64)
    m = torch.tensor([[True, True, False], [True, False, False]])
    mean, var = 7 / 3, 42 / 9 / 2  # valid entries 1, 2, 4
    scale = 1 / math.sqrt(var + 1e-8)
    w = ops.masked_whiten(x, m, remask=True)
    expected = [[(1 - mean) * scale, (2 - mean) * scale, 0.0], [(4 - mean) * scale, 0.0, 0.0]]
    torch.testing.assert_close(w, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # not remasked: verl's values at masked positions (NaN stays NaN, 99 is whitened with the same stats)
    full = ops.masked_whiten(x, m)
    assert full[0, 2].item() == pytest.approx((99 - mean) * scale, rel=1e-12)
    assert math.isnan(full[1, 1].item())
    # what sits at masked positions changes nothing
    z = torch.where(m, x, 0.0)
    torch.testing.assert_close(ops.masked_whiten(z, m, remask=True), w, rtol=0, atol=0)
    # shift_mean=False adds the mean back at valid positions (and keeps masked zeros when remasked)
    s = ops.masked_whiten(x, m, shift_mean=False, remask=True)
    torch.testing.assert_close(s, torch.where(m, w + mean, 0.0), rtol=1e-12, atol=1e-12)
    assert ops.masked_whiten(x, m, shift_mean=False)[0, 2].item() == pytest.approx((99 - mean) * scale + mean)


def test_masked_whiten_lone_valid_entry_is_only_centred():
    x = torch.tensor([3.0, 5.0, -1.0])
    m = torch.tensor([False, True, False])
    assert ops.masked_whiten(x, m).tolist() == [-2.0, 0.0, -6.0]  # scale 1, no rsqrt(1e-8) blow-up
    assert ops.masked_whiten(x, m, remask=True).tolist() == [0.0, 0.0, 0.0]
    assert ops.masked_whiten(x, torch.zeros(3, dtype=torch.bool)).tolist() == [3.0, 5.0, -1.0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-50, 50), st.booleans()), min_size=2, max_size=24))
def test_masked_whiten_valid_entries_have_zero_mean_unit_variance(rows):
    x = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    m = torch.tensor([r[1] for r in rows])
    n = int(m.sum())
    w = ops.masked_whiten(x, m, remask=True)
    assert (w[~m] == 0).all()
    if n >= 2:
        valid = x[m]
        var = valid.var().item()  # unbiased
        assert w[m].mean().item() == pytest.approx(0.0, abs=1e-9)
        assert w[m].var().item() == pytest.approx(var / (var + 1e-8), rel=1e-9, abs=1e-12)
        # the same as the textbook formula on the valid entries alone
        torch.testing.assert_close(w[m], (valid - valid.mean()) / torch.sqrt(valid.var() + 1e-8), rtol=1e-9, atol=1e-9)


def test_row_helpers_agree_with_the_plain_formulas():
    """row_any, the masked row sum, sum_of_squares and masked_whiten agree with the plain
    formulas (NaN at masked positions ignored)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 257, generator=g)
    m = torch.rand(3000, 257, generator=g) > 0.4
    m[5] = False
    x[~m] = float("nan")
    torch.testing.assert_close(ops.row_any(m), m.any(dim=1), rtol=0, atol=0)
    assert ops.row_any(torch.zeros(4, 0, dtype=torch.bool)).tolist() == [False] * 4
    torch.testing.assert_close(ops.masked_sum(x, m, dim=1), torch.where(m, x, 0.0).sum(1), rtol=0, atol=0)
    y = torch.where(m, x, 0.0)
    torch.testing.assert_close(ops.sum_of_squares(y).double(), (y.double() ** 2).sum(), rtol=1e-6, atol=0)
    ref = ops.masked_whiten(x, m, remask=True)
    torch.testing.assert_close(ops.masked_whiten(y, m, remask=True), ref)
    assert not torch.isnan(ref).any() and (ref[~m] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_zero_masked_is_torch_where_bit_for_bit(dtype):
    """zero_masked and zero_masked_ (a select, contiguous or not, in place or not)
    return exactly ``torch.where(mask, x, 0)``, NaN, inf and -0 included."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 33, generator=g).to(dtype)
    x[0, 0], x[1, 1], x[2, 2], x[3, 3] = float("nan"), float("-inf"), -0.0, float("nan")
    mask = torch.rand(7, 33, generator=g) > 0.3
    mask[0, 0], mask[2, 2], mask[3, 3] = False, True, True
    ref = torch.where(mask, x, torch.zeros((), dtype=dtype))
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    assert torch.equal(ops.zero_masked(x, mask).view(bits), ref.view(bits))
    assert torch.equal(ops.zero_masked_(x.clone(), mask).view(bits), ref.view(bits))
    assert torch.equal(ops.zero_masked(x.t(), mask.t()).view(bits), ref.t().view(bits))  # not contiguous: torch.where
