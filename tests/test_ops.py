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
