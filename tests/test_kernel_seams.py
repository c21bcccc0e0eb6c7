"""The kernel (``rllab/``) never names a built-in plugin's component, nor reads a plugin's knob.

A behaviour that depends on a component is declared by the component (a trait of its
registration, or a member of its protocol, rllab.members) and read through that declaration, so a
third-party component answers the same question the built-in one does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rllab import KINDS, Lab

KERNEL = Path(__file__).resolve().parent.parent / "rllab"

ALLOWED = {
    # the default logger of a config that lists none (COMPONENT_SECTIONS holds the other defaults)
    ("config.py", "jsonl"),
    # attrs' keyword `default` (a knob's default value), which shares the default sampler's name
    ("specs.py", "default"),
}
"""(file, name) pairs a kernel file may spell: each is a default, or a value that merely shares a
component's name, as its comment says."""


def _component_names() -> set[str]:
    lab = Lab()
    return {name for kind in KINDS for spec in lab.specs(kind) for name in (spec.name, *spec.aliases)}


def _strings(node: ast.AST):
    """The string constants of an operand: itself, or the items of a literal tuple/list/set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for item in node.elts:
            yield from _strings(item)


LOOKUPS = {"get", "spec", "pop", "setdefault", "index", "names", "find", "resolve"}


def violations(source: str, filename: str, names: set[str]) -> list[str]:
    """Where ``source`` compares with or looks up a component name, or reads ``<x>.config``'s knob by name."""
    out = []
    for node in ast.walk(ast.parse(source)):
        spelled = []
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                spelled += list(_strings(operand))
        elif isinstance(node, ast.Subscript):
            spelled += list(_strings(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LOOKUPS:
            for arg in node.args:
                spelled += list(_strings(arg))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Attribute) and target.attr == "config" and len(node.args) > 1:
                out.append(f"{filename}:{node.lineno}: reads a plugin config's knob by name ({ast.unparse(node)})")
        for const in spelled:
            if const.value in names and (filename, const.value) not in ALLOWED:
                out.append(f"{filename}:{const.lineno}: spells the component name {const.value!r}")
    return out


def test_kernel_names_no_builtin_component():
    names = _component_names()
    assert {"rl", "hf", "grpo", "jsonl"} <= names  # the listing found the built-ins
    found = []
    for path in sorted(KERNEL.rglob("*.py")):
        found += violations(path.read_text(), str(path.relative_to(KERNEL)), names)
    assert not found, "the kernel depends on a named plugin component:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code",
    [
        'if cfg.component("algorithm").name != "rl": pass',
        'x = name in ("hf", "other")',
        'loggers["jsonl"]',
        'lab.spec("algorithm", "dpo")',
        'getattr(backend.config, "share_weights", False)',
        'if corr.name == "none" or name.endswith("x"): pass',
        'x = next(r for r in cfg.loggers if r.name == "jsonl")',
    ],
)
def test_the_scan_catches(code):
    assert violations(code, "x.py", {"rl", "hf", "jsonl", "dpo", "none"})


def test_the_scan_passes_text():
    code = '"""Uses rl."""\nraise ValueError(f"use algorithm \'rl\'")\n# "rl"\nx = f"{name!r} is not rl"\n'
    assert not violations(code, "x.py", {"rl"})


# --------------------------------------------------------------------------- optional members and base classes


def test_every_base_class_carries_every_declared_default():
    import rllab
    from rllab.members import MEMBERS

    for protocol, base in (("environment", rllab.Environment), ("task", rllab.Task), ("rollout_backend", rllab.RolloutBackend)):
        for name, spec in MEMBERS[protocol].items():
            if name == "last_metrics":  # a method on the base: {} (the member's None is for an object without it)
                continue
            assert getattr(base, name) == spec.default, (protocol, name)


def test_an_object_without_the_base_reads_the_declared_defaults():
    import rllab
    from rllab.members import member

    class Duck:  # a third-party environment written without rllab.Environment
        def train_examples(self, n, rng): ...
        def eval_examples(self): ...
        def start(self, example): ...
        def demonstration(self, example): ...

    duck = Duck()
    assert isinstance(duck, rllab.Environment) and not isinstance(object(), rllab.Environment)
    assert member(duck, "environment", "max_turns") == 1
    assert member(duck, "environment", "rollout_defaults") == {}
    assert member(duck, "environment", "solved") is None
    duck.max_turns = None  # None is kept for max_turns (the run refuses it, naming it) ...
    assert member(duck, "environment", "max_turns") is None
    duck.rollout_defaults = None  # ... and reads as the default elsewhere
    assert member(duck, "environment", "rollout_defaults") == {}
    assert member(object(), "rollout_backend", "pushes_in_flight") is False
    from rllab.members import MEMBERS

    assert "async_rollouts" not in MEMBERS["algorithm"]  # a trait of the registration, read at load
    assert Lab().spec("algorithm", "rl").trait("async_rollouts") is True
    assert Lab().spec("algorithm", "online_dpo").trait("async_rollouts") is False


