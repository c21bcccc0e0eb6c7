"""rllab's preference losses against TRL 1.16.0's formulas.

TRL's trainers need accelerate and datasets, so TRL is not imported here. Instead each expected
value comes from a float64 transcription of the formula TRL 1.16.0 evaluates, in TRL's order of
operations (``pip download --no-deps trl==1.16.0`` to read them):

* ``trl/trainer/dpo_trainer.py``, ``DPOTrainer._compute_loss`` (``f_divergence_type="reverse_kl"``,
  the default): ``chosen_scores = chosen_logps − ref_chosen_logps``, likewise rejected,
  ``delta_score = chosen_scores − rejected_scores``, and per loss type

  - ``sigmoid``: ``−logsigmoid(β·Δ)`` (TRL 1.16 no longer applies ``label_smoothing`` here);
  - ``hinge``: ``relu(1 − β·Δ)``;
  - ``ipo``: ``(chosen_scores / max(len_w, 1) − rejected_scores / max(len_l, 1) − 1/(2β))²``;
  - ``robust``: ``(−(1−ε)·logsigmoid(β·Δ) − (−ε·logsigmoid(−β·Δ))) / (1 − 2ε)``;

  and the logged metrics ``rewards/chosen = mean(β·chosen_scores)``, ``rewards/rejected``,
  ``rewards/accuracies = mean(chosen_rewards > rejected_rewards)``, ``rewards/margins``.
* ``trl/experimental/cpo/cpo_trainer.py``, ``CPOTrainer.cpo_loss`` with ``average_log_prob``
  log-probs (``logps / length``): ``logits = ā_w − ā_l`` and

  - ``sigmoid``: ``−logsigmoid(β·logits)·(1−ε) − logsigmoid(−β·logits)·ε`` — conservative DPO's
    smoothed form; rllab's ``cdpo`` applies it to the reference-relative Δ, as TRL's DPO
    ``sigmoid`` did before 1.x;
  - ``simpo``: the same with ``logits − γ/β``; rewards ``β·ā``.

rllab's ``cdpo`` and ``robust`` default to ``label_smoothing = 0.1`` (TRL: 0.0); they are compared
at explicit values, and at 0.0 with TRL's ``sigmoid``.

GRPO advantages are checked against ``GRPOTrainer._generate_and_score_completions`` (one reward
function): groups are ``num_generations`` consecutive rows, ``A = r − mean_g``, divided by
``std + 1e-4`` where ``std`` is the unbiased (``nanstd``) std of the group (``scale_rewards="group"``)
or of the whole batch (``"batch"``), not divided for ``"none"``; that is rllab's ``grpo`` with
``epsilon=1e-4`` and ``scale`` set alike (ε = 1e-6 by default, verl's).
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch
import torch.nn.functional as F

import rllab

RTOL = 1e-5
ATOL = 1e-6


def component(name: str, **knobs):
    return rllab.Lab().get("preference_loss", name, **knobs)


def assert_close(actual, expected, what: str, *, atol: float = ATOL):
    torch.testing.assert_close(
        torch.as_tensor(actual).detach().to(torch.float64),
        torch.as_tensor(expected).detach().to(torch.float64),
        rtol=RTOL,
        atol=atol,
        msg=lambda m: f"{what}: rllab vs TRL formula differ\n{m}",
    )


# --------------------------------------------------------------------------- TRL 1.16.0 formulas, float64


def trl_dpo_losses(loss_type, pairs, *, beta, label_smoothing=0.0):
    """DPOTrainer._compute_loss's per-sequence loss and metrics (reverse-KL scores)."""
    chosen_scores = pairs["chosen_logps"] - pairs["ref_chosen_logps"]
    rejected_scores = pairs["rejected_logps"] - pairs["ref_rejected_logps"]
    delta = chosen_scores - rejected_scores
    if loss_type == "sigmoid":
        loss = -F.logsigmoid(beta * delta)
    elif loss_type == "hinge":
        loss = torch.relu(1 - beta * delta)
    elif loss_type == "ipo":
        chosen_avg = chosen_scores / pairs["chosen_lengths"].clamp(min=1.0)
        rejected_avg = rejected_scores / pairs["rejected_lengths"].clamp(min=1.0)
        loss = (chosen_avg - rejected_avg - 1 / (2 * beta)) ** 2
    elif loss_type == "robust":
        clean = -(1 - label_smoothing) * F.logsigmoid(beta * delta)
        flipped = -label_smoothing * F.logsigmoid(-beta * delta)
        loss = (clean - flipped) / (1 - 2 * label_smoothing)
    else:
        raise ValueError(loss_type)
    chosen_rewards = beta * chosen_scores.detach()
    rejected_rewards = beta * rejected_scores.detach()
    return loss, _reward_metrics(chosen_rewards, rejected_rewards)


