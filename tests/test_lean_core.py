"""The lean core: the quick start installs ``pip install -e .`` (no extras), so the main job must
run where rllab's code cannot import anything only an extra installs (the test makes those imports
fail; transformers' own look-ups for optional packages are left alone); and CI installs exactly
as the README says."""

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.tiny import TINY, overrides

ROOT = Path(__file__).resolve().parent.parent


def _bash_blocks(text: str, heading: str) -> list[str]:
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def test_ci_installs_and_tests_exactly_as_the_readme_says():
    readme = (ROOT / "README.md").read_text()
    setup, tests = (b.strip() for b in _bash_blocks(readme, "## Quick start")[:2])
    assert "pip install -e . " in setup + " " and "[dev]" not in setup  # the core only
    assert setup.endswith("&& rllab run")
    ci = (ROOT / ".ci" / "run").read_text()
    install = setup.split("&& . .venv/bin/activate && ", 1)[1].removesuffix(" && rllab run")
    assert install in ci.splitlines()
    assert tests in ci.splitlines() and tests.startswith("pip install -e '.[dev]'")


PROBE = """
import builtins, importlib.metadata as md, json, sys
from packaging.requirements import Requirement

def closure(name, extra, seen):
    key = name.lower().replace("_", "-")
    if key in seen:
        return
    seen.add(key)
    try:
        reqs = md.requires(name) or []
    except md.PackageNotFoundError:
        return
    for r in map(Requirement, reqs):
        if r.marker is None or r.marker.evaluate({"extra": extra}):
            closure(r.name, "", seen)

core, dev = set(), set()
closure("rllab", "", core)
closure("rllab", "dev", dev)
owners = md.packages_distributions()
watched = {top for top, dists in owners.items() if any(d.lower().replace("_", "-") in dev - core for d in dists)}
found = set()
real_import = builtins.__import__

def watching(name, globals=None, locals=None, fromlist=(), level=0):
    top = name.partition(".")[0]
    importer = (globals or {}).get("__name__", "")
    if level == 0 and top in watched and importer.partition(".")[0].startswith("rllab"):
        found.add(f"{top} (from {importer})")
        raise ModuleNotFoundError(f"No module named {top!r}", name=top)  # as in an install without the extra
    return real_import(name, globals, locals, fromlist, level)

builtins.__import__ = watching
from rllab.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "blocked": sorted(found), "watched": len(watched)}))
"""


def test_the_main_job_imports_only_core_dependencies(tmp_path, model_cache):
    args = ["run", *overrides(TINY), "model.warm_start.steps=5", "train.steps=1", "--run-dir", str(tmp_path / "run"), "-q"]
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # rllab's imports of an extra's modules (peft, scipy, textual, msgspec, …) fail as where it is not
    # installed: the job must run all the same (those it tried are listed in `blocked`)
    assert result["watched"] > 10 and result["code"] == 0, result


def test_without_the_extra_a_feature_names_it(tmp_path, model_cache):
    """The same blocking, on a feature behind an extra: LoRA without peft stops with the extra's name."""
    args = ["run", *overrides(TINY), "model.warm_start.steps=5", "train.steps=1", "model.lora.r=4", "--run-dir", str(tmp_path / "run"), "-q"]
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] == 1 and any(b.startswith("peft") for b in result["blocked"]), result
    assert "pip install 'rllab[lora]'" in " ".join(out.stderr.split())
