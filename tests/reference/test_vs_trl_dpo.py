"""rllab's TRL-family preference losses against TRL 1.16.0's ``DPOTrainer._compute_loss``.

TRL's trainer module imports accelerate, datasets and transformers' Trainer, so TRL is not
imported: ``trl_compute_loss`` below is a float64 transcription of the loss part of
``trl/trainer/dpo_trainer.py`` (``DPOTrainer._compute_loss``, TRL 1.16.0; ``pip download --no-deps
trl==1.16.0`` to read it), in TRL's order of operations and on TRL's own layout: one padded batch
of 2P rows, chosen first, with per-token log-probs that are 0 off the completion (as TRL's fused LM
head returns them) and one ``completion_mask``. It covers

* ``ld_alpha`` (shared / tail masks from the running position ``cumsum(completion_mask)`` and
  ``min(chosen_len, rejected_len)``, for the policy and the reference);
* the four ``f_divergence_type`` score transforms, with ``f_alpha_divergence_coef``;
* every loss type of the ``loss_type`` list, each multiplied by its ``loss_weights`` entry;
* ``use_weighting`` (WPO: ``exp(mean_t(log π − log_sum_sq_probs))``, chosen × rejected);
* the logged ``rewards/*`` metrics.

Here the completion mask stands for both TRL's ``completion_mask`` (ipo, sigmoid_norm lengths)
and ``shift_completion_mask`` (everything else): they differ by a one-position shift only, with
the same count per row whenever the prompt is non-empty. ``bco_pair``'s running-mean shift is
checked against a transcription of TRL 0.x's ``RunningMoments`` (TRL 1.16 has no shift).

rllab is fed the same numbers in its own layout (sequence sums (P,), per-side token tensors
(P, T_w) / (P, T_l)) in float32; its per-pair losses are compared with TRL's per-sequence losses
(Σ_k w_k·loss_k, whose mean is TRL's loss), and the gradients with respect to the per-token
log-probs. Token log-probs are multiples of 1/64, so float32 sums are exact and only the loss
arithmetic rounds.
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

# --------------------------------------------------------------------------- TRL 1.16.0, float64


class RunningMoments:
    """TRL 0.x ``trl.trainer.utils.RunningMoments``, the parts ``bco_pair`` used (single process)."""

    def __init__(self):
        self.mean, self.var, self.count = 0, 1, 1e-24

    def update(self, xs):
        xs_count = xs.numel()
        xs_var, xs_mean = torch.var_mean(xs, unbiased=False)
        delta = xs_mean - self.mean
        tot_count = self.count + xs_count
        self.mean += delta * xs_count / tot_count
        self.count = tot_count


def trl_compute_loss(
    per_token_logps,
    ref_per_token_logps,
    completion_mask,
    log_sum_sq_probs=None,
    *,
    loss_types,
    loss_weights=None,
    beta=0.1,
    label_smoothing=0.0,
    ld_alpha=None,
    f_divergence_type="reverse_kl",
    f_alpha_divergence_coef=0.5,
    use_weighting=False,
    discopop_tau=0.05,
    running=None,
):
    """Returns (per-sequence Σ_k w_k·loss_k (P,), loss scalar, metrics)."""
    loss_weights = loss_weights or [1.0] * len(loss_types)
    shift_completion_mask = completion_mask
    if ld_alpha is None:
        logps = per_token_logps.sum(dim=1)
        ref_logps = ref_per_token_logps.sum(dim=1)
    else:
        comp_pos = shift_completion_mask.cumsum(dim=1)
        comp_lens = shift_completion_mask.sum(dim=1).long()
        chosen_lens, rejected_lens = comp_lens.chunk(2, dim=0)
        shared_lens = torch.minimum(chosen_lens, rejected_lens)
        shared_lens = torch.cat([shared_lens, shared_lens], dim=0)
        shared_mask = (comp_pos > 0) & (comp_pos <= shared_lens.unsqueeze(1))
        tail_mask = comp_pos > shared_lens.unsqueeze(1)
        shared_logps = (per_token_logps * shared_mask).sum(dim=1)
        tail_logps = (per_token_logps * tail_mask).sum(dim=1)
        logps = shared_logps + ld_alpha * tail_logps
        ref_shared_logps = (ref_per_token_logps * shared_mask).sum(dim=1)
        ref_tail_logps = (ref_per_token_logps * tail_mask).sum(dim=1)
        ref_logps = ref_shared_logps + ld_alpha * ref_tail_logps
    chosen_logps, rejected_logps = logps.chunk(2, dim=0)
    ref_chosen_logps, ref_rejected_logps = ref_logps.chunk(2, dim=0)
    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps

    if f_divergence_type == "reverse_kl":
        chosen_scores, rejected_scores = chosen_logratios, rejected_logratios
    elif f_divergence_type == "forward_kl":
        chosen_scores = 1 - torch.exp(-chosen_logratios)
        rejected_scores = 1 - torch.exp(-rejected_logratios)
    elif f_divergence_type == "js_divergence":
        chosen_scores = math.log(2) + F.logsigmoid(chosen_logratios)
        rejected_scores = math.log(2) + F.logsigmoid(rejected_logratios)
    elif f_divergence_type == "alpha_divergence":
        if abs(f_alpha_divergence_coef - 1.0) < 1e-6:
            chosen_scores, rejected_scores = chosen_logratios, rejected_logratios
        else:
            coef = 1.0 / (f_alpha_divergence_coef - 1.0)
            t_chosen = (f_alpha_divergence_coef - 1.0) * chosen_logratios
            t_rejected = (f_alpha_divergence_coef - 1.0) * rejected_logratios
            clamp_max = 80.0  # TRL's float32 / bfloat16 entry (it has none for float64)
            chosen_scores = (torch.exp(torch.clamp(t_chosen, max=clamp_max)) - 1.0) * coef
            rejected_scores = (torch.exp(torch.clamp(t_rejected, max=clamp_max)) - 1.0) * coef
    delta_score = chosen_scores - rejected_scores

    total = 0.0
    loss = 0.0
    for loss_type, loss_weight in zip(loss_types, loss_weights, strict=True):
        if loss_type == "sigmoid":
            per_sequence_loss = -F.logsigmoid(beta * delta_score)
        elif loss_type == "hinge":
            per_sequence_loss = torch.relu(1 - beta * delta_score)
        elif loss_type == "ipo":
            chosen_mask, rejected_mask = completion_mask.chunk(2, dim=0)
            chosen_avg_score = chosen_scores / chosen_mask.sum(dim=1).clamp(min=1.0)
            rejected_avg_score = rejected_scores / rejected_mask.sum(dim=1).clamp(min=1.0)
            per_sequence_loss = (chosen_avg_score - rejected_avg_score - 1 / (2 * beta)) ** 2
        elif loss_type == "exo_pair":
            epsilon = torch.tensor(label_smoothing, dtype=torch.float64)
            qw = torch.sigmoid(beta * delta_score)
            log_qw = F.logsigmoid(beta * delta_score)
            log_pw = torch.log1p(-epsilon)
            ql = torch.sigmoid(-beta * delta_score)
            log_ql = F.logsigmoid(-beta * delta_score)
            log_pl = torch.log(epsilon)
            per_sequence_loss = qw * (log_qw - log_pw) + ql * (log_ql - log_pl)
        elif loss_type == "nca_pair":
            chosen_rewards = beta * chosen_logratios
            rejected_rewards = beta * rejected_logratios
            per_sequence_loss = (
                -F.logsigmoid(chosen_rewards) - 0.5 * F.logsigmoid(-chosen_rewards) - 0.5 * F.logsigmoid(-rejected_rewards)
            )
        elif loss_type == "robust":
            clean_loss_term = -(1 - label_smoothing) * F.logsigmoid(beta * delta_score)
            flipped_loss_term = -label_smoothing * F.logsigmoid(-beta * delta_score)
            per_sequence_loss = (clean_loss_term - flipped_loss_term) / (1 - 2 * label_smoothing)
        elif loss_type == "bco_pair":
            chosen_rewards = beta * chosen_logratios
            rejected_rewards = beta * rejected_logratios
            if running is None:  # TRL 1.16
                per_sequence_loss = -F.logsigmoid(chosen_rewards) - F.logsigmoid(-rejected_rewards)
            else:  # TRL 0.x
                rewards = torch.cat((chosen_rewards, rejected_rewards), 0).mean().detach()
                running.update(rewards)
                delta = running.mean
                per_sequence_loss = -F.logsigmoid((beta * chosen_logratios) - delta) - F.logsigmoid(
                    -(beta * rejected_logratios - delta)
                )
        elif loss_type == "sppo_hard":
            winner_margin_error = (chosen_logratios - 0.5 / beta) ** 2
            loser_margin_error = (rejected_logratios + 0.5 / beta) ** 2
            per_sequence_loss = winner_margin_error + loser_margin_error
        elif loss_type == "aot":
            logratios = chosen_logps - rejected_logps
            ref_logratios = ref_chosen_logps - ref_rejected_logps
            logratios_sorted, _ = torch.sort(logratios, dim=0)
            ref_logratios_sorted, _ = torch.sort(ref_logratios, dim=0)
            delta = logratios_sorted - ref_logratios_sorted
            per_sequence_loss = (
                -F.logsigmoid(beta * delta) * (1 - label_smoothing) - F.logsigmoid(-beta * delta) * label_smoothing
            )
        elif loss_type == "aot_unpaired":
            chosen_logratios_sorted, _ = torch.sort(chosen_logratios, dim=0)
            rejected_logratios_sorted, _ = torch.sort(rejected_logratios, dim=0)
            delta = chosen_logratios_sorted - rejected_logratios_sorted
            per_sequence_loss = (
                -F.logsigmoid(beta * delta) * (1 - label_smoothing) - F.logsigmoid(-beta * delta) * label_smoothing
            )
        elif loss_type == "apo_zero":
            losses_chosen = 1 - torch.sigmoid(beta * chosen_logratios)
            losses_rejected = torch.sigmoid(beta * rejected_logratios)
            per_sequence_loss = losses_chosen + losses_rejected
        elif loss_type == "apo_down":
            losses_chosen = torch.sigmoid(beta * chosen_logratios)
            losses_rejected = 1 - torch.sigmoid(beta * (chosen_logratios - rejected_logratios))
            per_sequence_loss = losses_chosen + losses_rejected
        elif loss_type == "discopop":
            logits = delta_score * beta
            log_ratio_modulation = torch.sigmoid(logits / discopop_tau)
            logistic_component = -F.logsigmoid(logits)
            exp_component = torch.exp(-logits)
            per_sequence_loss = logistic_component * (1 - log_ratio_modulation) + exp_component * log_ratio_modulation
        elif loss_type == "sft":
            chosen_mask, _ = shift_completion_mask.chunk(2, dim=0)
            chosen_per_token_logps, _ = per_token_logps.chunk(2, dim=0)
            batch_loss = -chosen_per_token_logps[chosen_mask.bool()].mean()
            per_sequence_loss = batch_loss.expand(chosen_per_token_logps.size(0))
        elif loss_type == "sigmoid_norm":
            chosen_mask, rejected_mask = completion_mask.chunk(2, dim=0)
            chosen_avg_score = chosen_scores / chosen_mask.sum(dim=1).clamp(min=1.0)
            rejected_avg_score = rejected_scores / rejected_mask.sum(dim=1).clamp(min=1.0)
            per_sequence_loss = -F.logsigmoid(beta * (chosen_avg_score - rejected_avg_score))
        else:
            raise ValueError(loss_type)
        if use_weighting:
            completion_lengths = shift_completion_mask.sum(dim=1).clamp_min(1)
            with torch.no_grad():
                aligned_logps = (per_token_logps - log_sum_sq_probs) * shift_completion_mask
            mean_logps = aligned_logps.sum(dim=1) / completion_lengths
            weights = torch.exp(mean_logps)
            chosen_weights, rejected_weights = weights.chunk(2, dim=0)
            # TRL multiplies in place (per_sequence_loss *= ...), which fails on sft's expanded tensor
            per_sequence_loss = per_sequence_loss * (chosen_weights * rejected_weights)
        total = total + per_sequence_loss * loss_weight
        loss = loss + per_sequence_loss.mean() * loss_weight

    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    metrics = {
        "chosen": chosen_rewards.mean(),
        "rejected": rejected_rewards.mean(),
        "accuracies": (chosen_rewards > rejected_rewards).double().mean(),
        "margins": (chosen_rewards - rejected_rewards).mean(),
    }
    return total, loss, metrics


# --------------------------------------------------------------------------- inputs


def make_batch(P: int, seed: int, *, with_edges: bool = True):
    """A TRL-layout batch: (2P, T) per-token log-probs of policy and reference (multiples of
    1/64, 0 off the completion), ``completion_mask``, and WPO's ``log_sum_sq_probs`` (≤ log π).

    The last pairs are edge cases: policy = reference, and a shift of ±64 nats on one side.
    """
    g = torch.Generator().manual_seed(zlib.crc32(repr(("trl-dpo", P, seed)).encode()))
    lengths = torch.randint(1, 12, (2 * P,), generator=g)
    T = int(lengths.max())
    mask = torch.arange(T)[None, :] < lengths[:, None]
    q = lambda x: torch.round(x * 64) / 64  # noqa: E731
    ref = q(-torch.rand(2 * P, T, generator=g, dtype=torch.float64) * 3)
    policy = q(ref + torch.randn(2 * P, T, generator=g, dtype=torch.float64) * 0.5)
    policy = torch.minimum(policy, torch.zeros(()))
    if with_edges and P >= 3:
        policy[P - 3], policy[2 * P - 3] = ref[P - 3], ref[2 * P - 3]  # policy = reference
        policy[P - 2, 0] = ref[P - 2, 0] + 64.0  # chosen far up
        policy[2 * P - 1, 0] = ref[2 * P - 1, 0] + 64.0  # rejected far up
    lssp = q(policy - torch.rand(2 * P, T, generator=g, dtype=torch.float64))
    zero = torch.zeros((), dtype=torch.float64)
    return (torch.where(mask, policy, zero), torch.where(mask, ref, zero), mask, torch.where(mask, lssp, zero))


def rllab_inputs(policy, ref, mask, lssp, dtype=torch.float32):
    """The same batch in rllab's layout, from a leaf ``policy`` tensor; each side keeps only its
    own padded width, and padding holds NaN (rllab must never read it)."""
    P = policy.shape[0] // 2
    cl, rl = mask[:P].sum(-1), mask[P:].sum(-1)
    Tw, Tl = int(cl.max()), int(rl.max())
    nan = torch.tensor(float("nan"), dtype=dtype)

    def side(x, rows, width, m):
        return torch.where(m, x[rows, :width].to(dtype), nan)

    cm, rm = mask[:P, :Tw], mask[P:, :Tl]
    pol = policy.to(dtype)
    return dict(
        chosen_logps=(pol[:P] * mask[:P]).sum(-1),
        rejected_logps=(pol[P:] * mask[P:]).sum(-1),
        ref_chosen_logps=ref[:P].sum(-1).to(dtype),
        ref_rejected_logps=ref[P:].sum(-1).to(dtype),
        chosen_lengths=cl,
        rejected_lengths=rl,
        chosen_token_logps=torch.where(cm, pol[:P, :Tw], nan),
        rejected_token_logps=torch.where(rm, pol[P:, :Tl], nan),
        ref_chosen_token_logps=side(ref, slice(0, P), Tw, cm),
        ref_rejected_token_logps=side(ref, slice(P, 2 * P), Tl, rm),
        chosen_mask=cm,
        rejected_mask=rm,
        chosen_log_sum_sq_probs=side(lssp, slice(0, P), Tw, cm),
        rejected_log_sum_sq_probs=side(lssp, slice(P, 2 * P), Tl, rm),
    )


SEQUENCE_KEYS = ("chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps", "chosen_lengths", "rejected_lengths")
METRICS = {"dpo/chosen_reward": "chosen", "dpo/rejected_reward": "rejected", "dpo/accuracy": "accuracies", "dpo/margin": "margins"}


def assert_close(actual, expected, what: str, *, atol: float = ATOL):
    torch.testing.assert_close(
        torch.as_tensor(actual).detach().to(torch.float64),
        torch.as_tensor(expected).detach().to(torch.float64),
        rtol=RTOL,
        atol=atol,
        msg=lambda m: f"{what}: rllab vs TRL formula differ\n{m}",
    )


def check(name: str, knobs: dict, trl_kwargs: dict, *, token_inputs: bool = False, sizes=(1, 2, 7, 33), edges=True):
    """rllab component ``name`` with ``knobs`` vs ``trl_compute_loss(**trl_kwargs)``: per-pair
    losses, TRL's scalar loss, gradients w.r.t. every per-token policy log-prob, metrics."""
    comp = rllab.Lab().get("preference_loss", name, **knobs)
    for P in sizes:
        for seed in (0, 1):
            policy, ref, mask, lssp = make_batch(P, seed, with_edges=edges)
            leaf32 = policy.float().requires_grad_(True)
            ours_in = rllab_inputs(leaf32, ref, mask, lssp)
            if not token_inputs:
                ours_in = {k: ours_in[k] for k in SEQUENCE_KEYS}
            losses, metrics = comp(**ours_in)
            leaf64 = policy.clone().requires_grad_(True)
            # TRL's fused head returns 0 with no gradient off the completion: hence leaf · mask
            ref_total, ref_loss, ref_metrics = trl_compute_loss(leaf64 * mask, ref, mask, lssp, **trl_kwargs)
            case = f"{name} {knobs} [P={P}, seed {seed}]"
            assert losses.shape == (P,)
            assert_close(losses, ref_total, f"{case} per-pair losses")
            assert_close(losses.mean(), ref_loss, f"{case} TRL's loss")
            losses.mean().backward()
            ref_loss.backward()
            scale = max(1.0, float(leaf64.grad.abs().max()))
            assert_close(leaf32.grad, leaf64.grad, f"{case} d loss / d per-token log π", atol=ATOL * scale)
            for ours_key, trl_key in METRICS.items():
                atol = 1e-5 * max(1.0, abs(float(ref_metrics[trl_key])))
                assert_close(metrics[ours_key], ref_metrics[trl_key], f"{case} {ours_key}", atol=atol)


