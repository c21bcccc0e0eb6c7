"""Every preference loss, value for value, against a stored snapshot on one fixed batch.

Each case is a registered loss under some knobs (every f-divergence, label smoothing, LD-DPO's α,
WPO weighting, bco_pair's running mean, the combined list); its per-pair losses, metrics and the
gradients of every input that carries one are stored as exact float hex strings
(``preference_golden.json``), so a rewrite of the losses must reproduce them bit for bit.
Two cases are also checked against values computed here by hand, so the snapshot itself is right.

Regenerate the snapshot only for an intended change of a loss's values:
``python -m tests.plugins.test_preference_losses_golden > tests/plugins/preference_golden.json``.
"""

from __future__ import annotations

import functools
import json
import math
import pathlib

import pytest
import torch

import rllab

SNAPSHOT = pathlib.Path(__file__).with_name("preference_golden.json")
P, T_W, T_L = 5, 6, 7
CHOSEN_LENGTHS = (4, 6, 1, 3, 5)
REJECTED_LENGTHS = (7, 2, 3, 3, 1)
GRAD_INPUTS = ("chosen_logps", "rejected_logps", "chosen_token_logps", "rejected_token_logps")


def batch(dtype: torch.dtype = torch.float64) -> dict:
    """Five pairs with token-level inputs; the sequence log-probs are the masked token sums."""
    g = torch.Generator().manual_seed(1234)
    out = {}
    for side, lengths, T in (("chosen", CHOSEN_LENGTHS, T_W), ("rejected", REJECTED_LENGTHS, T_L)):
        mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
        tok = -torch.rand(P, T, generator=g, dtype=torch.float64) * 2.5
        ref = tok - 0.6 + torch.rand(P, T, generator=g, dtype=torch.float64) * 1.2
        lssp = -torch.rand(P, T, generator=g, dtype=torch.float64) * 1.5
        out[f"{side}_token_logps"] = tok.to(dtype)
        out[f"ref_{side}_token_logps"] = ref.to(dtype)
        out[f"{side}_log_sum_sq_probs"] = lssp.to(dtype)
        out[f"{side}_mask"] = mask
        out[f"{side}_logps"] = torch.where(mask, tok, 0.0).sum(-1).to(dtype)
        out[f"ref_{side}_logps"] = torch.where(mask, ref, 0.0).sum(-1).to(dtype)
        out[f"{side}_lengths"] = torch.tensor(lengths)
    return out


