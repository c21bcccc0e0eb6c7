"""No import cycle among the modules of ``rllab`` or of any plugin package.

The graph is built from the source with :mod:`ast`, so an import inside a function counts as
much as one at the top of the file: moving an import into a function hides a cycle from Python
at import time, not from the design. An import under ``if TYPE_CHECKING:`` never runs and does
not count. ``importlib.import_module("a.b")`` with a literal name counts like ``import a.b``.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [ROOT / "rllab"] + sorted(p.parent for p in (ROOT / "plugins").glob("*/__init__.py"))


def package_modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its own name, not ``.__init__``)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING``, ``_TYPE_CHECKING`` (an alias) or ``typing.TYPE_CHECKING``."""
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
    return name.lstrip("_") == "TYPE_CHECKING"


def _imports(tree: ast.AST):
    """Every import node and literal ``import_module("...")`` call, at any depth, but not under
    ``if TYPE_CHECKING:`` (its ``else:`` branch runs and counts)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(target: str, modules: dict) -> str | None:
    """The module of the package that ``target`` names, or its closest enclosing one."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def module_edges(name: str, path: Path, modules: dict):
    """``(imported module, line)`` for each import of a module of the same package by ``name``.

    ``from p import x`` depends on ``p.x`` when that is a module, otherwise on ``p`` itself (its
    ``__init__``). Importing ``p.q.x`` runs the ``__init__`` of ``p.q`` first, so it depends on
    that package too, unless ``name`` is inside it (its own packages are imported before it
    anyway); an explicit ``import p`` or ``from p import y`` from inside ``p`` does count.
    """
    source = path.read_text(encoding="utf-8")
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in _imports(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.Call):
            targets = [node.args[0].value]
        else:
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != name:
                yield resolved, node.lineno
            package_of = resolved.rpartition(".")[0] if resolved else ""
            while package_of:  # the enclosing packages the import runs, outside name's own
                if package_of in modules and package_of != name and not name.startswith(package_of + "."):
                    yield package_of, node.lineno
                package_of = package_of.rpartition(".")[0]


def import_graph(package: Path):
    """``{module: {imported module: [lines]}}`` within ``package``, and the modules' paths."""
    modules = package_modules(package)
    graph = {name: {} for name in modules}
    for name, path in modules.items():
        for target, line in module_edges(name, path, modules):
            lines = graph[name].setdefault(target, [])
            if line not in lines:
                lines.append(line)
    return graph, modules


def strongly_connected(graph: dict) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict, modules: dict) -> str:
    """The imports that hold ``component`` together, one per line with the importing source line."""
    lines = [f"import cycle among: {', '.join(component)}"]
    for name in component:
        source = modules[name].read_text(encoding="utf-8").splitlines()
        for target in sorted(t for t in graph[name] if t in component):
            for line in sorted(graph[name][target]):
                where = modules[name].relative_to(ROOT) if modules[name].is_relative_to(ROOT) else modules[name]
                lines.append(f"    {name} -> {target}   {where}:{line}: {source[line - 1].strip()}")
    return "\n".join(lines)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_import_cycle(package):
    graph, modules = import_graph(package)
    cycles = strongly_connected(graph)
    assert not cycles, (
        "modules import each other (imports inside functions count; move the shared piece into the "
        "lower module or a new one both import, or pass it in):\n"
        + "\n".join(describe(c, graph, modules) for c in cycles)
    )


def _graph_of(tmp_path, files: dict[str, str]):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return import_graph(tmp_path / "pkg")


def test_the_graph_sees_lazy_relative_and_literal_imports(tmp_path):
    graph, _ = _graph_of(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import f\n",
            "pkg/a.py": "def f():\n    from . import b\n    return b\n",
            "pkg/b.py": "import importlib\nclass C:\n    def g(self):\n        from .sub.c import h\n"
            "def k():\n    return importlib.import_module('pkg.a')\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "from .. import b\nfrom ..a import f\nfrom pkg import f as g\n",
        },
    )
    assert graph["pkg"] == {"pkg.a": [1]}
    assert graph["pkg.a"] == {"pkg.b": [2]}
    assert graph["pkg.b"] == {"pkg.sub.c": [4], "pkg.sub": [4], "pkg.a": [6]}
    assert graph["pkg.sub.c"] == {"pkg.b": [1], "pkg.a": [2], "pkg": [3]}
    assert strongly_connected(graph) == [["pkg", "pkg.a", "pkg.b", "pkg.sub.c"]]


def test_importing_a_module_of_a_package_depends_on_the_package(tmp_path):
    graph, _ = _graph_of(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def f():\n    from pkg.sub.c import h\n",
            "pkg/sub/__init__.py": "from pkg.a import f\nfrom . import c\n",
            "pkg/sub/c.py": "import pkg.sub.d\nfrom pkg import sub\n",
            "pkg/sub/d.py": "",
        },
    )
    assert graph["pkg.a"] == {"pkg.sub.c": [2], "pkg.sub": [2]}
    assert graph["pkg.sub.c"] == {"pkg.sub.d": [1], "pkg.sub": [2]}  # its own package: only where it imports it
    assert strongly_connected(graph) == [["pkg.a", "pkg.sub", "pkg.sub.c"]]


