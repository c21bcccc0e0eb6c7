"""Component traits: declared once, in ``register(...)``, checked there and read from the spec."""

from __future__ import annotations

import types

import attrs
import pytest

import rllab
from rllab.config import ConfigError, load_config
from rllab.lab import Lab
from rllab.traits import TRAITS

from .tiny import TINY, overrides


@attrs.frozen
class WhitenConfig:
    whiten: bool = rllab.knob(True, help="whiten over the batch")


def estimator(*, token_rewards, mask, index, values=None, config):
    """A stand-in estimator (never called here)."""
    return token_rewards, token_rewards


def loss(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None, **extra):
    """A stand-in policy loss."""
    return aggregate(-advantages * log_prob, mask), {}


def plugin(name: str, hook: str, *registrations) -> types.ModuleType:
    """A module plugin whose ``hook`` calls ``register(*args, **kwargs)`` per (args, kwargs)."""
    mod = types.ModuleType(name)

    def impl(register):
        for args, kwargs in registrations:
            register(*args, **kwargs)

    impl.__name__ = hook
    setattr(mod, hook, rllab.hookimpl(impl))
    return mod


def problems(mod) -> list[str]:
    lab = Lab([mod], entry_points=False)
    assert [p.name for p in lab.plugins if not p.ok] == [mod.__name__]
    return lab.problems


def test_a_declared_trait_is_read_from_the_spec():
    mod = plugin(
        "traity",
        "register_advantage_estimators",
        (("fixed", estimator), {"batch_step": "whiten"}),
        (("knobbed", estimator), {"config": WhitenConfig, "batch_step": lambda c: "whiten" if c.whiten else None}),
        (("plain", estimator), {}),
    )
    lab = Lab([mod], entry_points=False)
    assert lab.problems == []
    assert lab.spec("advantage_estimator", "fixed").traits == {"batch_step": "whiten"}
    assert lab.get("advantage_estimator", "fixed").trait("batch_step") == "whiten"
    assert lab.get("advantage_estimator", "knobbed").trait("batch_step") == "whiten"
    assert lab.get("advantage_estimator", "knobbed", whiten=False).trait("batch_step") is None
    assert lab.spec("advantage_estimator", "plain").traits == {}
    assert lab.get("advantage_estimator", "plain").trait("batch_step") is None  # the kind's default
    with pytest.raises(ValueError, match="'keep_mask' is not a trait of advantage_estimator; allowed traits for "
                                         "advantage_estimator: batch_step"):
        lab.spec("advantage_estimator", "plain").trait("keep_mask")


def test_builtin_traits():
    lab = Lab()
    assert lab.get("policy_loss", "bypass_mode").trait("old_log_prob") == "rollout"
    assert lab.get("policy_loss", "ppo_clip").trait("old_log_prob") == "trainer"
    assert lab.get("importance_correction", "rejection").trait("narrows_mask") == "after_advantage"
    assert lab.get("importance_correction", "rejection", narrow_mask="off").trait("narrows_mask") is None
    assert callable(lab.spec("importance_correction", "rejection").trait("keep_mask"))
    addition = lab.spec("task", "addition")
    assert addition.trait("reward_components", lab.get("task", "addition", format_weight=0.1).config) == ("correct", "format")
    assert addition.trait("reward_components", lab.get("task", "addition").config) == ()
    assert lab.spec("task", "chain").trait("reward_components") == ()  # one reward, declared: checked at load
    sglang = lab.spec("rollout_backend", "sglang")
    assert "CUDA-IPC" in sglang.trait("needs_cuda", lab.get("rollout_backend", "sglang", urls="http://x", weight_sync="tensor").config)
    assert sglang.trait("needs_cuda", lab.get("rollout_backend", "sglang", urls="http://x").config) is None
    assert lab.spec("rollout_backend", "hf").trait("needs_cuda") is None
    assert lab.spec("rollout_backend", "hf").trait("sharded_policy") is None
    assert sglang.trait("sharded_policy", lab.get("rollout_backend", "sglang", urls="http://x").config) is None
    assert "weight_sync = 'disk'" in sglang.trait("sharded_policy", lab.get("rollout_backend", "sglang", urls="http://x", weight_sync="distributed").config)
    rl = lab.spec("algorithm", "rl")
    assert "policy_loss" in rl.trait("uses") and rl.trait("provides")["policy_loss"] == ("rollout_log_prob",)
    assert "reward_components" in lab.spec("advantage_estimator", "gdpo").requires
    assert "rollout_log_prob" in lab.spec("policy_loss", "ppo_clip").requires
    assert "rollout_log_prob" not in lab.spec("policy_loss", "vanilla_pg").requires


def test_a_misspelt_trait_names_plugin_component_trait_and_the_allowed_ones():
    mod = plugin("typo_plugin", "register_advantage_estimators", (("est", estimator), {"batch_stpe": "whiten"}))
    (msg,) = problems(mod)
    assert "plugin 'typo_plugin': advantage_estimator 'est': unknown trait 'batch_stpe'" in msg
    assert "did you mean 'batch_step'?" in msg and "allowed traits for advantage_estimator: batch_step" in msg


def test_a_trait_of_another_kind_is_refused():
    mod = plugin("wrong_kind", "register_policy_losses", (("l", loss), {"keep_mask": lambda **kw: None}))
    (msg,) = problems(mod)
    assert "plugin 'wrong_kind': policy_loss 'l': 'keep_mask' is a trait of importance_correction, not of policy_loss" in msg
    assert "allowed traits for policy_loss: aggregation, partition, old_log_prob" in msg
    mod = plugin("no_traits", "register_value_losses", (("v", loss), {"aggregation": "seq-mean"}))
    assert "value_loss takes no traits" in problems(mod)[0]


