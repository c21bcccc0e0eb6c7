"""A third-party plugin made by `rllab new-plugin`, installed with a real pip, is listed,
passes the contract suite, and is selected by name in a config."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rllab.cli.scaffold import _BODIES, scaffold


def _env(target: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(target), env.get("PYTHONPATH", "")])
    env.pop("RLLAB_PLUGINS", None)
    return env


def test_new_plugin_install_list_check_and_select(tmp_path):
    cli = [sys.executable, "-m", "rllab.cli"]
    r = subprocess.run([*cli, "new-plugin", "soft_clip", "--kind", "policy_loss", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    root = tmp_path / "rllab-soft-clip"
    assert (root / "pyproject.toml").exists() and (root / "rllab_soft_clip" / "__init__.py").exists()

    target = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q", "--target", str(target), str(root)],
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = _env(target)

    listed = subprocess.run([*cli, "plugins", "--kind", "policy_loss"], capture_output=True, text=True, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "soft_clip" in listed.stdout and "rllab_soft_clip" in listed.stdout

    check = subprocess.run([*cli, "check", "soft_clip"], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "all checks passed" in check.stdout

    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert " passed" in tests.stdout

    code = (
        "from rllab.config import load_config\n"
        "cfg = load_config(None, ['policy_loss=soft_clip', 'policy_loss.clip=1.5'])\n"
        "print(cfg.component('policy_loss'))\n"
    )
    sel = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert sel.returncode == 0, sel.stderr
    assert "soft_clip" in sel.stdout and "1.5" in sel.stdout


@pytest.mark.parametrize("kind", sorted(_BODIES))
def test_every_scaffold_passes_the_contract(kind, tmp_path, monkeypatch):
    import rllab
    from rllab.testing import run_contract

    root = scaffold(f"my_{kind}", kind, tmp_path)
    monkeypatch.syspath_prepend(str(root))
    pkg = f"rllab_my_{kind}"
    lab = rllab.Lab([pkg], entry_points=False)
    results = run_contract(lab, kind, f"my_{kind}")
    failed = [r for r in results if not r.passed]
    assert not failed, failed
    assert any(not r.skipped for r in results[1:])
    sys.modules.pop(pkg, None)


def test_scaffold_refuses_existing_dir_and_bad_kind(tmp_path):
    from rllab.lab import ConfigError

    scaffold("x", "policy_loss", tmp_path)
    with pytest.raises(ConfigError, match="already exists"):
        scaffold("x", "policy_loss", tmp_path)
    with pytest.raises(ConfigError, match="cannot scaffold kind 'nope'"):
        scaffold("y", "nope", tmp_path)


def test_a_scaffolded_environment_passes_rllab_check(tmp_path):
    root = scaffold("higher_lower", "environment", tmp_path)
    module = (root / "rllab_higher_lower" / "__init__.py").read_text()
    assert "(rllab.Environment)" in module and "register_environments" in module
    env = _env(root)
    cli = [sys.executable, "-m", "rllab.cli"]
    check = subprocess.run([*cli, "check", "higher_lower", "--plugin", "rllab_higher_lower"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "contract: environment higher_lower" in check.stdout and "all checks passed" in check.stdout