# --------------------------------------------------------------------------- single loss types

SINGLE = [
    ("exo_pair", {"label_smoothing": 1e-3}),
    ("exo_pair", {"label_smoothing": 0.2}),
    ("nca_pair", {}),
    ("bco_pair", {}),
    ("sppo_hard", {}),
    ("aot", {}),
    ("aot", {"label_smoothing": 0.1}),
    ("aot_unpaired", {}),
    ("aot_unpaired", {"label_smoothing": 0.25}),
    ("apo_zero", {}),
    ("apo_down", {}),
    ("discopop", {}),
    ("discopop", {"discopop_tau": 0.5}),
    ("sft", {}),
    ("sigmoid_norm", {}),
]
TRL_TYPE = {"dpo": "sigmoid"}


@pytest.mark.parametrize("beta", [0.1, 0.5])
@pytest.mark.parametrize("name, knobs", SINGLE, ids=lambda v: str(v))
def test_single_loss_is_trl(name, knobs, beta):
    trl = dict(loss_types=[name], beta=beta, **knobs)
    check(name, {"beta": beta, **knobs}, trl)


F_CASES = [
    ("forward_kl", None),
    ("js_divergence", None),
    ("alpha_divergence", None),
    ("alpha_divergence", 0.2),
    ("alpha_divergence", 1.5),
    ("alpha_divergence", 1.0),
]


