"""The rl step's optional inputs (rllab_algorithms.inputs): made once, passed by ``requires``, sliced by rows."""

from __future__ import annotations

import inspect
import re
import types

import pytest
import torch

import rllab
from rllab_algorithms import rl
from rllab_algorithms.inputs import Inputs, Provider, before_update, models

LAB = rllab.Lab()


class _Echo:
    """A component stand-in that returns the keywords it was called with."""

    def __init__(self, requires, kind="advantage_estimator"):
        self.spec = types.SimpleNamespace(requires=tuple(requires), kind=kind)

    def __call__(self, **kw):
        return kw


def test_each_component_gets_exactly_what_it_requires_each_input_made_once():
    made = []
    batch = types.SimpleNamespace(input_ids=torch.zeros(4, 3))
    providers = {
        "a": Provider(fn=lambda ctx, s: made.append("a") or torch.arange(4.0)),
        "b": Provider(fn=lambda ctx, s: made.append("b") or torch.arange(4.0) * 10),
        "n": Provider(fn=lambda ctx, s: made.append("n") or s.size, per_rows=True),
    }
    inputs = Inputs(None, batch, providers)
    assert _Echo(())(**inputs.required(_Echo(()))) == {}
    got = inputs.call(_Echo(["a"]), mask=1)
    assert set(got) == {"mask", "a"} and torch.equal(got["a"], torch.tensor([0.0, 1, 2, 3]))
    both = inputs.call(_Echo(["a", "b", "n"]))
    assert both["n"] == 4 and made == ["a", "b", "n"]  # "a" was kept from the first call
    # a view over rows: the whole batch's inputs, those rows; a per-rows input made for the view
    view = inputs.rows(torch.tensor([3, 1]))
    sub = view.call(_Echo(["a", "b", "n"]))
    assert torch.equal(sub["a"], torch.tensor([3.0, 1.0])) and torch.equal(sub["b"], torch.tensor([30.0, 10.0]))
    assert sub["n"] == 2 and made == ["a", "b", "n", "n"]
    with pytest.raises(rllab.RllabError, match=r"no step input named 'c'.*a, b, n"):
        inputs.call(_Echo(["c"]))


def test_given_inputs_win_and_none_stays_none_in_a_view():
    batch = types.SimpleNamespace(input_ids=torch.zeros(3, 2))
    providers = {"v": Provider(fn=lambda ctx, s: pytest.fail("a given input is not made again"))}
    inputs = Inputs(None, batch, providers, given={"v": None})
    assert inputs.rows(torch.tensor([0]))["v"] is None


def test_the_models_and_the_forward_before_the_update_follow_the_components_requires():
    comps = {"advantage": LAB.get("advantage_estimator", "gae"), "policy_loss": LAB.get("policy_loss", "ppo_clip"),
             "aggregation": LAB.get("loss_aggregation", "token-mean")}
    assert models(rl.PROVIDERS, comps, rl.RL.provides) == {"critic"}
    assert not before_update(rl.PROVIDERS, comps, rl.RL.provides)
    comps["advantage"] = LAB.get("advantage_estimator", "optimal_token_baseline")
    assert models(rl.PROVIDERS, comps, rl.RL.provides) == set() and before_update(rl.PROVIDERS, comps, rl.RL.provides)
    # a kind the algorithm passes nothing to is not asked (a preference loss in an rl run's components)
    comps = {"preference_loss": LAB.get("preference_loss", "combined")}
    assert models(rl.PROVIDERS, comps, rl.RL.provides) == set() and not before_update(rl.PROVIDERS, comps, rl.RL.provides)


def test_the_providers_cover_what_the_rl_step_declares_it_provides():
    declared = {name for names in rl.RL.provides.values() for name in names}
    assert declared <= set(rl.PROVIDERS)


def test_the_rl_step_asks_traits_never_requires_or_names():
    source = inspect.getsource(rl)
    assert "requires" not in re.sub(r'""".*?"""|#.*', "", source, flags=re.S)
    assert not re.search(r"\.name\s*[!=]=", source)
