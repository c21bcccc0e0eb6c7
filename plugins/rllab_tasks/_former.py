"""Module paths this plugin had before it was split by role, kept working until rllab 1.0.

``from rllab_tasks.arithmetic import AdditionTask`` still imports, with a :class:`DeprecationWarning`
naming the module that holds the name now; nothing is imported until a name is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

FORMER_MODULES = {
    "rllab_tasks.arithmetic": ("rllab_tasks.tasks.arithmetic",),
    "rllab_tasks.datafiles": ("rllab_tasks.tasks.datafiles",),
    "rllab_tasks.dataset": ("rllab_tasks.tasks.dataset",),
    "rllab_tasks.files": ("rllab_tasks.tasks.files",),
    "rllab_tasks.reasoning": ("rllab_tasks.tasks.reasoning", "rllab_tasks.environments.reasoning_retry"),
    "rllab_tasks.strings": ("rllab_tasks.tasks.strings",),
    "rllab_tasks.gem_env": ("rllab_tasks.environments.gem",),
    "rllab_tasks.openenv_env": ("rllab_tasks.environments.openenv",),
    "rllab_tasks.textarena_env": ("rllab_tasks.environments.textarena",),
    "rllab_tasks.curriculum": ("rllab_tasks.samplers.curriculum",),
}
"""A former module → the modules that hold its names now (the first that has a name wins)."""

FORMER_NAMES = {
    "rllab_tasks.environments": "rllab_tasks.environments.tools",
    "rllab_tasks.samplers": "rllab_tasks.samplers.pools",
}
"""A former module that is a package now → the module that holds the names it had."""


def forward(former: str, homes: tuple[str, ...], name: str):
    """``name`` as ``from former import name``: the value from the first of ``homes`` that has it,
    with a warning naming that module. AttributeError when none has it."""
    if name.startswith("__"):
        raise AttributeError(f"module {former!r} has no attribute {name!r}")
    for home in homes:
        module = importlib.import_module(home)
        if hasattr(module, name):
            warnings.warn(f"`from {former} import {name}` is deprecated and works until rllab 1.0: use "
                          f"`from {home} import {name}`", DeprecationWarning, stacklevel=3)
            return getattr(module, name)
    raise AttributeError(f"module {former!r} (moved to {', '.join(homes)}) has no attribute {name!r}")


def former_names(package: str):
    """The ``__getattr__`` of ``package`` (a key of :data:`FORMER_NAMES`): the names it held as a module."""

    def __getattr__(name: str):
        return forward(package, (FORMER_NAMES[package],), name)

    return __getattr__


class _FormerModule(types.ModuleType):
    def __getattr__(self, name: str):
        return forward(self.__name__, FORMER_MODULES[self.__name__], name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the former modules only (every other name: None)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in FORMER_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=f"moved to {', '.join(FORMER_MODULES[fullname])}")

    def create_module(self, spec):
        return _FormerModule(spec.name, f"Moved to {', '.join(FORMER_MODULES[spec.name])} (works until rllab 1.0).")

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