def _reward_metrics(chosen_rewards, rejected_rewards):
    """TRL's logged means, plus the largest |reward| (the scale of their float32 rounding)."""
    return {
        "chosen": chosen_rewards.mean(),
        "rejected": rejected_rewards.mean(),
        "accuracies": (chosen_rewards > rejected_rewards).double().mean(),
        "margins": (chosen_rewards - rejected_rewards).mean(),
        "scale": torch.cat([chosen_rewards.abs(), rejected_rewards.abs()]).max(),
    }


def trl_smoothed_sigmoid(logits, *, beta, label_smoothing):
    """CPOTrainer.cpo_loss's ``sigmoid`` / ``simpo`` body."""
    return -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing


def trl_cdpo_losses(pairs, *, beta, label_smoothing):
    """Conservative DPO: the smoothed sigmoid on Δ (reference-relative), DPO's metrics."""
    chosen_scores = pairs["chosen_logps"] - pairs["ref_chosen_logps"]
    delta = chosen_scores - (pairs["rejected_logps"] - pairs["ref_rejected_logps"])
    _, metrics = trl_dpo_losses("sigmoid", pairs, beta=beta)
    return trl_smoothed_sigmoid(delta, beta=beta, label_smoothing=label_smoothing), metrics


def trl_simpo_losses(pairs, *, beta, gamma, label_smoothing):
    """CPOTrainer.cpo_loss with loss_type="simpo" on length-averaged log-probs."""
    chosen_avg = pairs["chosen_logps"] / pairs["chosen_lengths"]
    rejected_avg = pairs["rejected_logps"] / pairs["rejected_lengths"]
    logits = chosen_avg - rejected_avg - gamma / beta
    loss = trl_smoothed_sigmoid(logits, beta=beta, label_smoothing=label_smoothing)
    return loss, _reward_metrics(beta * chosen_avg.detach(), beta * rejected_avg.detach())


# --------------------------------------------------------------------------- inputs


def make_pairs(P: int, seed: int, *, spread: float = 2.0) -> dict[str, torch.Tensor]:
    """Sequence log-prob sums (policy and reference) and response lengths ≥ 1, float32.

    The last pairs are edge cases: policy = reference (Δ = 0), and |βΔ| ≈ 100 both ways.
    """
    g = torch.Generator().manual_seed(zlib.crc32(repr(("pairs", P, seed)).encode()))
    chosen_lengths = torch.randint(1, 60, (P,), generator=g).float()
    rejected_lengths = torch.randint(1, 60, (P,), generator=g).float()
    ref_chosen = -torch.rand(P, generator=g) * chosen_lengths * 2
    ref_rejected = -torch.rand(P, generator=g) * rejected_lengths * 2
    chosen = ref_chosen + torch.randn(P, generator=g) * spread
    rejected = ref_rejected + torch.randn(P, generator=g) * spread
    if P >= 3:
        chosen[-3], rejected[-3] = ref_chosen[-3], ref_rejected[-3]
        chosen[-2] = ref_chosen[-2] + 1000.0
        rejected[-1] = ref_rejected[-1] + 1000.0
    return dict(
        chosen_logps=chosen,
        rejected_logps=rejected,
        ref_chosen_logps=ref_chosen,
        ref_rejected_logps=ref_rejected,
        chosen_lengths=chosen_lengths,
        rejected_lengths=rejected_lengths,
    )