@pytest.mark.parametrize("divergence, alpha", F_CASES)
@pytest.mark.parametrize("name", ["dpo", "hinge", "ipo", "robust", "exo_pair", "discopop", "sigmoid_norm"])
def test_f_divergences_are_trl(name, divergence, alpha):
    knobs = {"f_divergence_type": divergence}
    trl = {"f_divergence_type": divergence, "loss_types": [TRL_TYPE.get(name, name)]}
    if alpha is not None:
        knobs["f_alpha_divergence_coef"] = alpha
        trl["f_alpha_divergence_coef"] = alpha
    if name in ("robust",):
        knobs["label_smoothing"] = trl["label_smoothing"] = 0.1
    if name == "exo_pair":
        knobs["label_smoothing"] = trl["label_smoothing"] = 1e-3
    # forward KL's 1 − e^{−u} and α-divergences overflow on the ±64-nat edge pairs exactly as TRL does; keep them finite
    check(name, knobs, trl, sizes=(1, 2, 7), edges=divergence in ("js_divergence",))


# --------------------------------------------------------------------------- combined: weights, LD-DPO, WPO

COMBINED = [
    ({"loss_types": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0]}, False),  # MPO
    ({"loss_types": ["sigmoid", "ipo", "hinge"], "loss_weights": [0.5, 0.01, 2.0]}, False),
    ({"loss_types": ["sigmoid"], "ld_alpha": 0.5}, True),
    ({"loss_types": ["ipo", "nca_pair", "aot"], "ld_alpha": 0.0}, True),
    ({"loss_types": ["sigmoid"], "use_weighting": True}, True),
    ({"loss_types": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0], "use_weighting": True}, True),
    ({"loss_types": ["apo_zero", "sppo_hard"], "ld_alpha": 0.3, "use_weighting": True}, True),
    ({"loss_types": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5], "ld_alpha": 0.5}, True),  # sft ignores ld_alpha
    ({"loss_types": ["robust", "exo_pair"], "label_smoothing": 0.1, "f_divergence_type": "js_divergence"}, False),
    ({"loss_types": ["discopop", "sigmoid_norm"], "discopop_tau": 0.2, "ld_alpha": 0.7, "beta": 0.3}, True),
]