SEQUENCE = ("chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps", "chosen_lengths", "rejected_lengths")
TOKENS = (
    "chosen_token_logps", "rejected_token_logps", "ref_chosen_token_logps", "ref_rejected_token_logps",
    "chosen_mask", "rejected_mask", "chosen_log_sum_sq_probs", "rejected_log_sum_sq_probs",
)  # fmt: skip
BCO_STATE = {"bco_reward_mean": torch.tensor(0.25), "bco_reward_count": torch.tensor(3.0)}
SINGLES = (
    "dpo", "cdpo", "ipo", "hinge", "robust", "simpo", "exo_pair", "nca_pair", "bco_pair", "sppo_hard", "aot",
    "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)  # fmt: skip
F_DIVERGENCE_SINGLES = ("dpo", "hinge", "ipo", "robust", "exo_pair", "discopop", "sigmoid_norm")
DIVERGENCES = (
    {"f_divergence_type": "forward_kl"},
    {"f_divergence_type": "js_divergence"},
    {"f_divergence_type": "alpha_divergence"},
    {"f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 0.3},
)
ALL_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
    "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)  # fmt: skip
WPO_TYPES = tuple(t for t in ALL_TYPES if t not in ("aot", "aot_unpaired"))
F_TYPES = ("sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft")


def cases() -> list[tuple[str, str, dict, bool]]:
    """``(id, loss, knobs, bco state passed)``: every loss at its defaults and under each knob that changes it."""
    out = [(name, name, {}, False) for name in SINGLES]
    out += [
        ("dpo_beta", "dpo", {"beta": 0.7}, False),
        ("cdpo_eps", "cdpo", {"label_smoothing": 0.3, "beta": 0.4}, False),
        ("robust_eps", "robust", {"label_smoothing": 0.2}, False),
        ("simpo_knobs", "simpo", {"beta": 2.0, "gamma": 1.2, "label_smoothing": 0.1}, False),
        ("exo_eps", "exo_pair", {"label_smoothing": 0.2}, False),
        ("aot_eps", "aot", {"label_smoothing": 0.1}, False),
        ("aot_unpaired_eps", "aot_unpaired", {"label_smoothing": 0.1}, False),
        ("discopop_tau", "discopop", {"discopop_tau": 0.3}, False),
        ("bco_running", "bco_pair", {"running_mean": True}, True),
        ("sft_beta", "sft", {"beta": 0.5}, False),
        ("nca_beta", "nca_pair", {"beta": 0.9}, False),
        ("sppo_beta", "sppo_hard", {"beta": 0.9}, False),
        ("apo_zero_beta", "apo_zero", {"beta": 0.9}, False),
        ("apo_down_beta", "apo_down", {"beta": 0.9}, False),
    ]
    for name in F_DIVERGENCE_SINGLES:
        for i, div in enumerate(DIVERGENCES):
            out.append((f"{name}_f{i}", name, div, False))
    out += [
        ("combined", "combined", {}, False),
        ("mpo", "mpo", {}, False),
        ("combined_all", "combined", {"loss_types": ALL_TYPES, "label_smoothing": 0.1,
                                      "loss_weights": tuple(0.1 * (i + 1) for i in range(len(ALL_TYPES)))}, False),
        ("combined_all_tau", "combined", {"loss_types": ALL_TYPES, "label_smoothing": 0.05, "discopop_tau": 0.2,
                                          "beta": 0.3}, False),
        ("combined_ld", "combined", {"loss_types": ALL_TYPES, "label_smoothing": 0.1, "ld_alpha": 0.4}, False),
        ("combined_wpo", "combined", {"loss_types": WPO_TYPES, "label_smoothing": 0.1, "use_weighting": True}, False),
        ("combined_ld_wpo", "combined", {"loss_types": WPO_TYPES, "label_smoothing": 0.1, "use_weighting": True,
                                         "ld_alpha": 0.6}, False),
        ("combined_bco", "combined", {"loss_types": ("bco_pair", "sigmoid"), "bco_running_mean": True}, True),
        ("mpo_all_knobs", "mpo", {"ld_alpha": 0.5, "use_weighting": True, "bco_running_mean": True}, True),
    ]  # fmt: skip
    for i, div in enumerate(DIVERGENCES):
        out.append((f"combined_f{i}", "combined", {"loss_types": F_TYPES, "label_smoothing": 0.1, **div}, False))
        out.append((f"combined_f{i}_ld", "combined", {"loss_types": F_TYPES, "label_smoothing": 0.1, "ld_alpha": 0.3, **div}, False))
    return out


@functools.cache
def lab() -> rllab.Lab:
    return rllab.Lab()


def run_case(name: str, knobs: dict, bco: bool, dtype: torch.dtype = torch.float64) -> dict:
    """The loss's per-pair values, metrics and input gradients, as float hex strings."""
    data = batch(dtype)
    for key in GRAD_INPUTS:
        data[key] = data[key].clone().requires_grad_(True)
    spec = lab().spec("preference_loss", name)
    inputs = {k: data[k] for k in SEQUENCE}
    if "token_logps" in spec.requires:
        inputs.update({k: data[k] for k in TOKENS})
    if bco:
        inputs.update({k: v.to(dtype) for k, v in BCO_STATE.items()})
    losses, metrics = lab().get("preference_loss", name, **knobs)(**inputs)
    (losses * torch.arange(1, P + 1, dtype=losses.dtype)).sum().backward()  # a different weight per pair
    hexes = lambda t: [float(x).hex() for x in t.detach().to(torch.float64).flatten().tolist()]  # noqa: E731
    return {
        "losses": hexes(losses),
        "metrics": {k: float(v).hex() for k, v in sorted(metrics.items())},
        "grads": {k: hexes(data[k].grad) for k in GRAD_INPUTS if k in inputs and data[k].grad is not None},
    }


def describe() -> dict:
    out = {}
    for case_id, name, knobs, bco in cases():
        out[case_id] = run_case(name, knobs, bco)
    for case_id in ("dpo", "ipo", "dpo_f3", "combined_all", "combined_ld_wpo"):
        _, name, knobs, bco = next(c for c in cases() if c[0] == case_id)
        out[f"{case_id}@float32"] = run_case(name, knobs, bco, torch.float32)
    return out


@pytest.fixture(scope="module")
def snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def test_the_snapshot_covers_every_registered_loss(snapshot):
    covered = {name for _, name, _, _ in cases()}
    assert covered == {s.name for s in lab().specs("preference_loss")}
    assert set(snapshot) == set(describe_ids())


def describe_ids() -> list[str]:
    ids = [c[0] for c in cases()]
    return ids + [f"{i}@float32" for i in ("dpo", "ipo", "dpo_f3", "combined_all", "combined_ld_wpo")]


@pytest.mark.parametrize("case", cases(), ids=lambda c: c[0])
def test_values_bit_for_bit(snapshot, case):
    case_id, name, knobs, bco = case
    assert run_case(name, knobs, bco) == snapshot[case_id]


@pytest.mark.parametrize("case_id", ["dpo", "ipo", "dpo_f3", "combined_all", "combined_ld_wpo"])
def test_float32_values_bit_for_bit(snapshot, case_id):
    _, name, knobs, bco = next(c for c in cases() if c[0] == case_id)
    assert run_case(name, knobs, bco, torch.float32) == snapshot[f"{case_id}@float32"]


def _floats(hexes):
    return [float.fromhex(h) for h in hexes]


def test_the_snapshot_holds_dpo_by_hand(snapshot):
    """DPO: −log σ(β·Δ), Δ = (log π(w) − log π_ref(w)) − (log π(l) − log π_ref(l)), β = 0.1;
    ∂/∂log π(w) = −β·σ(−βΔ)·(pair weight i + 1)."""
    d = {k: v.tolist() for k, v in batch().items()}
    deltas = [
        (d["chosen_logps"][i] - d["ref_chosen_logps"][i]) - (d["rejected_logps"][i] - d["ref_rejected_logps"][i])
        for i in range(P)
    ]
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want = [-math.log(sigmoid(0.1 * x)) for x in deltas]
    got = snapshot["dpo"]
    assert _floats(got["losses"]) == pytest.approx(want, rel=1e-13)
    grad = [-(i + 1) * 0.1 * sigmoid(-0.1 * x) for i, x in enumerate(deltas)]
    assert _floats(got["grads"]["chosen_logps"]) == pytest.approx(grad, rel=1e-13)
    assert _floats(got["grads"]["rejected_logps"]) == pytest.approx([-g for g in grad], rel=1e-13)
    assert float.fromhex(got["metrics"]["dpo/accuracy"]) == sum(x > 0 for x in deltas) / P
    assert float.fromhex(got["metrics"]["dpo/margin"]) == pytest.approx(0.1 * sum(deltas) / P, rel=1e-13)


def test_the_snapshot_holds_ipo_by_hand(snapshot):
    """IPO: (u_w/|w| − u_l/|l| − 1/(2β))², u the policy/reference log-ratio, β = 0.1 (target 5);
    ∂/∂log π(w) = 2·(…)/|w|·(pair weight)."""
    d = {k: v.tolist() for k, v in batch().items()}
    x = [
        (d["chosen_logps"][i] - d["ref_chosen_logps"][i]) / CHOSEN_LENGTHS[i]
        - (d["rejected_logps"][i] - d["ref_rejected_logps"][i]) / REJECTED_LENGTHS[i]
        - 5.0
        for i in range(P)
    ]
    got = snapshot["ipo"]
    assert _floats(got["losses"]) == pytest.approx([v * v for v in x], rel=1e-13)
    grad = [(i + 1) * 2 * v / CHOSEN_LENGTHS[i] for i, v in enumerate(x)]
    assert _floats(got["grads"]["chosen_logps"]) == pytest.approx(grad, rel=1e-13)


if __name__ == "__main__":
    print(json.dumps(describe(), indent=1, sort_keys=True))


def test_no_loss_is_picked_by_comparing_its_name():
    """Each loss is its own function (``trl.LOSSES`` maps TRL's names to them): no ``== "name"``."""
    import ast

    package = pathlib.Path(rllab.__file__).resolve().parents[1] / "plugins" / "rllab_preference_losses"
    names = {s.name for s in lab().specs("preference_loss")} | set(ALL_TYPES)
    found = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                strings = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                found += [f"{path.name}:{node.lineno}" for s in strings if s in names]
    assert found == []