SIZES = [1, 2, 7, 64]
METRICS = {"dpo/chosen_reward": "chosen", "dpo/rejected_reward": "rejected",
           "dpo/accuracy": "accuracies", "dpo/margin": "margins"}


def check(loss_fn, reference, what: str):
    """Losses, gradients w.r.t. the policy log-probs, and metrics over several batches."""
    for P in SIZES:
        for seed in (0, 1):
            pairs = make_pairs(P, seed)
            ours_in = {k: v.clone().requires_grad_(k in ("chosen_logps", "rejected_logps")) for k, v in pairs.items()}
            ref_in = {k: v.double().requires_grad_(k in ("chosen_logps", "rejected_logps")) for k, v in pairs.items()}
            losses, metrics = loss_fn(**ours_in)
            ref_losses, ref_metrics = reference(ref_in)
            case = f"{what} [P={P}, seed {seed}]"
            assert losses.shape == (P,)
            assert_close(losses, ref_losses, f"{case} losses")
            upstream = torch.linspace(0.5, 1.5, P, dtype=torch.float64)
            (losses.double() * upstream).sum().backward()
            (ref_losses * upstream).sum().backward()
            for key in ("chosen_logps", "rejected_logps"):
                assert_close(ours_in[key].grad, ref_in[key].grad, f"{case} d loss / d {key}")
            # a mean of rewards up to β·1000 in size: float32 rounding is relative to the largest
            atol = ATOL * max(1.0, float(ref_metrics["scale"]))
            for ours_key, trl_key in METRICS.items():
                assert ours_key in metrics, f"{what}: metric {ours_key!r} missing; got {sorted(metrics)}"
                assert_close(
                    metrics[ours_key], ref_metrics[trl_key], f"{case} {ours_key} vs TRL rewards/{trl_key}", atol=atol
                )


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_is_trl_sigmoid(beta):
    check(component("dpo", beta=beta), lambda p: trl_dpo_losses("sigmoid", p, beta=beta), f"dpo β={beta}")


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_hinge_is_trl_hinge(beta):
    check(component("hinge", beta=beta), lambda p: trl_dpo_losses("hinge", p, beta=beta), f"hinge β={beta}")


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_ipo_is_trl_ipo(beta):
    check(component("ipo", beta=beta), lambda p: trl_dpo_losses("ipo", p, beta=beta), f"ipo β={beta}")


@pytest.mark.parametrize("beta, eps", [(0.1, 0.0), (0.1, 0.1), (0.5, 0.3)])
def test_robust_is_trl_robust(beta, eps):
    check(
        component("robust", beta=beta, label_smoothing=eps),
        lambda p: trl_dpo_losses("robust", p, beta=beta, label_smoothing=eps),
        f"robust β={beta} ε={eps}",
    )


@pytest.mark.parametrize("beta, eps", [(0.1, 0.1), (0.5, 0.3), (0.1, 0.5)])
def test_cdpo_is_the_smoothed_sigmoid(beta, eps):
    check(
        component("cdpo", beta=beta, label_smoothing=eps),
        lambda p: trl_cdpo_losses(p, beta=beta, label_smoothing=eps),
        f"cdpo β={beta} ε={eps}",
    )


def test_cdpo_without_smoothing_is_trl_sigmoid():
    check(component("cdpo", label_smoothing=0.0), lambda p: trl_dpo_losses("sigmoid", p, beta=0.1), "cdpo ε=0")


