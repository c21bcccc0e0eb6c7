"""Former import paths: a module that moved keeps answering its old path, with a warning.

A package (rllab itself, or a plugin) whose modules move writes one table of former paths → new
paths and installs it once, when the package is imported::

    FORMER = rllab.FormerPaths(
        modules={"my_pkg.arith": "my_pkg.tasks.arith"},       # a module that moved
        packages={"my_pkg.samplers": "my_pkg.samplers.pools"},  # a module that became a package
    )
    FORMER.install()                                          # in my_pkg/__init__.py

and a module that became a package answers the names it had from its ``__init__``::

    __getattr__ = FORMER.package_getattr(__name__)            # in my_pkg/samplers/__init__.py

``from my_pkg.arith import AddTask`` then gives the new module's ``AddTask`` and warns
(:class:`RllabDeprecationWarning`, a :class:`DeprecationWarning` shown by default) naming the
import to use now. Nothing is imported until a name is asked for, so a table costs its package's
import nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Callable, Collection, Mapping


class RllabDeprecationWarning(DeprecationWarning):
    """An import path of an earlier release, working until rllab 1.0. Shown by default (Python
    hides a :class:`DeprecationWarning` raised outside ``__main__``) unless ``-W`` or
    ``PYTHONWARNINGS`` says otherwise."""


def _homes(where: str, former: str, value) -> tuple[str, ...]:
    """A table's new path(s) for ``former``: one module name, or several (the first that has a name wins)."""
    homes = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, (tuple, list)) else ()
    if not homes or not all(isinstance(h, str) and h for h in homes):
        raise ValueError(f"FormerPaths {where}[{former!r}]: expected a module name or a tuple of them, got {value!r}")
    return homes


class FormerPaths:
    """One package's table of former import paths.

    ``modules``: a former module → the module (or modules, searched in order) that holds its names
    now; ``import former`` and ``from former import name`` work, each name forwarded with a warning.
    ``packages``: a former module that is a package now → the module(s) that hold the names it had;
    its ``__init__`` sets ``__getattr__ = FORMER.package_getattr(__name__)``. ``names``: for a key of
    ``packages``, the only names it forwards (any other is an AttributeError, so the package's own
    submodules import as ever); a package without an entry forwards every name its homes have.
    ``published_by``: a package whose ``__all__`` publishes names; a forwarded name it publishes
    (the same object) is named as ``from <published_by> import name`` in the warning.
    """

    def __init__(
        self,
        modules: Mapping[str, str | tuple[str, ...]] = {},
        packages: Mapping[str, str | tuple[str, ...]] = {},
        *,
        names: Mapping[str, Collection[str]] = {},
        published_by: str | None = None,
    ):
        self.modules = {former: _homes("modules", former, v) for former, v in modules.items()}
        self.packages = {former: _homes("packages", former, v) for former, v in packages.items()}
        unknown = sorted(set(names) - set(self.packages))
        if unknown:
            raise ValueError(f"FormerPaths names: {unknown} are not keys of packages ({sorted(self.packages)})")
        self.names = {package: frozenset(n) for package, n in names.items()}
        self.published_by = published_by

    def forward(self, former: str, homes: tuple[str, ...], name: str):
        """``name`` asked for as ``from former import name``: the value from the first of ``homes``
        that has it, with a warning naming the import to use now. AttributeError when none has it.
        Called from a module's ``__getattr__`` (the warning points at the line that imports)."""
        if name.startswith("__"):  # the import machinery's own probes (__path__, __file__, ...)
            raise AttributeError(f"module {former!r} has no attribute {name!r}")
        for home in homes:
            module = importlib.import_module(home)
            if hasattr(module, name):
                value = getattr(module, name)
                now = f"from {self._publisher(name, value) or home} import {name}"
                warnings.warn(
                    f"`from {former} import {name}` is deprecated and works until rllab 1.0: use `{now}`",
                    RllabDeprecationWarning,
                    stacklevel=3,
                )
                return value
        raise AttributeError(f"module {former!r} (moved to {', '.join(homes)}) has no attribute {name!r}")

    def _publisher(self, name: str, value) -> str | None:
        """:attr:`published_by` when it publishes ``name`` as ``value``, else None."""
        if self.published_by is None:
            return None
        package = importlib.import_module(self.published_by)
        published = name in getattr(package, "__all__", ()) and getattr(package, name, None) is value
        return self.published_by if published else None

    def package_getattr(self, package: str) -> Callable[[str], object]:
        """The ``__getattr__`` of ``package`` (a key of ``packages``): the names it held as a module."""
        if package not in self.packages:
            raise KeyError(f"{package!r} is not a key of this table's packages ({sorted(self.packages)})")
        homes, only = self.packages[package], self.names.get(package)

        def __getattr__(name: str):
            if only is not None and name not in only:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            return self.forward(package, homes, name)

        return __getattr__

    def install(self) -> None:
        """Make this table's former modules importable (once; installing it again changes nothing),
        and show rllab's deprecations by default. A former module another table already claims
        for other homes is a ValueError naming both."""
        finder = next((f for f in sys.meta_path if isinstance(f, _Finder)), None)
        if finder is None:
            finder = _Finder()
            sys.meta_path.append(finder)
        for former, homes in self.modules.items():
            claimed = finder.rows.get(former)
            if claimed is not None and claimed[1] != homes:
                raise ValueError(
                    f"former module {former!r} is forwarded to {', '.join(claimed[1])} by one table "
                    f"and to {', '.join(homes)} by another"
                )
            finder.rows[former] = (self, homes)
        if not sys.warnoptions:  # an explicit -W / PYTHONWARNINGS decides alone
            warnings.filterwarnings("default", category=RllabDeprecationWarning)


class _FormerModule(types.ModuleType):
    """What ``import former`` gives: each name forwarded, with a warning, on first use."""

    def __init__(self, name: str, table: FormerPaths, homes: tuple[str, ...]):
        super().__init__(name, f"Moved to {', '.join(homes)} (works until rllab 1.0).")
        self._former = (table, homes)

    def __getattr__(self, name: str):
        table, homes = self.__dict__["_former"]
        return table.forward(self.__name__, homes, name)

    def __dir__(self):
        return sorted({n for home in self.__dict__["_former"][1] for n in dir(importlib.import_module(home))})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the former modules of every installed table (only those: every other name, None)."""

    def __init__(self):
        self.rows: dict[str, tuple[FormerPaths, tuple[str, ...]]] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.rows:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=f"moved to {', '.join(self.rows[fullname][1])}")

    def create_module(self, spec):
        return _FormerModule(spec.name, *self.rows[spec.name])

    def exec_module(self, module) -> None:
        pass
