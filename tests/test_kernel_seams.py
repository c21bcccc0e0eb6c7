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
    # the metric key "kl" of a step's outcome (a dict key, not the kl_penalty component of that name)
    ("distributed.py", "kl"),
    # the default logger of a config that lists none (COMPONENT_SECTIONS holds the other defaults)
    ("config.py", "jsonl"),
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