@pytest.mark.parametrize("beta, gamma, eps", [(0.1, 0.5, 0.0), (2.0, 1.0, 0.0), (2.5, 1.4, 0.1)])
def test_simpo_is_trl_cpo_simpo(beta, gamma, eps):
    check(
        component("simpo", beta=beta, gamma=gamma, label_smoothing=eps),
        lambda p: trl_simpo_losses(p, beta=beta, gamma=gamma, label_smoothing=eps),
        f"simpo β={beta} γ={gamma} ε={eps}",
    )


def test_simpo_ignores_the_reference():
    pairs = make_pairs(7, 3)
    a, _ = component("simpo")(**pairs)
    b, _ = component("simpo")(**{**pairs, "ref_chosen_logps": pairs["ref_chosen_logps"] + 5.0})
    assert torch.equal(a, b)


def test_hand_values():
    """policy = reference: dpo = log 2, hinge = 1, ipo = (1/(2β))², robust = log 2 (any ε)."""
    pairs = make_pairs(4, 0)
    pairs["chosen_logps"] = pairs["ref_chosen_logps"].clone()
    pairs["rejected_logps"] = pairs["ref_rejected_logps"].clone()
    ones = torch.ones(4)
    assert_close(component("dpo")(**pairs)[0], math.log(2) * ones, "dpo at Δ = 0")
    assert_close(component("hinge")(**pairs)[0], ones, "hinge at Δ = 0")
    assert_close(component("ipo", beta=0.1)(**pairs)[0], 25.0 * ones, "ipo at Δ = 0, β = 0.1")
    assert_close(component("robust", label_smoothing=0.2)(**pairs)[0], math.log(2) * ones, "robust at Δ = 0")
    assert_close(component("cdpo", label_smoothing=0.2)(**pairs)[0], math.log(2) * ones, "cdpo at Δ = 0")


def test_ipo_empty_response_uses_length_one_as_trl():
    pairs = make_pairs(3, 5)
    pairs["chosen_lengths"] = torch.tensor([0.0, 4.0, 0.0])
    losses, _ = component("ipo")(**pairs)
    ref, _ = trl_dpo_losses("ipo", {k: v.double() for k, v in pairs.items()}, beta=0.1)
    assert_close(losses, ref, "ipo with an empty chosen response")


# --------------------------------------------------------------------------- GRPO advantages


def trl_grpo_advantages(rewards: torch.Tensor, num_generations: int, scale: str) -> torch.Tensor:
    """GRPOTrainer's advantage for one reward function, float64 (TRL 1.16.0, grpo_trainer.py)."""
    grouped = rewards.view(-1, num_generations)
    mean = grouped.mean(dim=1).repeat_interleave(num_generations)
    advantages = rewards - mean
    if scale == "none":
        return advantages
    if scale == "group":
        std = grouped.std(dim=1).repeat_interleave(num_generations)
    else:
        std = rewards.std().expand_as(rewards)
    return advantages / (std + 1e-4)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("num_generations", [2, 4, 8])
def test_grpo_is_trl_grpo_advantage(scale, num_generations):
    for seed in range(3):
        g = torch.Generator().manual_seed(zlib.crc32(repr(("grpo", scale, num_generations, seed)).encode()))
        n_prompts, T = 5, 6
        B = n_prompts * num_generations
        binary = seed == 0  # 0/1 rewards: all-equal groups are likely
        scores = (torch.rand(B, generator=g) < 0.5).float() if binary else torch.randn(B, generator=g)
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        mask = torch.arange(T)[None, :] < lengths[:, None]
        token_rewards = torch.where(torch.arange(T)[None, :] == (lengths - 1)[:, None], scores[:, None], 0.0)
        index = torch.arange(B) // num_generations
        est = rllab.Lab().get("advantage_estimator", "grpo", epsilon=1e-4, scale=scale)
        advantages, _ = est(token_rewards=token_rewards, mask=mask, index=index)
        expected = trl_grpo_advantages(scores.double(), num_generations, scale)
        what = f"grpo scale={scale} G={num_generations} seed {seed}"
        assert_close(advantages, torch.where(mask, expected[:, None], 0.0), what)