@pytest.mark.parametrize("knobs, tokens", COMBINED, ids=lambda v: str(v))
def test_combined_is_trl(knobs, tokens):
    trl = {k: v for k, v in knobs.items()}
    check("combined", knobs, trl, token_inputs=tokens)


def test_mpo_defaults_are_trls_mpo_recipe():
    check("mpo", {}, {"loss_types": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0]}, sizes=(4,))


def test_bco_running_mean_is_trl0_running_moments():
    """Three steps through TRL 0.x's RunningMoments vs rllab's explicit (mean, count) state."""
    comp = rllab.Lab().get("preference_loss", "bco_pair", running_mean=True, beta=0.2)
    running = RunningMoments()
    mean, count = torch.tensor(0.0), torch.tensor(0.0)
    for step in range(3):
        policy, ref, mask, lssp = make_batch(5, step)
        ours_in = {k: v for k, v in rllab_inputs(policy.float(), ref, mask, lssp).items() if k in SEQUENCE_KEYS}
        losses, metrics = comp(**ours_in, bco_reward_mean=mean, bco_reward_count=count)
        ref_total, _, _ = trl_compute_loss(policy, ref, mask, loss_types=["bco_pair"], beta=0.2, running=running)
        assert_close(losses, ref_total, f"bco_pair running mean, step {step}")
        assert_close(metrics["bco/reward_mean"], running.mean, f"running mean after step {step}")
        assert metrics["bco/reward_count"].item() == pytest.approx(running.count)
        mean, count = metrics["bco/reward_mean"], metrics["bco/reward_count"]
