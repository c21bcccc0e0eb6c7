"""Preference losses (plugin rllab_preference_losses): hand values, DPO identities, metrics, knob and input errors."""

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


KNOBS = (
    "beta", "label_smoothing", "gamma", "f_divergence_type", "f_alpha_divergence_coef", "discopop_tau", "running_mean",
    "loss_types", "loss_weights", "ld_alpha", "use_weighting", "bco_running_mean",
)  # fmt: skip


def call(lab, name, **kw):
    knobs = {k: kw.pop(k) for k in KNOBS if k in kw}
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


# --------------------------------------------------------------------------- TRL 1.16's other loss types

TRL_NAMES = [
    "exo_pair", "nca_pair", "bco_pair", "sppo_hard", "aot", "aot_unpaired", "apo_zero", "apo_down",
    "discopop", "sft", "sigmoid_norm", "combined", "mpo",
]  # fmt: skip


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


# On pairs(): u_w = (1, −2, 2), u_l = (−2, −1, 2), Δ = (3, −1, 0), β = 0.1. log σ(x) = −softplus(−x).
HAND_TRL = {
    # σ(x)(log σ(x) − log 0.999) + σ(−x)(log σ(−x) − log 0.001), x = βΔ, ε = 1e-3 (exo default)
    "exo_pair": [2.25819919150928, 2.93500427081911, 2.761230709097915],
    # softplus(−βu_w) + ½·softplus(βu_w) + ½·softplus(βu_l)
    "nca_pair": [1.3156644248011522, 1.4194066341091731, 1.3962777387631835],
    # softplus(−βu_w) + softplus(βu_l)
    "bco_pair": [1.2425355294551625, 1.4425355294551627, 1.3962777387631835],
    # (u_w − 5)² + (u_l + 5)²
    "sppo_hard": [25.0, 65.0, 58.0],
    # sort(c − r) = (−5, 2, 4), sort(ref_c − ref_r) = (−4, 1, 2): d = (−1, 1, 2); softplus(−βd)
    "aot": [0.744396660073571, 0.6443966600735709, 0.5981388693815918],
    # sort(u_w) − sort(u_l) = (−2, 1, 2) − (−2, −1, 2) = (0, 2, 0)
    "aot_unpaired": [LOG2, 0.5981388693815918, LOG2],
    # 1 − σ(βu_w) + σ(βu_l)
    "apo_zero": [0.9251868152085821, 1.024854809833538, 1.0],
    # σ(βu_w) + 1 − σ(βΔ)
    "apo_down": [0.950536670667281, 0.9751451901664621, 1.049833997312478],
    # (1 − m)·softplus(−x) + m·e^{−x}, x = βΔ, m = σ(x / 0.05); at x = 0: (log 2 + 1)/2
    "discopop": [0.7403571680088782, 0.7874020058177799, (LOG2 + 1) / 2],
    # −(−10 − 20 − 4) / (4 + 5 + 2), every pair
    "sft": [34 / 11] * 3,
    # u/len: (1/4, −2/5, 2/2) − (−2/2, −1/10, 2/1) = (1.25, −0.3, −1); softplus(−β·that)
    "sigmoid_norm": [0.6325990353171691, 0.7082596763414485, 0.744396660073571],
    # combined defaults to TRL's loss_type = ["sigmoid"]: dpo
    "combined": HAND["dpo"],
}
HAND_TRL["mpo"] = [0.8 * a + 0.2 * b + c for a, b, c in zip(HAND["dpo"], HAND_TRL["bco_pair"], HAND_TRL["sft"])]


def test_trl_losses_registered(lab):
    assert set(TRL_NAMES) <= set(lab.names("preference_loss"))
    assert lab.spec("preference_loss", "combined").requires == ("token_logps", "log_sum_sq_probs", "bco_running_mean")
    assert lab.spec("preference_loss", "bco_pair").requires == ("bco_running_mean",)
    assert lab.spec("preference_loss", "nca_pair").requires == ()
    assert lab.get("preference_loss", "mpo").config.loss_weights == (0.8, 0.2, 1.0)