def test_type_checking_imports_do_not_count(tmp_path):
    graph, _ = _graph_of(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "import typing\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n"
            "if typing.TYPE_CHECKING:\n    from pkg import a\nelse:\n    from pkg import c\n",
            "pkg/c.py": "",
        },
    )
    assert graph["pkg.b"] == {"pkg.c": [8]}
    assert strongly_connected(graph) == []


def test_a_cycle_is_reported_with_its_lines(tmp_path):
    graph, modules = _graph_of(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import y\n",
            "pkg/b.py": "def y():\n    from pkg.a import x\n",
        },
    )
    [component] = strongly_connected(graph)
    text = describe(component, graph, modules)
    assert "pkg.a -> pkg.b" in text and "a.py:1: from pkg.b import y" in text
    assert "pkg.b -> pkg.a" in text and "b.py:2: from pkg.a import x" in text


# --------------------------------------------------------------------------- floors

FLOORS = {
    "rllab": 0,  # the kernel: the contracts a plugin author reads (every top-level module not named below)
    "rllab.parallel": 0,  # the placement protocol and the reductions, contracts the kernel hands to components
    "rllab.kernels": 1,
    "rllab.rollout": 1,
    "rllab.records": 1,
    "rllab.models": 2,
    "rllab.parallel.checkpoint": 3,  # the strategies and what they stand on: the models, processes, checkpoints
    "rllab.parallel.dcp": 3,
    "rllab.parallel.distributed": 3,
    "rllab.parallel.fsdp2": 3,
    "rllab.parallel.launcher": 3,
    "rllab.parallel.single": 3,
    "rllab.config": 4,
    "rllab.checks": 4,
    "rllab.training": 5,
    "rllab.testing": 6,
    "rllab.cli": 7,
    "rllab.__main__": 7,
}
"""The floors of ``rllab``, lowest first: a module imports modules of its own floor or lower,
never higher (docs/architecture.md, "Import rules"). The kernel's contracts are the ground floor;
the machinery stands on them by concern; the config assembles the machinery's settings; the run
stands on all of it; the contract suite and the command come last."""


def floor_of(module: str) -> int:
    """The floor of the longest name of :data:`FLOORS` that ``module`` is or is inside."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOORS:
            return FLOORS[".".join(parts[:n])]
    raise AssertionError(f"{module} is not inside rllab")


def upward_imports(package: Path) -> list[str]:
    """Each import that points back up: to a higher floor, or (outside ``__main__`` entry points)
    to a package that encloses the importing module, whose ``__init__`` then runs first."""
    graph, modules = import_graph(package)
    found = []
    for name, targets in graph.items():
        for target, lines in targets.items():
            encloses = name.startswith(target + ".") and not name.endswith("__main__")
            higher = package.name == "rllab" and floor_of(target) > floor_of(name)
            if encloses or higher:
                source = modules[name].read_text(encoding="utf-8").splitlines()
                why = "its own enclosing package" if encloses else f"floor {floor_of(target)} from floor {floor_of(name)}"
                found += [f"{name} -> {target} ({why})   {modules[name].relative_to(package.parent)}:{n}: {source[n - 1].strip()}" for n in lines]
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_import_points_back_up(package):
    found = upward_imports(package)
    assert not found, "imports that point back up (move the piece down, or hand it in):\n" + "\n".join(found)


def test_every_top_level_package_of_rllab_has_a_floor():
    top = {p.parent.name for p in (ROOT / "rllab").glob("*/__init__.py")} - {"presets"}
    assert not {f"rllab.{t}" for t in top} - set(FLOORS), "a new subpackage of rllab needs its floor in FLOORS"


def test_an_upward_import_is_found(tmp_path):
    (tmp_path / "rllab" / "training").mkdir(parents=True)
    (tmp_path / "rllab" / "rollout").mkdir(parents=True)
    (tmp_path / "rllab" / "__init__.py").write_text("")
    (tmp_path / "rllab" / "types.py").write_text("def f():\n    from rllab.training.trainer import Trainer\n")
    (tmp_path / "rllab" / "training" / "__init__.py").write_text("")
    (tmp_path / "rllab" / "training" / "trainer.py").write_text("from rllab import types\n")
    (tmp_path / "rllab" / "rollout" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "rllab" / "rollout" / "stage.py").write_text("from rllab.rollout import X\n")
    found = "\n".join(upward_imports(tmp_path / "rllab"))
    assert "rllab.types -> rllab.training.trainer (floor 5 from floor 0)" in found
    assert "rllab.rollout.stage -> rllab.rollout (its own enclosing package)" in found
    assert "rllab.training.trainer -> rllab.types" not in found
