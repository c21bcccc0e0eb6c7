"""Loss aggregation modes (plugin rllab_aggregations): hand values, verl semantics, masking, splitting."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rllab

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
NAN = float("nan")


@pytest.fixture(scope="module")
def lab():
    return rllab.Lab()


def agg(lab, name, loss_mat, mask, **kw):
    knobs = {k: kw.pop(k) for k in list(kw) if k == "horizon"}
    return lab.get("loss_aggregation", name, **knobs)(loss_mat=loss_mat, mask=mask, **kw)


# Rows: 1 + 2 (two tokens), 4 (one token), nothing (fully masked). NaN sits under the mask.
LOSS = torch.tensor([[1.0, 2.0, NAN], [4.0, NAN, float("inf")], [NAN, 8.0, 9.0]])
MASK = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])

HAND = {
    "token-mean": 7.0 / 3.0,  # (1 + 2 + 4) / 3 tokens
    "token-sum": 7.0,
    "seq-mean-token-sum": 3.5,  # (3 + 4) / 2 non-empty rows; the empty row is not counted
    "seq-mean-token-mean": 2.75,  # (1.5 + 4) / 2
    "seq-mean-token-sum-norm": 3.5 / 3.0,  # / T = 3
}


@pytest.mark.parametrize("name", MODES)
def test_hand_values(lab, name):
    out = agg(lab, name, LOSS, MASK)
    assert out.ndim == 0
    assert out.item() == pytest.approx(HAND[name], rel=1e-6)


def test_sum_norm_constant_horizon(lab):
    out = agg(lab, "seq-mean-token-sum-norm", LOSS, MASK, horizon=7)
    assert out.item() == pytest.approx(0.5, rel=1e-7)  # 3.5 / 7


@pytest.mark.parametrize("name", MODES)
def test_global_counts_hand(lab, name):
    """Rows {0} and {1, 2} as two micro-batches with the whole batch's counts sum to the whole."""
    parts = [
        agg(lab, name, LOSS[:1], MASK[:1], global_tokens=3, global_seqs=2),
        agg(lab, name, LOSS[1:], MASK[1:], global_tokens=torch.tensor(3), global_seqs=torch.tensor(2)),
    ]
    assert (parts[0] + parts[1]).item() == pytest.approx(HAND[name], rel=1e-6)


