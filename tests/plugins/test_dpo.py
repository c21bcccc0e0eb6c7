"""Preference losses (plugin rllab_dpo): hand values, DPO identities, metrics, knob and input errors."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rllab

NAMES = ["dpo", "cdpo", "ipo", "hinge", "robust", "simpo"]
LOG2 = math.log(2.0)


@pytest.fixture(scope="module")
def lab():
    return rllab.Lab()


def pairs(dtype=torch.float64):
    """Three pairs with log-ratios chosen (1, −2, 2), rejected (−2, −1, 2): Δ = (3, −1, 0)."""
    t = lambda *v: torch.tensor(v, dtype=dtype)  # noqa: E731
    return dict(
        chosen_logps=t(-10.0, -20.0, -4.0),
        rejected_logps=t(-14.0, -15.0, -6.0),
        ref_chosen_logps=t(-11.0, -18.0, -6.0),
        ref_rejected_logps=t(-12.0, -14.0, -8.0),
        chosen_lengths=torch.tensor([4, 5, 2]),
        rejected_lengths=torch.tensor([2, 10, 1]),
    )


# β = 0.1 (default), ε = 0.1 (cdpo/robust default), γ = 0.5 (simpo default). softplus(x) = log(1 + eˣ).
HAND = {
    # −log σ(βΔ) = softplus(−βΔ) at βΔ = 0.3, −0.1, 0
    "dpo": [0.5543552444685271, 0.744396660073571, 0.6931471805599453],
    # 0.9·softplus(−βΔ) + 0.1·softplus(βΔ)
    "cdpo": [0.5843552444685272, 0.734396660073571, 0.6931471805599453],
    # (Δ_len − 5)², Δ_len = 1/4 − (−2/2), −2/5 − (−1/10), 2/2 − 2/1 = 1.25, −0.3, −1
    "ipo": [14.0625, 28.09, 36.0],
    # relu(1 − βΔ)
    "hinge": [0.7, 1.1, 1.0],
    # (0.9·softplus(−βΔ) − 0.1·softplus(βΔ)) / 0.8
    "robust": [0.5168552444685272, 0.756896660073571, 0.6931471805599452],
    # ā_w − ā_l = 4.5, −2.5, 4; β·(… − γ/β) = −0.05, −0.75, −0.1; loss = softplus(−that)
    "simpo": [0.7184596480132863, 1.1368710061148999, 0.744396660073571],
}
DPO_METRICS = {
    "dpo/accuracy": 1 / 3,
    "dpo/chosen_reward": 0.1 * (1 - 2 + 2) / 3,
    "dpo/rejected_reward": 0.1 * (-2 - 1 + 2) / 3,
    "dpo/margin": 0.1 * (3 - 1 + 0) / 3,
}
SIMPO_METRICS = {  # rewards β·ā, ā_w = (−2.5, −4, −2), ā_l = (−7, −1.5, −6)
    "dpo/accuracy": 2 / 3,
    "dpo/chosen_reward": 0.1 * -8.5 / 3,
    "dpo/rejected_reward": 0.1 * -14.5 / 3,
    "dpo/margin": 0.1 * 6 / 3,
}


def call(lab, name, **kw):
    knobs = {k: kw.pop(k) for k in ("beta", "label_smoothing", "gamma") if k in kw}
    return lab.get("preference_loss", name, **knobs)(**kw)


def test_registered(lab):
    assert set(NAMES) <= set(lab.names("preference_loss"))
    assert lab.spec("preference_loss", "sigmoid").name == "dpo"
    assert lab.get("preference_loss", "dpo").config.beta == 0.1


@pytest.mark.parametrize("name", NAMES)
def test_hand_values_float64(lab, name):
    losses, metrics = call(lab, name, **pairs())
    assert losses.shape == (3,) and losses.dtype == torch.float64
    torch.testing.assert_close(losses, torch.tensor(HAND[name], dtype=torch.float64), rtol=1e-12, atol=1e-14)
    expected = SIMPO_METRICS if name == "simpo" else DPO_METRICS
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        assert metrics[key].ndim == 0 and not metrics[key].requires_grad
        assert metrics[key].item() == pytest.approx(value, rel=1e-12, abs=1e-15), key


@pytest.mark.parametrize("name", NAMES)
def test_hand_values_float32(lab, name):
    losses, _ = call(lab, name, **pairs(torch.float32))
    assert losses.dtype == torch.float32
    torch.testing.assert_close(losses, torch.tensor(HAND[name]), rtol=1e-6, atol=1e-7)


def test_dpo_hand_gradient(lab):
    kw = pairs()
    c = kw["chosen_logps"].clone().requires_grad_(True)
    r = kw["rejected_logps"].clone().requires_grad_(True)
    losses, _ = call(lab, "dpo", **{**kw, "chosen_logps": c, "rejected_logps": r})
    losses.sum().backward()
    # ∂/∂log π(w) of −log σ(βΔ) is −β·σ(−βΔ); ∂/∂log π(l) is its negative.
    expected = torch.tensor([-0.0425557483188341, -0.052497918747894, -0.05], dtype=torch.float64)
    torch.testing.assert_close(c.grad, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(r.grad, -expected, rtol=1e-12, atol=0)


def test_hinge_flat_beyond_margin(lab):
    """relu(1 − βΔ): 0 with zero gradient once βΔ ≥ 1 (here Δ = 20, β = 0.1 → −1 clipped to 0)."""
    c = torch.tensor([0.0, 0.0], dtype=torch.float64, requires_grad=True)
    losses, _ = call(
        lab,
        "hinge",
        chosen_logps=c,
        rejected_logps=torch.tensor([-20.0, -5.0], dtype=torch.float64),
        ref_chosen_logps=torch.zeros(2, dtype=torch.float64),
        ref_rejected_logps=torch.zeros(2, dtype=torch.float64),
        chosen_lengths=torch.ones(2, dtype=torch.long),
        rejected_lengths=torch.ones(2, dtype=torch.long),
    )
    torch.testing.assert_close(losses, torch.tensor([0.0, 0.5], dtype=torch.float64), rtol=1e-12, atol=0)
    losses.sum().backward()
    torch.testing.assert_close(c.grad, torch.tensor([0.0, -0.1], dtype=torch.float64), rtol=1e-12, atol=0)


def test_robust_goes_negative_for_large_margins(lab):
    """βΔ = 10, ε = 0.1: (0.9·softplus(−10) − 0.1·softplus(10)) / 0.8 < 0 (TRL's rDPO does the same)."""
    z = torch.zeros(1, dtype=torch.float64)
    losses, _ = call(
        lab,
        "robust",
        chosen_logps=torch.tensor([100.0], dtype=torch.float64),
        rejected_logps=z,
        ref_chosen_logps=z,
        ref_rejected_logps=z,
        chosen_lengths=torch.ones(1, dtype=torch.long),
        rejected_lengths=torch.ones(1, dtype=torch.long),
    )
    torch.testing.assert_close(losses, torch.tensor([-1.2499546011007832], dtype=torch.float64), rtol=1e-12, atol=0)


# --------------------------------------------------------------------------- identities


@st.composite
def random_pairs(draw, P_min=1):
    P = draw(st.integers(P_min, 8))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    lens_c = torch.randint(1, 30, (P,), generator=g)
    lens_r = torch.randint(1, 30, (P,), generator=g)
    return dict(
        chosen_logps=-torch.rand(P, generator=g, dtype=torch.float64) * lens_c * 3,
        rejected_logps=-torch.rand(P, generator=g, dtype=torch.float64) * lens_r * 3,
        ref_chosen_logps=-torch.rand(P, generator=g, dtype=torch.float64) * lens_c * 3,
        ref_rejected_logps=-torch.rand(P, generator=g, dtype=torch.float64) * lens_r * 3,
        chosen_lengths=lens_c,
        rejected_lengths=lens_r,
    )


BETAS = st.sampled_from([0.01, 0.1, 0.5, 2.0])


@settings(max_examples=40, deadline=None)
@given(random_pairs(), BETAS, st.sampled_from([0.0, 0.1, 0.3, 0.49]))
def test_policy_equals_reference(lab, kw, beta, eps):
    """Δ = 0: dpo, cdpo and robust give log 2 (for any ε); hinge 1; ipo (1/(2β))²."""
    kw = {**kw, "ref_chosen_logps": kw["chosen_logps"], "ref_rejected_logps": kw["rejected_logps"]}
    P = kw["chosen_logps"].shape[0]
    expect = {
        "dpo": LOG2,
        "cdpo": LOG2,
        "robust": LOG2,
        "hinge": 1.0,
        "ipo": (1 / (2 * beta)) ** 2,
    }
    for name, value in expect.items():
        knobs = {"label_smoothing": eps} if name in ("cdpo", "robust") else {}
        losses, metrics = call(lab, name, beta=beta, **knobs, **kw)
        torch.testing.assert_close(losses, torch.full((P,), value, dtype=torch.float64), rtol=1e-12, atol=0)
        assert metrics["dpo/accuracy"].item() == 0.0
        assert metrics["dpo/margin"].item() == 0.0


@settings(max_examples=40, deadline=None)
@given(random_pairs(), BETAS)
def test_zero_smoothing_equals_dpo(lab, kw, beta):
    want, want_m = call(lab, "dpo", beta=beta, **kw)
    for name in ("cdpo", "robust"):
        got, got_m = call(lab, name, beta=beta, label_smoothing=0.0, **kw)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert {k: v.item() for k, v in got_m.items()} == {k: v.item() for k, v in want_m.items()}


@settings(max_examples=40, deadline=None)
@given(random_pairs(), BETAS, st.sampled_from([0.05, 0.1, 0.25, 0.4]))
def test_robust_is_unbiased_under_label_flips(lab, kw, beta, eps):
    """(1−ε)·L_robust(w ≻ l) + ε·L_robust(l ≻ w) = L_dpo(w ≻ l) (Chowdhury et al. 2024, Lemma 3.1)."""
    swapped = dict(
        chosen_logps=kw["rejected_logps"],
        rejected_logps=kw["chosen_logps"],
        ref_chosen_logps=kw["ref_rejected_logps"],
        ref_rejected_logps=kw["ref_chosen_logps"],
        chosen_lengths=kw["rejected_lengths"],
        rejected_lengths=kw["chosen_lengths"],
    )
    clean, _ = call(lab, "dpo", beta=beta, **kw)
    a, _ = call(lab, "robust", beta=beta, label_smoothing=eps, **kw)
    b, _ = call(lab, "robust", beta=beta, label_smoothing=eps, **swapped)
    torch.testing.assert_close((1 - eps) * a + eps * b, clean, rtol=1e-10, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(random_pairs(), BETAS)
def test_swapping_the_pair_shifts_dpo_by_beta_delta(lab, kw, beta):
    """softplus(x) − softplus(−x) = x, so L(l ≻ w) − L(w ≻ l) = βΔ; accuracy flips."""
    swapped = dict(
        chosen_logps=kw["rejected_logps"],
        rejected_logps=kw["chosen_logps"],
        ref_chosen_logps=kw["ref_rejected_logps"],
        ref_rejected_logps=kw["ref_chosen_logps"],
        chosen_lengths=kw["rejected_lengths"],
        rejected_lengths=kw["chosen_lengths"],
    )
    delta = (kw["chosen_logps"] - kw["ref_chosen_logps"]) - (kw["rejected_logps"] - kw["ref_rejected_logps"])
    a, ma = call(lab, "dpo", beta=beta, **kw)
    b, mb = call(lab, "dpo", beta=beta, **swapped)
    torch.testing.assert_close(b - a, beta * delta, rtol=1e-9, atol=1e-12)
    assert ma["dpo/accuracy"].item() + mb["dpo/accuracy"].item() == pytest.approx(1.0)
    assert ma["dpo/accuracy"].item() == pytest.approx(float((delta > 0).double().mean()), abs=1e-15)


@settings(max_examples=30, deadline=None)
@given(random_pairs(), st.sampled_from(NAMES))
def test_finite_losses_and_gradients(lab, kw, name):
    c = kw["chosen_logps"].clone().requires_grad_(True)
    r = kw["rejected_logps"].clone().requires_grad_(True)
    losses, metrics = call(lab, name, **{**kw, "chosen_logps": c, "rejected_logps": r})
    assert torch.isfinite(losses).all()
    if name != "robust":  # robust is an unbiased correction and goes negative for large βΔ
        assert (losses >= 0).all()
    losses.mean().backward()
    assert torch.isfinite(c.grad).all() and torch.isfinite(r.grad).all()
    assert all(torch.isfinite(v) and not v.requires_grad for v in metrics.values())


def test_ipo_and_simpo_divide_by_lengths(lab):
    """Scaling every log-prob and length by k leaves ipo and simpo unchanged (per-token averages)."""
    kw = pairs()
    k = 3
    scaled = {key: v * k for key, v in kw.items()}
    for name in ("ipo", "simpo"):
        torch.testing.assert_close(call(lab, name, **scaled)[0], call(lab, name, **kw)[0], rtol=1e-12, atol=0)
    # ... while dpo sees a three times larger Δ
    assert not torch.allclose(call(lab, "dpo", **scaled)[0], call(lab, "dpo", **kw)[0])


def test_simpo_ignores_reference_and_zero_lengths_are_clamped(lab):
    kw = pairs()
    a, _ = call(lab, "simpo", **{**kw, "ref_chosen_logps": None, "ref_rejected_logps": None})
    torch.testing.assert_close(a, torch.tensor(HAND["simpo"], dtype=torch.float64), rtol=1e-12, atol=0)
    zero = {**kw, "chosen_logps": torch.zeros(3, dtype=torch.float64), "chosen_lengths": torch.zeros(3, dtype=torch.long)}
    for name in ("ipo", "simpo"):
        losses, _ = call(lab, name, **zero)
        assert torch.isfinite(losses).all()


def test_empty_batch(lab):
    empty = {k: v[:0] for k, v in pairs().items()}
    for name in NAMES:
        losses, metrics = call(lab, name, **empty)
        assert losses.shape == (0,)
        assert all(v.item() == 0.0 for v in metrics.values())


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("beta", [0.0, -0.1])
def test_beta_must_be_positive(lab, name, beta):
    with pytest.raises(rllab.ConfigError, match="beta"):
        lab.get("preference_loss", name, beta=beta)


@pytest.mark.parametrize(
    "name, knobs",
    [
        ("robust", {"label_smoothing": 0.5}),
        ("robust", {"label_smoothing": -0.1}),
        ("cdpo", {"label_smoothing": 0.6}),
        ("cdpo", {"label_smoothing": -0.01}),
        ("simpo", {"gamma": -1.0}),
        ("simpo", {"label_smoothing": 0.7}),
        ("dpo", {"label_smoothing": 0.1}),  # dpo has no smoothing knob: that is cdpo
        ("ipo", {"beta": "0.1"}),
    ],
)
def test_knob_errors(lab, name, knobs):
    with pytest.raises(rllab.ConfigError, match=next(iter(knobs))):
        lab.get("preference_loss", name, **knobs)


def test_knob_boundaries_accepted(lab):
    assert lab.get("preference_loss", "cdpo", label_smoothing=0.5).config.label_smoothing == 0.5
    assert lab.get("preference_loss", "robust", label_smoothing=0.49).config.label_smoothing == 0.49
    assert lab.get("preference_loss", "simpo", gamma=0).config.gamma == 0.0


def test_non_finite_log_probs_name_the_pairs(lab):
    kw = pairs()
    kw["ref_rejected_logps"] = torch.tensor([-1.0, float("nan"), -1.0], dtype=torch.float64)
    kw["chosen_logps"] = torch.tensor([-1.0, -1.0, float("-inf")], dtype=torch.float64)
    with pytest.raises(rllab.RowError, match=r"\[1, 2\]") as info:
        call(lab, "dpo", **kw)
    assert info.value.rows == [1, 2]


def test_input_shape_errors(lab):
    kw = pairs()
    with pytest.raises(ValueError, match=r"rejected_logps.*\(2,\).*chosen_logps.*\(3,\)"):
        call(lab, "dpo", **{**kw, "rejected_logps": kw["rejected_logps"][:2]})
    with pytest.raises(ValueError, match=r"chosen_logps must be \(P,\)"):
        call(lab, "dpo", **{k: v[None] for k, v in kw.items()})
    with pytest.raises(TypeError, match="ref_chosen_logps"):
        call(lab, "ipo", **{**kw, "ref_chosen_logps": None})
