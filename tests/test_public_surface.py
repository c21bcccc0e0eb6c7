"""The public surface: what users import is published from ``rllab`` itself, listed in
CONTRIBUTING.md; docs/ and examples/ import nothing else; and every import path an earlier release
documented still works, with a DeprecationWarning naming the import to use now."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import rllab
from rllab._compat import FORMER_MODULES, FORMER_NAMES, RllabDeprecationWarning

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# --------------------------------------------------------------------------- the list


def contributing_list() -> list[str]:
    """The names the bullets of CONTRIBUTING.md's "The public surface" section give, in order."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("\n## The public surface\n", 1)[1].split("\n## ", 1)[0]
    bullets = re.findall(r"^- .*?(?=^- |^\n|\Z)", section, flags=re.M | re.S)
    return [name for b in bullets for name in re.findall(r"`(\w+)`", b)]


def test_contributing_lists_exactly_what_rllab_publishes():
    listed = contributing_list()
    assert len(listed) == len(set(listed)), sorted(n for n in listed if listed.count(n) > 1)
    assert set(listed) == set(rllab.__all__), (
        f"published but not listed: {sorted(set(rllab.__all__) - set(listed))}; "
        f"listed but not published: {sorted(set(listed) - set(rllab.__all__))}"
    )


def test_the_list_has_what_an_environment_a_tool_and_an_algorithm_are_written_with():
    assert {"Environment", "Step", "Example", "tool", "Tool", "tool_step", "RunContext", "Algorithm", "Lab", "knob"} <= set(
        rllab.__all__
    )


def test_every_published_name_resolves_and_import_rllab_stays_light():
    for name in rllab.__all__:
        assert getattr(rllab, name) is not None, name
    code = "import sys, rllab; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- docs and examples


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each fenced ```python block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    return [
        (text[: m.start()].count("\n") + 2, m.group(1))
        for m in re.finditer(r"^```python[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    ]


def import_statements(code: str) -> list[str]:
    """Each import statement of a code block (a parenthesised one joined), as a line of Python;
    the blocks need not parse as a whole (some show signatures)."""
    out, lines, i = [], code.splitlines(), 0
    while i < len(lines):
        stmt = lines[i].split("#", 1)[0].strip()
        if re.match(r"(from\s+[\w.]+\s+)?import\s", stmt):
            while stmt.count("(") > stmt.count(")") and i + 1 < len(lines):
                i += 1
                stmt += " " + lines[i].split("#", 1)[0].strip()
            out.append(stmt)
        i += 1
    return out


def documented_imports() -> list[tuple[str, str]]:
    """``(where, statement)`` for every import in docs/*.md and README.md code blocks and in examples/."""
    found = [
        (f"{path.relative_to(ROOT)}:{line}", stmt)
        for path in DOCS
        for line, code in python_blocks(path)
        for stmt in import_statements(code)
    ]
    for path in EXAMPLES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", ast.unparse(node)))
    return found


def test_the_docs_show_imports():
    """The extraction finds the imports the docs do show (else the next tests check nothing)."""
    statements = [s for _, s in documented_imports()]
    assert "from rllab import Step" in statements and "from rllab import Tool, tool, tool_step" in statements
    assert "import rllab, torch" in statements and "from rllab import grouped_response_logprobs" in statements
    assert import_statements("x = 1\n  from a import (b,\n    c)  # note\nimport d") == ["from a import (b, c)", "import d"]


@pytest.mark.parametrize("where,statement", documented_imports(), ids=lambda v: v if ":" in v else None)
def test_docs_and_examples_import_only_from_rllab(where, statement):
    node = ast.parse(statement).body[0]
    if isinstance(node, ast.Import):
        bad = [a.name for a in node.names if a.name.startswith("rllab.")]
        assert not bad, f"{where}: `{statement}` imports {bad}; import `rllab` and use its names"
    elif node.module == "rllab" or node.module.startswith("rllab."):
        assert node.module == "rllab", f"{where}: `{statement}` imports from {node.module}; import from `rllab`"
        unknown = [a.name for a in node.names if a.name not in rllab.__all__]
        assert not unknown, f"{where}: `{statement}`: {unknown} are not in rllab.__all__"


