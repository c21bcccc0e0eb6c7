"""Every registered component of every kind passes the contract suite (parametrised over the
registry, so a newly registered plugin is checked without editing this file)."""

import json
import tempfile
from pathlib import Path

import pytest

import rllab
from rllab.testing import contract_cases, required_knobs

_LAB = rllab.Lab()

# Components whose required knobs need real inputs get them here.
_DATA = Path(tempfile.mkdtemp(prefix="rllab-contract-")) / "rows.jsonl"
_DATA.write_text("".join(json.dumps({"prompt": f"{i}*2=", "answer": str(2 * i)}) + "\n" for i in range(40)))
_KNOBS = {("task", "jsonl"): {"path": str(_DATA)}, ("policy_loss", "dro"): {"beta": 0.1}}

_CASES = []
for _spec in _LAB.specs():
    _given = _KNOBS.get((_spec.kind, _spec.name), {})
    _CASES += [c for c in contract_cases(lab=_LAB, names=[_spec.name], knobs=_given) if c.kind == _spec.kind]


@pytest.mark.parametrize("case", _CASES, ids=str)
def test_contract(case):
    case.run()


def test_no_component_is_left_unchecked():
    """Every component can be built for the suite (none skipped for missing knobs)."""
    missing = [
        (s.kind, s.name, m)
        for s in _LAB.specs()
        if (m := required_knobs(_LAB, s.kind, s.name, _KNOBS.get((s.kind, s.name), {})))
    ]
    assert missing == []


def test_suite_covers_every_tensor_kind():
    kinds = {c.kind for c in _CASES}
    for kind in ("advantage_estimator", "policy_loss", "kl_penalty", "loss_aggregation", "importance_correction", "value_loss", "preference_loss", "kl_controller", "task", "logger", "rollout_backend"):
        assert kind in kinds, f"no {kind} registered"
