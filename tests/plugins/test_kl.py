"""KL penalties and KL controllers (plugin rllab_kl): hand values, gradients, full KL, controllers."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rllab

BASES = ["k1", "abs", "k2", "k3"]
ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3", "kl+": "k1+", "mse+": "k2+", "low_var_kl+": "k3+"}


@pytest.fixture(scope="module")
def lab():
    return rllab.Lab()


def kl(lab, name, log_prob, ref_log_prob, **knobs):
    return lab.get("kl_penalty", name, **knobs)(log_prob=log_prob, ref_log_prob=ref_log_prob)


# log π and log π_ref for three tokens: r = log π − log π_ref = (0.5, −1, 0), d = −r.
LP = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0, -0.5]], dtype=torch.float64)
HAND = {
    "k1": [0.5, -1.0, 0.0],
    "abs": [0.5, 1.0, 0.0],
    "k2": [0.125, 0.5, 0.0],
    # exp(d) − d − 1 at d = −0.5, 1, 0
    "k3": [0.10653065971263342, 0.7182818284590451, 0.0],
}
# ∂/∂log π: k1 → 1, abs → sign(r), k2 → r, k3 → 1 − exp(d)
HAND_GRAD = {
    "k1": [1.0, 1.0, 1.0],
    "abs": [1.0, -1.0, 0.0],
    "k2": [0.5, -1.0, 0.0],
    "k3": [0.3934693402873666, -1.718281828459045, 0.0],
}


def value_and_grad(lab, name, lp, ref, **knobs):
    lp = lp.clone().requires_grad_(True)
    out = kl(lab, name, lp, ref, **knobs)
    out.sum().backward()
    return out.detach(), lp.grad


def test_registered_names(lab):
    names = set(lab.names("kl_penalty"))
    assert {"k1", "abs", "k2", "k3", "k1+", "abs+", "k2+", "k3+", "full"} <= names
    for alias, name in ALIASES.items():
        assert lab.spec("kl_penalty", alias).name == name
    assert lab.spec("kl_penalty", "full").requires == ("logits",)
    assert set(lab.names("kl_controller")) >= {"fixed", "adaptive"}


@pytest.mark.parametrize("name", BASES + list(ALIASES)[:3])
def test_hand_values_and_gradients(lab, name):
    base = ALIASES.get(name, name)
    value, grad = value_and_grad(lab, name, LP, REF)
    torch.testing.assert_close(value, torch.tensor([HAND[base]], dtype=torch.float64), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad, torch.tensor([HAND_GRAD[base]], dtype=torch.float64), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", BASES)
def test_float32_hand_values(lab, name):
    out = kl(lab, name, LP.float(), REF.float())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([HAND[name]]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("base", BASES)
def test_straight_through_value_of_base_gradient_of_k2(lab, base):
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(4, 7, generator=g) * 2
    ref = torch.randn(4, 7, generator=g) * 2
    lp[0, 0], ref[0, 1] = -40.0, -40.0  # k3's clamps are active here; k3+ still has k2's gradient
    v_plus, g_plus = value_and_grad(lab, base + "+", lp, ref)
    v_base, _ = value_and_grad(lab, base, lp, ref)
    _, g_k2 = value_and_grad(lab, "k2", lp, ref)
    assert torch.equal(v_plus, v_base)  # bitwise: k2 − sg(k2) is exactly 0
    torch.testing.assert_close(g_plus, g_k2, rtol=0, atol=0)
    torch.testing.assert_close(g_plus, lp - ref, rtol=1e-6, atol=0)


def test_straight_through_hand_values(lab):
    value, grad = value_and_grad(lab, "k3+", LP, REF)
    torch.testing.assert_close(value, torch.tensor([HAND["k3"]], dtype=torch.float64), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad, torch.tensor([[0.5, -1.0, 0.0]], dtype=torch.float64), rtol=1e-12, atol=0)


def test_k3_clamped_values_and_zero_gradient(lab):
    # d = ref − lp = 30 (d clamped to 20, estimate clamped to 10); d = −30 (d clamped to −20:
    # exp(−20) + 19 > 10, clamped to 10); d = 3 (only the estimate clamp: e³ − 4 = 16.09 > 10);
    # d = 2.5 (no clamp: e^2.5 − 3.5 = 8.682...).
    lp = torch.tensor([[-30.0, 0.0, -3.0, -2.5]], dtype=torch.float64)
    ref = torch.tensor([[0.0, -30.0, 0.0, 0.0]], dtype=torch.float64)
    value, grad = value_and_grad(lab, "k3", lp, ref)
    torch.testing.assert_close(value, torch.tensor([[10.0, 10.0, 10.0, 8.682493960703473]], dtype=torch.float64))
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, 0.0, 1 - math.exp(2.5)]], dtype=torch.float64))


def test_k3_unclamped_is_trl_form(lab):
    lp = torch.tensor([[-30.0, 0.0, -3.0, -0.5]], dtype=torch.float64)
    ref = torch.tensor([[0.0, -30.0, 0.0, -1.0]], dtype=torch.float64)
    value, grad = value_and_grad(lab, "k3", lp, ref, clamp=False)
    d = [30.0, -30.0, 3.0, -0.5]
    expected = [math.exp(x) - x - 1 for x in d]  # 1.0686e13, 29.0000..., 16.0855..., 0.1065...
    torch.testing.assert_close(value, torch.tensor([expected], dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, torch.tensor([[1 - math.exp(x) for x in d]], dtype=torch.float64), rtol=1e-12, atol=0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_k3_nonnegative_and_zero_at_equal(lab, seed):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(3, 5, generator=g) * 10
    ref = torch.randn(3, 5, generator=g) * 10
    assert (kl(lab, "k3", lp, ref) >= 0).all()
    assert (kl(lab, "k2", lp, ref) >= 0).all()
    for name in BASES:
        assert torch.equal(kl(lab, name, lp, lp), torch.zeros(3, 5))


def test_shape_mismatch_names_both(lab):
    with pytest.raises(ValueError, match=r"ref_log_prob.*\(2, 4\).*log_prob.*\(2, 3\)"):
        kl(lab, "k1", torch.zeros(2, 3), torch.zeros(2, 4))


def test_k3_clamp_knob_type(lab):
    with pytest.raises(rllab.ConfigError, match="clamp"):
        lab.get("kl_penalty", "k3", clamp="yes")


# --------------------------------------------------------------------------- full


def full_kl(lab, logits, ref_logits, **knobs):
    return lab.get("kl_penalty", "full", **knobs)(
        log_prob=None, ref_log_prob=None, logits=logits, ref_logits=ref_logits
    )


def direct_kl(logits, ref_logits):
    log_p = torch.log_softmax(logits.double(), -1)
    log_q = torch.log_softmax(ref_logits.double(), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def test_full_hand_values(lab):
    # p = (½, ½), q = (¼, ¾): KL = ½·log 2 + ½·log(2/3) = ½·log(4/3).
    # p = (1, 0) (a −inf logit), q = (½, ½): KL = log 2; the 0·log 0 entry contributes 0.
    logits = torch.tensor([[[0.0, 0.0], [0.0, float("-inf")]]])
    ref_logits = torch.tensor([[[0.0, math.log(3.0)], [1.0, 1.0]]])
    out = full_kl(lab, logits, ref_logits)
    assert out.shape == (1, 2) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[0.5 * math.log(4 / 3), math.log(2.0)]]), rtol=1e-6, atol=0)
    z = logits.clone().requires_grad_(True)
    full_kl(lab, z, ref_logits).sum().backward()
    # ∂KL/∂z_v = p_v·(log p_v − log q_v − KL): row 0 → ±½·(log(2/3) − ½·log(4/3))... written out:
    a = 0.5 * (math.log(2.0) - 0.5 * math.log(4 / 3))
    b = 0.5 * (math.log(2 / 3) - 0.5 * math.log(4 / 3))
    torch.testing.assert_close(z.grad, torch.tensor([[[a, b], [0.0, 0.0]]]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("chunk", [None, 1, 3, 64])
def test_full_equals_direct_sum_over_vocab(lab, chunk):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 5, 11, generator=g) * 3
    ref_logits = torch.randn(3, 5, 11, generator=g) * 3
    out = full_kl(lab, logits, ref_logits, chunk_tokens=chunk) if chunk else full_kl(lab, logits, ref_logits)
    torch.testing.assert_close(out.double(), direct_kl(logits, ref_logits), rtol=1e-5, atol=1e-6)
    assert (out >= 0).all()
    assert torch.allclose(full_kl(lab, logits, logits), torch.zeros(3, 5), atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_full_gradients_match_autograd_of_direct(lab, chunk):
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 5, 7, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    ref_logits = (torch.randn(2, 5, 7, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    weights = torch.randn(2, 5, generator=g, dtype=torch.float64)
    out = full_kl(lab, logits, ref_logits, chunk_tokens=chunk)
    assert out.dtype == torch.float64
    gz, gy = torch.autograd.grad((out * weights).sum(), (logits, ref_logits))
    ez, ey = torch.autograd.grad((direct_kl(logits, ref_logits) * weights).sum(), (logits, ref_logits))
    torch.testing.assert_close(gz, ez, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gy, ey, rtol=1e-10, atol=1e-12)


def test_full_gradcheck(lab):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ref_logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    f = lab.get("kl_penalty", "full", chunk_tokens=2)
    assert torch.autograd.gradcheck(
        lambda z, y: f(log_prob=None, ref_log_prob=None, logits=z, ref_logits=y), (logits, ref_logits)
    )


def test_full_bfloat16_logits(lab):
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(2, 4, 9, generator=g) * 2).bfloat16().requires_grad_(True)
    ref_logits = (torch.randn(2, 4, 9, generator=g) * 2).bfloat16()
    out = full_kl(lab, logits, ref_logits)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), direct_kl(logits.detach().float(), ref_logits.float()), rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert logits.grad.dtype == torch.bfloat16 and torch.isfinite(logits.grad.float()).all()


def test_full_saves_no_vocab_sized_intermediates(lab):
    """The forward keeps only its inputs and the (B, T) result for backward."""
    logits = torch.randn(4, 6, 50, requires_grad=True)
    ref_logits = torch.randn(4, 6, 50)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        full_kl(lab, logits, ref_logits, chunk_tokens=5)
    inputs = {logits.data_ptr(), ref_logits.data_ptr()}
    for t in saved:
        assert t.data_ptr() in inputs or t.numel() <= 4 * 6, tuple(t.shape)


def test_full_shape_errors(lab):
    f = lab.get("kl_penalty", "full")
    with pytest.raises(ValueError, match="ref_logits"):
        f(log_prob=None, ref_log_prob=None, logits=torch.zeros(2, 3, 5), ref_logits=torch.zeros(2, 3, 6))
    with pytest.raises(ValueError, match=r"log_prob has shape \(2, 4\)"):
        f(log_prob=torch.zeros(2, 4), ref_log_prob=None, logits=torch.zeros(2, 3, 5), ref_logits=torch.zeros(2, 3, 5))


def test_full_chunk_knob(lab):
    with pytest.raises(rllab.ConfigError, match="chunk_tokens"):
        lab.get("kl_penalty", "full", chunk_tokens=0)


# --------------------------------------------------------------------------- controllers


def test_fixed_controller(lab):
    ctl = lab.get("kl_controller", "fixed", kl_coef=0.05)()
    assert ctl.value == 0.05
    ctl.update(current_kl=3.0, n_steps=100)
    ctl.update(current_kl=torch.tensor(0.0), n_steps=100)
    assert ctl.value == 0.05
    assert lab.get("kl_controller", "fixed")().value == 0.001


def test_adaptive_controller_hand_arithmetic(lab):
    ctl = lab.get("kl_controller", "adaptive", kl_coef=0.1, target_kl=1.0, horizon=100)()
    assert ctl.value == 0.1
    # KL 1.5: error 0.5 → clipped to 0.2; ×(1 + 0.2·10/100) = ×1.02
    ctl.update(1.5, 10)
    assert ctl.value == pytest.approx(0.102, rel=1e-14)
    # KL 0.9: error −0.1; ×(1 − 0.1·10/100) = ×0.99
    ctl.update(0.9, 10)
    assert ctl.value == pytest.approx(0.10098, rel=1e-14)
    # KL 0: error −1 → clipped to −0.2; ×(1 − 0.2·50/100) = ×0.9
    ctl.update(0.0, 50)
    assert ctl.value == pytest.approx(0.090882, rel=1e-14)
    # KL 1.05 as a tensor: error 0.05; ×(1 + 0.05·20/100) = ×1.01
    ctl.update(torch.tensor(1.05, dtype=torch.float64), 20)
    assert ctl.value == pytest.approx(0.09179082, rel=1e-14)
    # n_steps = 0 leaves β alone
    ctl.update(5.0, 0)
    assert ctl.value == pytest.approx(0.09179082, rel=1e-14)


def test_adaptive_controller_defaults_and_errors(lab):
    ctl = lab.get("kl_controller", "adaptive")()
    assert (ctl.value, ctl.target, ctl.horizon) == (0.001, 0.1, 10000.0)
    with pytest.raises(ValueError, match="finite"):
        ctl.update(float("nan"), 1)
    with pytest.raises(ValueError, match="n_steps"):
        ctl.update(0.1, -1)
    with pytest.raises(ValueError, match="horizon"):
        ctl.update(0.0, 60000)  # 1 − 0.2·6 < 0
    assert ctl.value == 0.001  # failed updates change nothing


@pytest.mark.parametrize(
    "name, knobs",
    [
        ("fixed", {"kl_coef": -0.1}),
        ("adaptive", {"kl_coef": 0.0}),
        ("adaptive", {"target_kl": 0.0}),
        ("adaptive", {"horizon": -5}),
        ("adaptive", {"horizn": 5}),
    ],
)
def test_controller_knob_errors(lab, name, knobs):
    with pytest.raises(rllab.ConfigError, match=next(iter(knobs))):
        lab.get("kl_controller", name, **knobs)