@pytest.mark.parametrize(
    "hook, kwargs, expected",
    [
        ("register_policy_losses", {"old_log_prob": "engine"}, "trait old_log_prob must be 'trainer' or 'rollout'; got 'engine'"),
        ("register_policy_losses", {"aggregation": 1}, "trait aggregation must be 'seq-mean' or None"),
        ("register_policy_losses", {"partition": 3}, "trait partition must be a non-empty string"),
        ("register_advantage_estimators", {"batch_step": 3}, "trait batch_step must be a non-empty string"),
        ("register_tasks", {"reward_components": "correct"}, "trait reward_components must be a tuple of strings"),
        ("register_algorithms", {"provides": {"policy_losses": ("x",)}}, "trait provides names 'policy_losses', which is not a component kind"),
        ("register_algorithms", {"uses": {"task": 1}}, "trait uses must be a set of section names"),
        ("register_importance_corrections", {"narrows_mask": "after_advantage"}, "trait narrows_mask needs trait keep_mask too"),
        ("register_importance_corrections", {"keep_mask": "yes", "narrows_mask": None}, "trait keep_mask must be a callable"),
    ],
)
def test_a_trait_value_of_the_wrong_type_is_refused(hook, kwargs, expected):
    (msg,) = problems(plugin("bad_value", hook, (("c", loss), kwargs)))
    assert "plugin 'bad_value'" in msg and " 'c': " in msg and expected in msg


def test_a_per_config_trait_is_checked_when_read():
    mod = plugin("late", "register_advantage_estimators", (("e", estimator), {"config": WhitenConfig, "batch_step": lambda c: 7}))
    lab = Lab([mod], entry_points=False)
    with pytest.raises(TypeError, match=r"advantage_estimator 'e': trait batch_step returned 7 for .*must be a non-empty string"):
        lab.get("advantage_estimator", "e").trait("batch_step")


@pytest.mark.parametrize(
    "hook, attr, keyword",
    [
        ("register_advantage_estimators", "batch_step", "batch_step=..."),
        ("register_advantage_estimators", "needs_reward_components", 'requires=("reward_components",)'),
        ("register_policy_losses", "aggregation", "aggregation=..."),
        ("register_policy_losses", "old_log_prob", 'old_log_prob="rollout"'),
        ("register_importance_corrections", "narrows_mask", "narrows_mask=..."),
        ("register_importance_corrections", "keep_mask", "keep_mask=..."),
        ("register_tasks", "reward_components", "reward_components=..."),
        ("register_algorithms", "uses", "uses=..."),
        ("register_algorithms", "provides", "provides=..."),
    ],
)
def test_an_old_style_function_attribute_is_refused_with_its_replacement(hook, attr, keyword):
    def fn(**kw):
        """An old-style component."""

    setattr(fn, attr, "whatever")
    (msg,) = problems(plugin("old_style", hook, (("c", fn), {})))
    assert "plugin 'old_style'" in msg and f"declares {attr!r} as an attribute of its function" in msg
    assert f"register(..., {keyword})" in msg


def test_a_task_class_registered_as_its_own_factory_keeps_reward_components_as_protocol_data():
    class TwoRewards:
        reward_components = ("a", "b")

        def __init__(self, *, config):
            self.config = config

    lab = Lab([plugin("task_class", "register_tasks", (("two", TwoRewards), {}))], entry_points=False)
    assert lab.problems == [] and lab.spec("task", "two").trait("reward_components") is None


def test_every_trait_is_documented_with_its_kind():
    """rllab.hookspecs names every trait in its kind's hook docstring."""
    from rllab import hookspecs
    from rllab.lab import KINDS

    for kind, hook in KINDS.items():
        doc = getattr(hookspecs, hook).__doc__
        assert "Traits:" in doc and all(f"{name}=" in doc for name in TRAITS.get(kind, ())), kind


def test_a_required_input_the_algorithm_does_not_provide_is_refused_at_load():
    mod = plugin("wants_more", "register_policy_losses", (("greedy", loss), {"requires": ("rollout_entropy",)}))
    with pytest.raises(ConfigError, match=r"policy_loss 'greedy' \(plugin wants_more\) requires rollout_entropy, which algorithm "
                                          r"'rl' does not provide to a policy_loss \(it provides: rollout_log_prob\)"):
        load_config(None, ["policy_loss=greedy"], lab=Lab([mod]))


def test_the_rl_step_passes_an_optional_input_only_to_a_loss_that_requires_it(tmp_path, model_cache):
    from rllab.training.trainer import Trainer

    seen: dict[str, set] = {}

    def recording(name):
        def fn(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None, **extra):
            seen.setdefault(name, set()).update(extra)
            return aggregate(-advantages * log_prob, mask), {}

        return fn

    mod = plugin(
        "recorders",
        "register_policy_losses",
        (("asks", recording("asks")), {"requires": ("rollout_log_prob",)}),
        (("silent", recording("silent")), {}),
    )
    lab = Lab([mod])
    for name in ("asks", "silent"):
        cfg = load_config(None, [*overrides(TINY), "train.steps=1", f"policy_loss={name}"], lab=lab)
        tr = Trainer(cfg, lab=lab, run_dir=tmp_path / name, progress=False)
        tr.train_step()
        tr.close()
    assert seen == {"asks": {"rollout_log_prob"}, "silent": set()}