@pytest.mark.parametrize("name", TRL_NAMES)
def test_trl_hand_values_float64(lab, name):
    losses, metrics = call(lab, name, **pairs())
    assert losses.shape == (3,) and losses.dtype == torch.float64
    torch.testing.assert_close(losses, torch.tensor(HAND_TRL[name], dtype=torch.float64), rtol=1e-12, atol=1e-14)
    for key, value in DPO_METRICS.items():  # every TRL loss logs the same reward metrics
        assert metrics[key].item() == pytest.approx(value, rel=1e-12, abs=1e-15), key
        assert not metrics[key].requires_grad


@pytest.mark.parametrize("name", TRL_NAMES)
def test_trl_hand_values_float32(lab, name):
    losses, _ = call(lab, name, **pairs(torch.float32))
    assert losses.dtype == torch.float32
    torch.testing.assert_close(losses, torch.tensor(HAND_TRL[name]), rtol=2e-6, atol=1e-6)


# On pairs(), f'(e^u) for each divergence, then dpo's softplus(−β·(s_w − s_l)).
HAND_F = {
    "forward_kl": [0.4024838785050576, 0.9537117187731805, LOG2],  # s = 1 − e^{−u}
    "js_divergence": [0.6065699731809521, 0.7346578346558854, LOG2],  # s = log 2 + log σ(u)
    "alpha_divergence": [0.5041057475364682, 0.805812163055158, LOG2],  # α = 0.5: s = (e^{−u/2} − 1)/(−1/2)
}


