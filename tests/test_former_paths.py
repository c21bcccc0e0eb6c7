"""rllab.FormerPaths: a package's table of former import paths (rllab's own in ``rllab/_compat.py``,
a plugin's for the modules it moved): each former path forwards its names with a warning."""

from __future__ import annotations

import re
import sys
import textwrap
import warnings

import pytest

import rllab
from rllab.former import FormerPaths, RllabDeprecationWarning


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A third-party package ``movedpkg`` whose ``arith`` moved to ``tasks.arith`` and whose module
    ``samplers`` became a package (its names now in ``samplers.pools``)."""
    root = tmp_path / "movedpkg"
    files = {
        "__init__.py": "from movedpkg._former import FORMER\nFORMER.install()\n",
        "_former.py": """
            import rllab
            FORMER = rllab.FormerPaths(
                {"movedpkg.arith": "movedpkg.tasks.arith", "movedpkg.both": ("movedpkg.tasks.arith", "movedpkg.tasks.more")},
                {"movedpkg.samplers": "movedpkg.samplers.pools"},
            )
            """,
        "tasks/__init__.py": "",
        "tasks/arith.py": "class AddTask:\n    pass\n\nSHARED = 'arith'\n",
        "tasks/more.py": "SHARED = 'more'\nONLY_MORE = 3\n",
        "samplers/__init__.py": "from movedpkg._former import FORMER\n__getattr__ = FORMER.package_getattr(__name__)\n",
        "samplers/pools.py": "def draw():\n    return 7\n",
        "samplers/other.py": "X = 1\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [m for m in sys.modules if m == "movedpkg" or m.startswith("movedpkg.")]:
        del sys.modules[name]


def test_rllab_publishes_the_mechanism():
    assert rllab.FormerPaths is FormerPaths and rllab.RllabDeprecationWarning is RllabDeprecationWarning
    assert issubclass(RllabDeprecationWarning, DeprecationWarning)


def test_a_plugins_former_module_forwards_with_a_warning_naming_the_new_module(pkg):
    scope: dict = {}
    with pytest.warns(RllabDeprecationWarning) as seen:
        exec("from movedpkg.arith import AddTask", scope)
    assert [(str(w.message), w.filename, w.lineno) for w in seen] == [(
        "`from movedpkg.arith import AddTask` is deprecated and works until rllab 1.0: use "
        "`from movedpkg.tasks.arith import AddTask`", "<string>", 1)]  # fmt: skip
    from movedpkg.tasks.arith import AddTask

    assert scope["AddTask"] is AddTask


def test_the_first_new_module_that_has_the_name_wins(pkg):
    with pytest.warns(RllabDeprecationWarning, match=re.escape("use `from movedpkg.tasks.more import ONLY_MORE`")):
        from movedpkg.both import ONLY_MORE
    with pytest.warns(RllabDeprecationWarning, match=re.escape("use `from movedpkg.tasks.arith import SHARED`")):
        from movedpkg.both import SHARED
    assert (ONLY_MORE, SHARED) == (3, "arith")


def test_the_module_form_and_dir(pkg):
    import movedpkg.both as both

    assert {"AddTask", "ONLY_MORE", "SHARED"} <= set(dir(both))
    with pytest.warns(RllabDeprecationWarning, match="use `from movedpkg.tasks.arith import AddTask`"):
        assert both.AddTask.__name__ == "AddTask"


def test_a_package_answers_the_names_it_had_as_a_module_and_imports_its_submodules(pkg):
    with pytest.warns(RllabDeprecationWarning, match=re.escape("use `from movedpkg.samplers.pools import draw`")):
        from movedpkg.samplers import draw
    assert draw() == 7
    with warnings.catch_warnings():
        warnings.simplefilter("error", RllabDeprecationWarning)
        from movedpkg.samplers import other
    assert other.X == 1


def test_unknown_names_are_import_errors(pkg):
    with pytest.raises(ImportError, match="cannot import name 'nope'"):
        exec("from movedpkg.arith import nope", {})
    with pytest.raises(ImportError, match="cannot import name 'nope'"):
        exec("from movedpkg.samplers import nope", {})


def test_names_restricts_what_a_package_forwards_and_published_by_names_the_short_import():
    table = FormerPaths(
        packages={"rllab.fake": "rllab.errors"}, names={"rllab.fake": ("RewardError", "RllabError")}, published_by="rllab"
    )
    get = table.package_getattr("rllab.fake")
    with pytest.warns(RllabDeprecationWarning, match=re.escape("use `from rllab import RewardError`")):
        assert get("RewardError") is rllab.RewardError
    with pytest.raises(AttributeError, match="'UnknownKindError'"):
        get("UnknownKindError")  # in rllab.errors, but not one of the names


def test_a_malformed_table_is_refused_by_name():
    with pytest.raises(ValueError, match=r"FormerPaths modules\['a.b'\].*got 3"):
        FormerPaths({"a.b": 3})
    with pytest.raises(ValueError, match=r"names: \['a.c'\] are not keys of packages"):
        FormerPaths(packages={"a.b": "a.b.c"}, names={"a.c": ("x",)})
    with pytest.raises(KeyError, match="'a.x' is not a key"):
        FormerPaths(packages={"a.b": "a.b.c"}).package_getattr("a.x")


def test_two_tables_forwarding_one_former_module_elsewhere_is_an_error():
    FormerPaths({"rllab_test_former.same": "rllab.errors"}).install()
    FormerPaths({"rllab_test_former.same": "rllab.errors"}).install()  # the same row again: nothing changes
    with pytest.raises(ValueError, match="'rllab_test_former.same' is forwarded to rllab.errors by one table and to rllab.ops"):
        FormerPaths({"rllab_test_former.same": "rllab.ops"}).install()