@pytest.mark.parametrize("where,statement", documented_imports(), ids=lambda v: v if ":" in v else None)
def test_docs_and_examples_imports_run_without_a_deprecation(where, statement):
    top = ast.parse(statement).body[0]
    modules = [a.name for a in top.names] if isinstance(top, ast.Import) else [top.module]
    missing = [m for m in modules if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        pytest.skip(f"{where}: {missing} not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RllabDeprecationWarning)
        exec(compile(statement, where, "exec"), {})


# --------------------------------------------------------------------------- earlier releases

MOVED = [
    # (former module, name, the import the warning names)
    ("rllab.environment", "Step", "from rllab import Step"),
    ("rllab.environment", "Environment", "from rllab import Environment"),
    ("rllab.tools", "Tool", "from rllab import Tool"),
    ("rllab.tools", "tool", "from rllab import tool"),
    ("rllab.tools", "tool_step", "from rllab import tool_step"),
    ("rllab.trainer", "Trainer", "from rllab import Trainer"),
    ("rllab.trainer", "run_experiment", "from rllab.training.trainer import run_experiment"),
    ("rllab.models", "grouped_response_logprobs", "from rllab import grouped_response_logprobs"),
    ("rllab.models", "response_log_sum_sq_probs", "from rllab.models.forward import response_log_sum_sq_probs"),
    ("rllab.tinymodel", "build_tiny_model", "from rllab.models.tiny import build_tiny_model"),
    ("rllab.runs", "resume_run", "from rllab.training.runs import resume_run"),
    ("rllab.runs", "run_experiment", "from rllab.training.runs import run_experiment"),
    ("rllab.parts", "build_parts", "from rllab.training.parts import build_parts"),
    ("rllab.episodes", "EpisodeResult", "from rllab.rollout.episodes import EpisodeResult"),
    ("rllab.rewards", "RewardFunction", "from rllab.rollout.rewards import RewardFunction"),
    ("rllab.optimizer", "Optimizers", "from rllab import Optimizers"),
    ("rllab.lora", "LoraPolicy", "from rllab.models.lora import LoraPolicy"),
    ("rllab.chat", "PromptRenderer", "from rllab.rollout.chat import PromptRenderer"),
    ("rllab.distributed", "current", "from rllab.parallel.distributed import current"),
    ("rllab.rollout", "episode_batch", "from rllab.rollout.stage import episode_batch"),
    ("rllab.reducer", "current_reducer", "from rllab.parallel.reducer import current_reducer"),
    ("rllab.placement", "STRATEGIES", "from rllab.parallel.placement import STRATEGIES"),
    ("rllab.tomlio", "dump_toml", "from rllab.records.tomlio import dump_toml"),
    ("rllab.provenance", "differences", "from rllab.records.provenance import differences"),
    ("rllab.events", "on_step_end", "from rllab.hookspecs import on_step_end"),
]
"""Every ``from rllab.x import y`` / ``import rllab.x`` documented in an earlier release whose
module has moved (README.md, CONTRIBUTING.md, docs/ and examples/ through their history)."""

STILL_THERE = [
    ("rllab.types", "Example"), ("rllab.config", "load_config"), ("rllab.testing", "contract_cases"),
    ("rllab.testing", "run_contract"), ("rllab.rollout.environment", "Step"), ("rllab.rollout.tools", "tool_step"),
    ("rllab.training.trainer", "Trainer"), ("rllab.training.trainer", "run_experiment"),
    ("rllab.training.runs", "resume_run"), ("rllab.training.parts", "build_parts"),
    ("rllab.models.forward", "grouped_response_logprobs"), ("rllab.models.forward", "response_log_sum_sq_probs"),
    ("rllab.algorithm", "checked_loss"), ("rllab.algorithm", "current_reducer"), ("rllab.parallel.reducer", "current_reducer"),
    ("rllab.members", "member"), ("rllab.members", "MEMBERS"), ("rllab.ops", "masked_mean"),
    ("rllab.ops", "check_finite"), ("rllab.rollout.stage", "episode_batch"), ("rllab.rollout.episodes", "EpisodeResult"),
]  # fmt: skip
"""Documented paths that are still where they were documented: they import without a warning;
a module that moves gets its row in ``rllab/_compat.py`` (and here under MOVED)."""


@pytest.mark.parametrize("former,name,now", MOVED, ids=lambda v: v if "." in v and " " not in v else None)
def test_a_former_import_path_works_with_a_warning_naming_the_new_import(former, name, now):
    scope: dict = {}
    with pytest.warns(DeprecationWarning, match=re.escape(f"`from {former} import {name}` is deprecated")) as seen:
        exec(f"from {former} import {name}", scope)
    # one warning, at the importing line (from a package, Python asks for the name twice: the
    # same warning from the same line, which the default filter shows once)
    assert {(str(w.message).rsplit("use ", 1)[1], w.filename, w.lineno) for w in seen} == {(f"`{now}`", "<string>", 1)}
    new = {}
    exec(now, new)
    assert scope[name] is new[name]


def test_every_former_path_is_tested():
    assert {m for m, _, _ in MOVED} == set(FORMER_MODULES) | set(FORMER_NAMES)


@pytest.mark.parametrize("module,name", STILL_THERE, ids=lambda v: v)
def test_a_documented_path_that_has_not_moved_imports_without_a_warning(module, name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RllabDeprecationWarning)
        value = getattr(importlib.import_module(module), name)
    assert value is not None


def test_import_of_a_former_module_then_attribute_access_warns():
    import rllab.tools  # noqa: F401  (the module form: ``rllab.tools.tool``)

    with pytest.warns(DeprecationWarning, match=re.escape("use `from rllab import tool`")):
        assert rllab.tools.tool is rllab.tool


def test_unknown_names_of_a_former_path_are_import_errors():
    with pytest.raises(ImportError, match="cannot import name 'nope'"):
        exec("from rllab.environment import nope", {})
    with pytest.raises(ImportError, match="cannot import name 'nope'"):
        exec("from rllab.models import nope", {})
    with warnings.catch_warnings():  # a package's own submodules are never forwarded
        warnings.simplefilter("error", RllabDeprecationWarning)
        exec("from rllab.models import tiny\nfrom rllab.rollout import tools", {})


FORMER_IMPORTS = "from rllab.environment import Step\nfrom rllab.types import Example\n"
"""The imports docs/environments.md and examples/retry_env.py gave before the layout moved
``rllab.environment`` (the rest of the example is unchanged since)."""


@pytest.fixture
def former_example(tmp_path) -> Path:
    """examples/retry_env.py as that release wrote it: a third-party environment of the time."""
    text = (ROOT / "examples" / "retry_env.py").read_text(encoding="utf-8")
    assert text.count("from rllab import Example, Step\n") == 1
    path = tmp_path / "former_retry_env.py"
    path.write_text(text.replace("from rllab import Example, Step\n", FORMER_IMPORTS), encoding="utf-8")
    return path


def test_a_third_party_environment_from_the_former_docs_loads_with_a_warning_and_passes_its_contract(former_example):
    from rllab.lab import import_file
    from rllab.testing import run_contract

    with pytest.warns(DeprecationWarning, match=re.escape("use `from rllab import Step`")):
        module = import_file(former_example, prefix="former")
    lab = rllab.Lab(plugins=[module], entry_points=False)
    results = run_contract(lab, "environment", "retry_addition")
    assert len([r for r in results if not r.skipped]) >= 4 and all(r.passed for r in results), results


def test_the_warning_shows_by_default_on_the_command_line(former_example):
    """Python hides a DeprecationWarning raised outside ``__main__``; rllab's are shown (a plugin
    file is imported as a module), and ``-W ignore`` still silences them."""
    line = former_example.read_text(encoding="utf-8").splitlines().index("from rllab.environment import Step") + 1
    cmd = [sys.executable, "-m", "rllab", "plugins", "--plugin", str(former_example), "--kind", "environment"]
    shown = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "retry_addition" in shown.stdout
    assert "`from rllab.environment import Step` is deprecated" in shown.stderr and f"former_retry_env.py:{line}" in shown.stderr
    code = "import rllab.environment as e; e.Step"
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    quiet = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "RllabDeprecationWarning" in loud.stderr and quiet.returncode == 0 and quiet.stderr == ""
