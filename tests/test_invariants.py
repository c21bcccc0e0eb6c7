"""Architecture invariants: the kernel never imports a plugin; built-ins are entry points."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_rllab_loads_no_plugin_module():
    code = (
        "import sys, rllab, rllab.config, rllab.testing, rllab.cli, rllab.ops, rllab.types\n"
        "bad = [m for m in sys.modules if m.startswith('rllab_') or m.startswith('plugins')]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_no_kernel_file_imports_a_plugin():
    plugin_names = {p.name for p in (ROOT / "plugins").iterdir() if p.is_dir()} | {"plugins"}
    offenders = []
    for f in (ROOT / "rllab").rglob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{f.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in plugin_names]
    assert offenders == []


# What plugins may import from the kernel: the component API (samplers: rllab.sampling; chat prompts: rllab.rollout.chat; KV caches:
# rllab.models.hfcompat; optional members and their defaults: rllab.members), plus the run-level modules that
# command plugins drive (configs, the trainer, run directories, checkpoints, TOML).
PUBLIC_MODULES = {
    "rllab", "rllab.ops", "rllab.types", "rllab.testing", "rllab.models.forward", "rllab.kernels.chunked", "rllab.models.tiny",
    "rllab.algorithm", "rllab.config", "rllab.training.trainer", "rllab.training.runs", "rllab.training.rundir", "rllab.parallel.checkpoint", "rllab.records.tomlio",
    "rllab.rollout.rewards", "rllab.rollout.chat", "rllab.models.hfcompat", "rllab.rollout.environment", "rllab.rollout.tools", "rllab.members",
    "rllab.rollout.accuracy", "rllab.training.runlock", "rllab.training.parts", "rllab.errors", "rllab.models.modeldir",
    "rllab.sampling", "rllab.training.optimizer",
    # the suite plugin's records and reproductions: the provenance record, rllab reproduce, pass@k
    "rllab.records.provenance", "rllab.training.reproduce", "rllab.rollout.evalmetrics",
}  # fmt: skip
# A plugin may build on another only where declared here (a front end of a command plugin; the referee's
# learning-curve comparison uses the suite's statistics).
PLUGIN_DEPENDENCIES = {"rllab_tui": {"rllab_suite", "rllab_loggers"}, "rllab_referee": {"rllab_suite"},
                       "rllab_console": {"rllab_loggers"}}  # the done line points at the run's traces file


def _is_module(name: str) -> bool:
    """Whether ``name`` (``rllab.x.y``) is a module or package of the kernel's source tree."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_plugins_import_only_rllab_public_api():
    allowed_rllab = PUBLIC_MODULES
    plugin_dirs = [p for p in (ROOT / "plugins").iterdir() if p.is_dir()]
    offenders = []
    for d in plugin_dirs:
        for f in d.rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                mods = []
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    # ``from rllab.x import y`` imports the module rllab.x.y when that is one
                    mods = [f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}") else node.module for a in node.names]
                for m in mods:
                    top = m.split(".")[0]
                    if top == "rllab" and m not in allowed_rllab:
                        offenders.append(f"{f.relative_to(ROOT)}: {m}")
                    if top.startswith("rllab_") and top != d.name and top not in PLUGIN_DEPENDENCIES.get(d.name, ()):
                        offenders.append(f"{f.relative_to(ROOT)}: imports another plugin {m}")
                    elif top.startswith("rllab_") and top != d.name and m != top:
                        offenders.append(f"{f.relative_to(ROOT)}: imports {m}, inside plugin {top} (use its public names)")
    assert offenders == []


def test_a_plugin_builds_on_another_only_through_its_public_names():
    """``from rllab_suite import X`` in the TUI: X is in ``rllab_suite.__all__`` (its documented API)."""
    import importlib

    offenders = []
    for plugin, deps in PLUGIN_DEPENDENCIES.items():
        for f in (ROOT / "plugins" / plugin).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module in deps and node.level == 0:
                    public = set(importlib.import_module(node.module).__all__)
                    offenders += [f"{f.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names if a.name not in public]
                elif isinstance(node, ast.Import):
                    offenders += [f"{f.relative_to(ROOT)}: import {a.name}" for a in node.names if a.name.split(".")[0] in deps]
    assert offenders == []
    assert not (ROOT / "plugins" / "rllab_tui" / "kernel.py").exists()


def test_every_plugin_package_is_an_entry_point():
    import tomllib

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["rllab"]
    dirs = {p.name for p in (ROOT / "plugins").iterdir() if (p / "__init__.py").exists()}
    assert dirs == set(eps.values())