@pytest.mark.parametrize("divergence", sorted(HAND_F))
def test_f_divergence_hand_values(lab, divergence):
    for name in ("dpo", "combined"):
        losses, metrics = call(lab, name, **pairs(), f_divergence_type=divergence)
        torch.testing.assert_close(losses, torch.tensor(HAND_F[divergence], dtype=torch.float64), rtol=1e-12, atol=0)
        # the logged rewards stay β·u, as TRL's
        assert metrics["dpo/margin"].item() == pytest.approx(DPO_METRICS["dpo/margin"], rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(random_pairs(), BETAS)
def test_f_divergence_identities(lab, kw, beta):
    """α → 1 is reverse KL; α = 0 is forward KL ((t⁻¹ − 1)/(−1) = 1 − 1/t); policy = reference
    gives log 2 under every divergence (every f'(1) used here is 0)."""
    base, _ = call(lab, "dpo", beta=beta, **kw)
    near_one, _ = call(lab, "dpo", beta=beta, f_divergence_type="alpha_divergence", f_alpha_divergence_coef=1.0 + 1e-7, **kw)
    torch.testing.assert_close(near_one, base, rtol=0, atol=0)
    fwd, _ = call(lab, "dpo", beta=beta, f_divergence_type="forward_kl", **kw)
    alpha0, _ = call(lab, "dpo", beta=beta, f_divergence_type="alpha_divergence", f_alpha_divergence_coef=0.0, **kw)
    # (α − 1)·u is clamped at 80 before exp (as TRL does), so the identity holds where u ≥ −80
    unclamped = ((kw["chosen_logps"] - kw["ref_chosen_logps"]) >= -80) & ((kw["rejected_logps"] - kw["ref_rejected_logps"]) >= -80)
    torch.testing.assert_close(alpha0[unclamped], fwd[unclamped], rtol=1e-9, atol=1e-12)
    same = {**kw, "ref_chosen_logps": kw["chosen_logps"], "ref_rejected_logps": kw["rejected_logps"]}
    for divergence in ("forward_kl", "js_divergence", "alpha_divergence"):
        for name in ("dpo", "sigmoid_norm", "robust"):
            losses, _ = call(lab, name, beta=beta, f_divergence_type=divergence, **same)
            torch.testing.assert_close(losses, torch.full_like(losses, LOG2), rtol=1e-12, atol=0)


def test_alpha_divergence_clamps_like_trl(lab):
    """(α − 1)·u is clamped at 80 before exp: u = −1000, α = 0.5 → s = (e^{80} − 1)/(−0.5)."""
    z = torch.zeros(1, dtype=torch.float64)
    one = torch.ones(1, dtype=torch.long)
    losses, _ = call(
        lab, "hinge", beta=1e-36, f_divergence_type="alpha_divergence",
        chosen_logps=torch.tensor([-1000.0], dtype=torch.float64), rejected_logps=z,
        ref_chosen_logps=z, ref_rejected_logps=z, chosen_lengths=one, rejected_lengths=one,
    )  # fmt: skip
    assert losses.item() == pytest.approx(1 - 1e-36 * (math.exp(80) - 1) / -0.5, rel=1e-12)


def test_policy_equals_reference_trl(lab):
    """u = 0: nca and bco give 2·log 2, apo_zero and apo_down 1, sppo (1/(2β))²·2, sigmoid_norm log 2,
    discopop (log 2 + 1)/2, exo KL((½, ½) ‖ (1 − ε, ε))."""
    kw = pairs()
    kw = {**kw, "ref_chosen_logps": kw["chosen_logps"], "ref_rejected_logps": kw["rejected_logps"]}
    eps = 1e-3
    expect = {
        "nca_pair": 2 * LOG2, "bco_pair": 2 * LOG2, "apo_zero": 1.0, "apo_down": 1.0, "sppo_hard": 50.0,
        "sigmoid_norm": LOG2, "discopop": (LOG2 + 1) / 2, "aot_unpaired": LOG2,
        "exo_pair": 0.5 * (math.log(0.5) - math.log1p(-eps)) + 0.5 * (math.log(0.5) - math.log(eps)),
    }  # fmt: skip
    for name, value in expect.items():
        losses, metrics = call(lab, name, **kw)
        torch.testing.assert_close(losses, torch.full((3,), value, dtype=torch.float64), rtol=1e-12, atol=0)
        assert metrics["dpo/accuracy"].item() == 0.0


@settings(max_examples=30, deadline=None)
@given(st.floats(1e-4, 0.4), BETAS)
def test_exo_pair_is_a_kl_with_its_minimum_at_the_label(lab, eps, beta):
    """KL ≥ 0, = 0 exactly where σ(βΔ) = 1 − ε, i.e. βΔ = log((1 − ε)/ε)."""
    delta = torch.tensor([math.log((1 - eps) / eps) / beta, 0.0, -3.0, 40.0], dtype=torch.float64)
    z = torch.zeros(4, dtype=torch.float64)
    n = torch.ones(4, dtype=torch.long)
    kw = dict(chosen_logps=delta, rejected_logps=z, ref_chosen_logps=z, ref_rejected_logps=z, chosen_lengths=n, rejected_lengths=n)
    losses, _ = call(lab, "exo_pair", beta=beta, label_smoothing=eps, **kw)
    assert losses[0].item() == pytest.approx(0.0, abs=1e-12)
    assert (losses[1:] > 0).all()


def test_sppo_hard_targets(lab):
    """0 exactly at u_w = 1/(2β), u_l = −1/(2β); gradient 2(u − target) per side."""
    c = torch.tensor([5.0, 6.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([-5.0, -5.0], dtype=torch.float64, requires_grad=True)
    z = torch.zeros(2, dtype=torch.float64)
    n = torch.ones(2, dtype=torch.long)
    losses, _ = call(lab, "sppo_hard", chosen_logps=c, rejected_logps=r, ref_chosen_logps=z, ref_rejected_logps=z,
                     chosen_lengths=n, rejected_lengths=n)  # fmt: skip
    assert losses.tolist() == [0.0, 1.0]
    losses.sum().backward()
    assert c.grad.tolist() == [0.0, 2.0] and r.grad.tolist() == [0.0, 0.0]


@settings(max_examples=30, deadline=None)
@given(random_pairs(), BETAS, st.sampled_from([0.0, 0.1, 0.3]))
def test_aot_single_pair_is_cdpo_and_batch_order_does_not_matter(lab, kw, beta, eps):
    one = {k: v[:1] for k, v in kw.items()}
    want, _ = call(lab, "cdpo", beta=beta, label_smoothing=eps, **one)
    for name in ("aot", "aot_unpaired"):
        got, _ = call(lab, name, beta=beta, label_smoothing=eps, **one)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
        perm = torch.randperm(kw["chosen_logps"].shape[0], generator=torch.Generator().manual_seed(0))
        a, _ = call(lab, name, beta=beta, label_smoothing=eps, **kw)
        b, _ = call(lab, name, beta=beta, label_smoothing=eps, **{k: v[perm] for k, v in kw.items()})
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_discopop_limits(lab):
    """τ → 0: e^{−x} for x > 0, softplus(−x) for x < 0 (the modulation saturates)."""
    kw = pairs()
    losses, _ = call(lab, "discopop", discopop_tau=1e-4, **kw)
    expected = [math.exp(-0.3), softplus(0.1), (LOG2 + 1) / 2]
    torch.testing.assert_close(losses, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)


def test_sft_gradient_and_reference_independence(lab):
    kw = pairs()
    c = kw["chosen_logps"].clone().requires_grad_(True)
    r = kw["rejected_logps"].clone().requires_grad_(True)
    losses, _ = call(lab, "sft", **{**kw, "chosen_logps": c, "rejected_logps": r})
    losses.mean().backward()
    torch.testing.assert_close(c.grad, torch.full((3,), -1 / 11, dtype=torch.float64), rtol=1e-12, atol=0)
    assert r.grad.tolist() == [0.0, 0.0, 0.0]
    other, _ = call(lab, "sft", **{**kw, "ref_chosen_logps": kw["ref_chosen_logps"] + 7.0})
    torch.testing.assert_close(other, losses.detach(), rtol=0, atol=0)
    empty = {**kw, "chosen_lengths": torch.zeros(3, dtype=torch.long), "chosen_logps": torch.zeros(3, dtype=torch.float64)}
    assert call(lab, "sft", **empty)[0].tolist() == [0.0, 0.0, 0.0]  # no chosen token: 0 (TRL: NaN)


@settings(max_examples=25, deadline=None)
@given(random_pairs(), BETAS)
def test_combined_single_types_equal_the_single_losses(lab, kw, beta):
    singles = {"sigmoid": "dpo", "hinge": "hinge", "ipo": "ipo", "nca_pair": "nca_pair", "bco_pair": "bco_pair",
               "sppo_hard": "sppo_hard", "aot": "aot", "aot_unpaired": "aot_unpaired", "apo_zero": "apo_zero",
               "apo_down": "apo_down", "discopop": "discopop", "sft": "sft", "sigmoid_norm": "sigmoid_norm"}  # fmt: skip
    for loss_type, name in singles.items():
        got, gm = call(lab, "combined", beta=beta, loss_types=[loss_type], **kw)
        want, wm = call(lab, name, beta=beta, **kw)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert gm[f"dpo/loss_{loss_type}"].item() == pytest.approx(want.mean().item(), rel=1e-12, abs=1e-15)
        assert gm["dpo/accuracy"].item() == wm["dpo/accuracy"].item()
    got, _ = call(lab, "combined", beta=beta, loss_types=["exo_pair"], label_smoothing=0.01, **kw)
    torch.testing.assert_close(got, call(lab, "exo_pair", beta=beta, label_smoothing=0.01, **kw)[0], rtol=0, atol=0)
    got, _ = call(lab, "combined", beta=beta, loss_types=["robust"], label_smoothing=0.2, **kw)
    torch.testing.assert_close(got, call(lab, "robust", beta=beta, label_smoothing=0.2, **kw)[0], rtol=0, atol=0)


@settings(max_examples=25, deadline=None)
@given(random_pairs(), st.lists(st.floats(-2, 2), min_size=3, max_size=3))
def test_combined_is_linear_in_the_weights(lab, kw, w):
    types = ["sigmoid", "nca_pair", "sft"]
    got, _ = call(lab, "combined", loss_types=types, loss_weights=w, **kw)
    parts = [call(lab, n, **kw)[0] for n in ("dpo", "nca_pair", "sft")]
    torch.testing.assert_close(got, w[0] * parts[0] + w[1] * parts[1] + w[2] * parts[2], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- token-level inputs: LD-DPO, WPO

NAN = float("nan")


def token_pairs():
    """P = 2; chosen lengths (3, 1) in T_w = 3, rejected (2, 4) in T_l = 4; NaN at padding.

    Sequence sums: chosen (−6, −4), ref chosen (−3, −2), rejected (−2, −4), ref rejected (−2, −2).
    """
    t = lambda *rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
    kw = dict(
        chosen_logps=t(-6.0, -4.0),
        rejected_logps=t(-2.0, -4.0),
        ref_chosen_logps=t(-3.0, -2.0),
        ref_rejected_logps=t(-2.0, -2.0),
        chosen_lengths=torch.tensor([3, 1]),
        rejected_lengths=torch.tensor([2, 4]),
        chosen_token_logps=t([-1.0, -2.0, -3.0], [-4.0, NAN, NAN]),
        ref_chosen_token_logps=t([-1.0, -1.0, -1.0], [-2.0, NAN, NAN]),
        chosen_mask=torch.tensor([[True, True, True], [True, False, False]]),
        rejected_token_logps=t([-0.5, -1.5, NAN, NAN], [-1.0, -1.0, -1.0, -1.0]),
        ref_rejected_token_logps=t([-1.0, -1.0, NAN, NAN], [-0.5, -0.5, -0.5, -0.5]),
        rejected_mask=torch.tensor([[True, True, False, False], [True, True, True, True]]),
    )
    return kw


def test_ld_alpha_hand_values(lab):
    """α = 0.5, shared lengths (2, 1). Pair 0: chosen −3 + ½·(−3) = −4.5, ref −2 + ½·(−1) = −2.5,
    u_w = −2; rejected fits in the shared part: u_l = 0. Pair 1: u_w = −4 − (−2) = −2; rejected
    −1 + ½·(−3) = −2.5, ref −0.5 + ½·(−1.5) = −1.25, u_l = −1.25. Δ = (−2, −0.75)."""
    losses, metrics = call(lab, "combined", ld_alpha=0.5, **token_pairs())
    torch.testing.assert_close(losses, torch.tensor([softplus(0.2), softplus(0.075)], dtype=torch.float64), rtol=1e-12, atol=0)
    assert metrics["dpo/chosen_reward"].item() == pytest.approx(0.1 * (-2 - 2) / 2, rel=1e-12)
    assert metrics["dpo/rejected_reward"].item() == pytest.approx(0.1 * (0 - 1.25) / 2, rel=1e-12)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["sigmoid", "ipo", "nca_pair", "apo_down"]), st.floats(0.0, 1.0))
def test_ld_alpha_identities(lab, loss_type, alpha):
    """α = 1 is plain DPO; with equal lengths every α is; the gradient reaches the token log-probs
    (tail tokens scaled by α) and never the padding."""
    kw = token_pairs()
    plain, _ = call(lab, "combined", loss_types=[loss_type], **kw)
    one, _ = call(lab, "combined", loss_types=[loss_type], ld_alpha=1.0, **kw)
    torch.testing.assert_close(one, plain, rtol=1e-12, atol=1e-12)
    equal = {k: (v[:1] if k.startswith("chosen") or k.startswith("ref_chosen") else v[:1, :3] if v.ndim == 2 else v[:1])
             for k, v in kw.items()}  # fmt: skip
    equal = {**equal, "rejected_lengths": torch.tensor([3]), "rejected_mask": torch.tensor([[True, True, True]]),
             "rejected_token_logps": torch.tensor([[-0.5, -1.5, -0.25]], dtype=torch.float64),
             "ref_rejected_token_logps": torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64),
             "rejected_logps": torch.tensor([-2.25], dtype=torch.float64),
             "ref_rejected_logps": torch.tensor([-3.0], dtype=torch.float64)}  # fmt: skip
    a, _ = call(lab, "combined", loss_types=[loss_type], ld_alpha=alpha, **equal)
    b, _ = call(lab, "combined", loss_types=[loss_type], **equal)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    tok = kw["chosen_token_logps"].clone().requires_grad_(True)
    losses, _ = call(lab, "combined", loss_types=[loss_type], ld_alpha=alpha, **{**kw, "chosen_token_logps": tok})
    losses.sum().backward()
    g = tok.grad
    assert torch.isfinite(g).all() and g[1, 1:].tolist() == [0.0, 0.0]
    torch.testing.assert_close(g[0, 2], alpha * g[0, 0], rtol=1e-12, atol=1e-15)  # pair 0's tail token
    torch.testing.assert_close(g[0, 1], g[0, 0], rtol=0, atol=0)


def test_wpo_weights_hand_values(lab):
    """log Σπ² = log π − 0.1 on chosen pair 0 (w = e^{0.1}), log π + 0.2 on chosen pair 1
    (w = e^{−0.2}), = log π on the rejected side (w = 1). Unweighted dpo: Δ = (−3, 0)."""
    kw = token_pairs()
    kw["chosen_log_sum_sq_probs"] = kw["chosen_token_logps"] + torch.tensor([[-0.1], [0.2]], dtype=torch.float64)
    kw["rejected_log_sum_sq_probs"] = kw["rejected_token_logps"].clone()
    kw["chosen_token_logps"] = kw["chosen_token_logps"].clone().requires_grad_(True)
    weights = [math.exp(0.1), math.exp(-0.2)]
    losses, metrics = call(lab, "combined", use_weighting=True, **kw)
    torch.testing.assert_close(losses, torch.tensor([weights[0] * softplus(0.3), weights[1] * LOG2], dtype=torch.float64),
                               rtol=1e-12, atol=0)  # fmt: skip
    assert metrics["dpo/wpo_weight"].item() == pytest.approx(sum(weights) / 2, rel=1e-12)
    # the weights are constants: d/d log π(w) is w·(−β·σ(−βΔ)) and nothing flows into the token log-probs
    c = kw["chosen_logps"].clone().requires_grad_(True)
    call(lab, "combined", use_weighting=True, **{**kw, "chosen_logps": c})[0].sum().backward()
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = [-0.1 * weights[0] * sig(0.3), -0.1 * weights[1] * 0.5]
    torch.testing.assert_close(c.grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    assert kw["chosen_token_logps"].grad is None
    mpo, _ = call(lab, "mpo", use_weighting=True, **kw)
    parts = [call(lab, n, **{k: v for k, v in kw.items() if "token" not in k and "mask" not in k and "sq" not in k})[0]
             for n in ("dpo", "bco_pair", "sft")]  # fmt: skip
    w = torch.tensor(weights, dtype=torch.float64)
    torch.testing.assert_close(mpo, w * (0.8 * parts[0] + 0.2 * parts[1] + parts[2]), rtol=1e-12, atol=0)


def test_bco_running_mean_state(lab):
    """State (mean 0.3, count 2); batch mean of β·u over pairs() is 0 → count 3, δ = 0.3 − 0.3/3 = 0.2."""
    kw = pairs()
    state = dict(bco_reward_mean=torch.tensor(0.3, dtype=torch.float64), bco_reward_count=torch.tensor(2.0))
    mpo_knobs = {"bco_running_mean": True, "loss_types": ["bco_pair"], "loss_weights": [1.0]}
    for name, knobs in (("bco_pair", {"running_mean": True}), ("mpo", mpo_knobs)):
        losses, metrics = call(lab, name, **knobs, **kw, **state)
        expected = [softplus(-(0.1 * w - 0.2)) + softplus(0.1 * l - 0.2) for w, l in ((1, -2), (-2, -1), (2, 2))]
        torch.testing.assert_close(losses, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
        assert metrics["bco/reward_mean"].item() == pytest.approx(0.2, rel=1e-12)
        assert metrics["bco/reward_count"].item() == 3.0
    # first step: count 0 → δ is the batch mean; an empty batch leaves the state unchanged
    shifted = {**kw, "chosen_logps": kw["chosen_logps"] + 10.0}  # β·u_w + 1 on each pair: batch mean 0.5
    _, m = call(lab, "bco_pair", running_mean=True, **shifted, bco_reward_mean=torch.tensor(0.0), bco_reward_count=torch.tensor(0.0))
    assert m["bco/reward_mean"].item() == pytest.approx(0.5, rel=1e-12) and m["bco/reward_count"].item() == 1.0
    _, m = call(lab, "bco_pair", running_mean=True, **{k: v[:0] for k, v in kw.items()}, **state)
    assert m["bco/reward_mean"].item() == pytest.approx(0.3) and m["bco/reward_count"].item() == 2.0
    # off (TRL 1.16): the state inputs are ignored and no state is returned
    losses, m = call(lab, "bco_pair", **kw, **state)
    torch.testing.assert_close(losses, torch.tensor(HAND_TRL["bco_pair"], dtype=torch.float64), rtol=1e-12, atol=0)
    assert "bco/reward_mean" not in m


# --------------------------------------------------------------------------- TRL knob and input errors


@pytest.mark.parametrize(
    "name, knobs, match",
    [
        ("exo_pair", {"label_smoothing": 0.0}, "label_smoothing"),
        ("exo_pair", {"f_alpha_divergence_coef": 0.3}, "only applies with f_divergence_type = 'alpha_divergence'"),
        ("dpo", {"f_divergence_type": "kl"}, "f_divergence_type"),
        ("discopop", {"discopop_tau": 0.0}, "discopop_tau"),
        ("aot", {"label_smoothing": 0.6}, "label_smoothing"),
        ("combined", {"loss_types": ["exo_pair"]}, "exo_pair needs 0 < ε < 1"),
        ("combined", {"loss_types": ["robust"], "label_smoothing": 0.5}, "robust needs ε < 0.5"),
        ("combined", {"label_smoothing": 0.1}, "has no effect"),
        ("combined", {"discopop_tau": 0.1}, "discopop_tau = 0.1 has no effect"),
        ("combined", {"loss_types": ["aot"], "use_weighting": True}, "does not combine with aot"),
        ("combined", {"loss_types": ["nca_pair"], "f_divergence_type": "js_divergence"}, "only defined for"),
        ("combined", {"loss_types": ["sigmoid", "sft"], "loss_weights": [1.0]}, "1 weights for 2 loss types"),
        ("combined", {"loss_types": ["dpo"]}, r"\['dpo'\] are not TRL loss types"),
        ("combined", {"loss_types": []}, "at least one"),
        ("combined", {"bco_running_mean": True}, "without 'bco_pair'"),
        ("combined", {"ld_alpha": 1.5}, "ld_alpha"),
        ("mpo", {"loss_types": "sigmoid"}, "loss_types"),
    ],
)
def test_trl_knob_errors(lab, name, knobs, match):
    with pytest.raises(rllab.ConfigError, match=match) as info:
        lab.get("preference_loss", name, **knobs)
    assert f"'{name}'" in str(info.value) and "rllab_preference_losses" in str(info.value)


def test_token_input_errors_name_component_and_argument(lab):
    kw = token_pairs()
    base = {k: v for k, v in kw.items() if "token" not in k and "mask" not in k}
    with pytest.raises(ValueError, match=r"preference_loss 'combined': chosen_token_logps is required"):
        call(lab, "combined", ld_alpha=0.5, **base)
    with pytest.raises(ValueError, match=r"preference_loss 'mpo': chosen_log_sum_sq_probs is required"):
        call(lab, "mpo", use_weighting=True, **kw)
    with pytest.raises(ValueError, match=r"ref_rejected_token_logps has shape \(2, 3\) but rejected_token_logps has shape \(2, 4\)"):
        call(lab, "combined", ld_alpha=0.5, **{**kw, "ref_rejected_token_logps": kw["ref_rejected_token_logps"][:, :3]})
    bad = kw["chosen_mask"].clone()
    bad[1, 1] = True
    finite = {k: torch.nan_to_num(kw[k], nan=-1.0) for k in ("chosen_token_logps", "ref_chosen_token_logps")}
    with pytest.raises(rllab.RowError, match=r"chosen_mask counts \[2\] tokens but chosen_lengths says \[1\] in pairs \[1\]"):
        call(lab, "combined", ld_alpha=0.5, **{**kw, **finite, "chosen_mask": bad})
    nan = kw["rejected_token_logps"].clone()
    nan[1, 2] = NAN
    with pytest.raises(rllab.RowError, match=r"rejected_token_logps is not finite in rows \[1\]"):
        call(lab, "combined", ld_alpha=0.5, **{**kw, "rejected_token_logps": nan})
    with pytest.raises(ValueError, match=r"preference_loss 'bco_pair': running_mean = True needs bco_reward_mean"):
        call(lab, "bco_pair", running_mean=True, **base)


@settings(max_examples=30, deadline=None)
@given(random_pairs(), st.sampled_from(TRL_NAMES))
def test_trl_finite_losses_and_gradients(lab, kw, name):
    c = kw["chosen_logps"].clone().requires_grad_(True)
    r = kw["rejected_logps"].clone().requires_grad_(True)
    losses, metrics = call(lab, name, **{**kw, "chosen_logps": c, "rejected_logps": r})
    assert torch.isfinite(losses).all() and (losses >= 0).all()
    losses.mean().backward()
    assert torch.isfinite(c.grad).all() and torch.isfinite(r.grad).all()
    assert all(torch.isfinite(v) and not v.requires_grad for v in metrics.values())


def test_trl_empty_batch(lab):
    empty = {k: v[:0] for k, v in pairs().items()}
    for name in TRL_NAMES:
        losses, metrics = call(lab, name, **empty)
        assert losses.shape == (0,)
        assert all(v.item() == 0.0 for v in metrics.values())


@pytest.mark.parametrize("name", TRL_NAMES + ["dpo", "hinge", "ipo", "robust"])
def test_documented_for_plugins_show(lab, name):
    """``rllab plugins show NAME`` prints the module docstring, the loss docstring and the knobs:
    each must describe this loss, and every knob has a help text."""
    import sys

    spec = lab.spec("preference_loss", name)
    module_doc = sys.modules[spec.fn.__module__].__doc__
    assert f"``{name}``" in module_doc
    assert spec.doc and spec.summary
    assert all(k.help for k in spec.knobs())
    if name in ("dpo", "hinge", "ipo", "robust", "exo_pair", "discopop", "sigmoid_norm", "combined", "mpo"):
        assert {"f_divergence_type", "f_alpha_divergence_coef"} <= {k.name for k in spec.knobs()}