@pytest.mark.parametrize("name", MODES)
def test_all_masked_is_zero_with_zero_grad(lab, name):
    """verl returns NaN here (0/0); rllab returns 0."""
    loss_mat = torch.full((2, 3), NAN, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    out = agg(lab, name, loss_mat, mask)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(loss_mat.grad, torch.zeros(2, 3))
    # a zero global count behaves the same
    assert agg(lab, name, loss_mat.detach(), mask, global_tokens=0, global_seqs=0).item() == 0.0


@pytest.mark.parametrize("name", MODES)
def test_gradient_is_finite_and_zero_under_mask(lab, name):
    loss_mat = LOSS.clone().requires_grad_(True)
    agg(lab, name, loss_mat, MASK).backward()
    g = loss_mat.grad
    assert torch.isfinite(g).all()
    assert torch.equal(g[~MASK], torch.zeros(int((~MASK).sum())))
    expected = {
        "token-mean": [1 / 3, 1 / 3, 1 / 3],
        "token-sum": [1.0, 1.0, 1.0],
        "seq-mean-token-sum": [0.5, 0.5, 0.5],
        "seq-mean-token-mean": [0.25, 0.25, 0.5],
        "seq-mean-token-sum-norm": [0.5 / 3, 0.5 / 3, 0.5 / 3],
    }[name]
    torch.testing.assert_close(g[MASK], torch.tensor(expected), rtol=1e-6, atol=0)


def test_bad_mask_is_rejected(lab):
    f = lab.get("loss_aggregation", "token-mean")
    with pytest.raises(TypeError, match="mask"):
        f(loss_mat=torch.zeros(2, 3), mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(2, 3\)"):
        f(loss_mat=torch.zeros(2, 3), mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="loss_mat"):
        f(loss_mat=torch.zeros(6), mask=torch.ones(6, dtype=torch.bool))


@pytest.mark.parametrize("bad", [0, -3])
def test_horizon_knob_range(lab, bad):
    with pytest.raises(rllab.ConfigError, match="horizon"):
        lab.get("loss_aggregation", "seq-mean-token-sum-norm", horizon=bad)


def test_horizon_knob_type(lab):
    with pytest.raises(rllab.ConfigError, match="horizon"):
        lab.get("loss_aggregation", "seq-mean-token-sum-norm", horizon=2.5)


# --------------------------------------------------------------------------- properties


def reference(name, loss_mat, mask, horizon=None):
    """The aggregation definitions, row by row in float64 Python arithmetic."""
    rows = []
    total, n_tok = 0.0, 0
    for b in range(loss_mat.shape[0]):
        vals = [float(loss_mat[b, t]) for t in range(loss_mat.shape[1]) if mask[b, t]]
        total += sum(vals)
        n_tok += len(vals)
        if vals:
            rows.append((sum(vals), len(vals)))
    seq = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return {
        "token-mean": total / n_tok if n_tok else 0.0,
        "token-sum": total,
        "seq-mean-token-sum": seq([s for s, _ in rows]),
        "seq-mean-token-mean": seq([s / n for s, n in rows]),
        "seq-mean-token-sum-norm": seq([s for s, _ in rows]) / (horizon or loss_mat.shape[1]),
    }[name]


@st.composite
def batches(draw):
    B = draw(st.integers(1, 6))
    T = draw(st.integers(1, 7))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    loss_mat = torch.randn(B, T, generator=g, dtype=torch.float64) * 3
    p = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    mask = torch.rand(B, T, generator=g) < p
    return loss_mat, mask, g


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(MODES))
def test_matches_reference_definition(lab, batch, name):
    loss_mat, mask, _ = batch
    out = agg(lab, name, loss_mat, mask)
    assert out.dtype == torch.float64
    assert out.item() == pytest.approx(reference(name, loss_mat, mask), rel=1e-12, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(MODES))
def test_masked_values_never_leak(lab, batch, name):
    loss_mat, mask, g = batch
    garbage = torch.where(
        torch.rand(loss_mat.shape, generator=g) < 0.5,
        torch.full_like(loss_mat, NAN),
        torch.randn(loss_mat.shape, generator=g, dtype=torch.float64) * 1e30,
    )
    garbage[0, 0] = float("-inf")
    dirty = torch.where(mask, loss_mat, garbage)
    assert agg(lab, name, dirty, mask).item() == agg(lab, name, loss_mat, mask).item()


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(MODES), st.integers(1, 4), st.integers(0, 3))
def test_padding_invariance(lab, batch, name, extra_cols, extra_rows):
    """Appending masked columns (and empty rows) changes nothing; sum-norm needs a fixed horizon."""
    loss_mat, mask, g = batch
    B, T = loss_mat.shape
    kw = {"horizon": 16} if name == "seq-mean-token-sum-norm" else {}
    padded = torch.full((B + extra_rows, T + extra_cols), NAN, dtype=loss_mat.dtype)
    padded[:B, :T] = loss_mat
    pmask = torch.zeros(B + extra_rows, T + extra_cols, dtype=torch.bool)
    pmask[:B, :T] = mask
    a = agg(lab, name, loss_mat, mask, **kw).item()
    b = agg(lab, name, padded, pmask, **kw).item()
    assert b == pytest.approx(a, rel=1e-12, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(MODES), st.data())
def test_micro_batches_with_global_counts_sum_to_whole(lab, batch, name, data):
    """Split the rows in any way; each part aggregated with the global counts; the parts add up."""
    loss_mat, mask, _ = batch
    B = loss_mat.shape[0]
    order = data.draw(st.permutations(range(B)))
    cuts = sorted(data.draw(st.sets(st.integers(1, B - 1), max_size=B - 1)) if B > 1 else [])
    n_tok = int(mask.sum())
    n_seq = int(mask.any(-1).sum())
    whole = agg(lab, name, loss_mat, mask).item()
    total = 0.0
    for rows in torch.tensor(order).tensor_split(cuts):
        total += agg(lab, name, loss_mat[rows], mask[rows], global_tokens=n_tok, global_seqs=n_seq).item()
    assert total == pytest.approx(whole, rel=1e-10, abs=1e-12)


def test_float32_matches_float64(lab):
    g = torch.Generator().manual_seed(0)
    loss_mat = torch.randn(16, 40, generator=g, dtype=torch.float64)
    mask = torch.rand(16, 40, generator=g) < 0.6
    for name in MODES:
        hi = agg(lab, name, loss_mat, mask).item()
        lo = agg(lab, name, loss_mat.float(), mask).item()
        assert math.isclose(lo, hi, rel_tol=1e-5, abs_tol=1e-6)
