"""Every registered component of every kind passes the contract suite (parametrised over the
registry, so a newly registered plugin is checked without editing this file)."""

import pytest

import rllab
from rllab.testing import contract_cases

_LAB = rllab.Lab()
# tasks that need a data file get one
_CASES = contract_cases(lab=_LAB)


@pytest.mark.parametrize("case", _CASES, ids=str)
def test_contract(case):
    case.run()


def test_suite_covers_every_tensor_kind():
    kinds = {c.kind for c in _CASES}
    for kind in ("advantage_estimator", "policy_loss", "kl_penalty", "loss_aggregation"):
        assert kind in kinds, f"no {kind} registered"
