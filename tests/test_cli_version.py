"""``rllab --version`` and ``rllab --version -v``."""

import os
import platform
import tomllib
from pathlib import Path

import torch
import transformers

from rllab.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_version_is_the_packages(capsys):
    assert main(["--version"]) == 0
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"rllab {version}\n"
    assert main(["-V"]) == 0 and capsys.readouterr().out == f"rllab {version}\n"


def test_verbose_version_summarises_the_environment(capsys):
    assert main(["--version", "-v"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines()[1:]}
    assert set(rows) >= {"rllab", "python", "torch", "transformers", "cpu", "environment"}
    assert rows["python"].startswith(platform.python_version())
    assert rows["torch"].startswith(torch.__version__) and rows["transformers"] == transformers.__version__
    assert f"CPU kernels {torch.backends.cpu.get_cpu_capability()}" in rows["torch"]  # as provenance.json records them
    assert f"({os.cpu_count()} cores" in rows["cpu"] and "distributions installed" in rows["environment"]
    assert main(["-v", "--version"]) == 0 and capsys.readouterr().out.splitlines()[:2] == out.splitlines()[:2]


def test_version_takes_nothing_else(capsys):
    assert main(["--version", "run"]) == 2
    assert "takes nothing else" in capsys.readouterr().err