def test_a_subclass_inherits_the_defaults_and_must_define_the_required_members():
    import rllab

    class Env(rllab.Environment):
        max_turns = 3

        def train_examples(self, n, rng):
            return []

        def eval_examples(self):
            return []

        def start(self, example):
            return None

    env = Env()
    assert env.max_turns == 3 and env.solved is None and env.describe_error is None and env.warm_start_defaults == {}
    with pytest.raises(rllab.errors.NoDemonstrationError, match="Env has no demonstration.*model.warm_start.steps=0"):
        env.demonstration(None)

    class Half(rllab.RolloutBackend):
        def generate(self, prompts, params):
            return []

    with pytest.raises(TypeError, match="update_weights"):
        Half()

    class Backend(Half):
        def update_weights(self, model):
            return None

    backend = Backend()
    assert backend.last_metrics() == {} and backend.close() is None and backend.follow_weights is None
    assert isinstance(backend, rllab.RolloutBackend)


def _algorithm_plugin(**traits):
    import types

    import rllab
    from rllab_algorithms import rl

    mod = types.ModuleType("third_party_rl")

    @rllab.hookimpl
    def register_algorithms(register):
        register("my_rl", rl.rl, config=rl.RLConfig, uses=rl.RL.uses, provides=rl.RL.provides, **traits)

    mod.register_algorithms = register_algorithms
    return mod


@pytest.mark.parametrize("declared", [True, False])
def test_data_parallel_is_the_algorithms_declaration_not_its_name(declared):
    from rllab.checks.run import check_data_parallel
    from rllab.config import validate

    lab = Lab([_algorithm_plugin(data_parallel=declared)])
    cfg = validate({"algorithm": {"name": "my_rl"}, "model": {"strategy": "fsdp2"}}, lab=lab, where="t")
    if declared:
        check_data_parallel(cfg, lab, 2)
    else:
        with pytest.raises(Exception, match=r"algorithm 'my_rl' has no data-parallel normalisers .*data_parallel.*'rl'"):
            check_data_parallel(cfg, lab, 2)


def test_shares_weights_is_the_backends_declaration():
    from rllab.config import validate

    lab = Lab()
    with pytest.raises(Exception, match=r"backend 'hf' sampling from the trainer's own weights \(backend.share_weights = true\)"):
        validate({"rollout": {"max_staleness": 1}, "backend": {"name": "hf", "share_weights": True}}, lab=lab, where="t")
    cfg = validate({"backend": {"name": "hf", "share_weights": True}}, lab=lab, where="t")
    assert lab.spec("rollout_backend", "hf").trait("shares_weights", cfg.component("backend").config) is not None
    assert lab.spec("rollout_backend", "sglang").trait("shares_weights") is None


def _env_plugin(cls):
    import types

    import attrs

    import rllab

    @attrs.frozen
    class Cfg:
        pass

    mod = types.ModuleType("third_party_env")

    @rllab.hookimpl
    def register_environments(register):
        register("probe_env", cls, config=Cfg)

    mod.register_environments = register_environments
    return mod


def test_a_subclass_missing_a_required_member_is_refused_at_registration_naming_it():
    import rllab

    class Half(rllab.Environment):
        def __init__(self, *, config):
            self.config = config

        def train_examples(self, n, rng):
            return []

        def eval_examples(self):
            return []

    lab = Lab([_env_plugin(Half)], entry_points=False)
    assert any("class Half does not define start, which its base class requires" in p for p in lab.problems)


def test_the_contract_refuses_an_environment_without_a_bound_on_its_turns():
    import torch

    import rllab
    from rllab.testing import run_contract

    class Episode:
        def __init__(self, answer):
            self.answer = answer

        def step(self, text):
            return rllab.Step(reward=float(text.strip() == self.answer), done=True)

    class Unbounded(rllab.Environment):
        max_turns = 0

        def __init__(self, *, config):
            self.config = config

        def _ex(self, i):
            return rllab.Example(prompt=f"{i}+1=", answer=str(i + 1))

        def train_examples(self, n, rng):
            return [self._ex(i) for i in torch.randint(0, 5, (n,), generator=rng).tolist()]

        def eval_examples(self):
            return [self._ex(i) for i in range(5)]

        def start(self, example):
            return Episode(example.answer)

        def demonstration(self, example):
            return [example.answer]

    lab = Lab([_env_plugin(Unbounded)], entry_points=False)
    failed = [r for r in run_contract(lab, "environment", "probe_env") if not r.passed]
    assert failed and "max_turns = 0" in failed[0].message
