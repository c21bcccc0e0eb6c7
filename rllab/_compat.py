"""Import paths of earlier releases, kept working until rllab 1.0.

Each path below was documented once and has since moved. Importing a name from it still works
and warns (:class:`RllabDeprecationWarning`, a :class:`DeprecationWarning`), naming the import to
use now: ``from rllab import Step`` where ``rllab`` publishes the name, its new module otherwise.
Nothing is imported until a name is asked for, so the table costs ``import rllab`` nothing.

Internal modules may move freely: a path documented in a release gets a row here when it moves.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

FORMER_MODULES = {
    "rllab.chat": "rllab.rollout.chat",
    "rllab.distributed": "rllab.parallel.distributed",
    "rllab.environment": "rllab.rollout.environment",
    "rllab.episodes": "rllab.rollout.episodes",
    "rllab.events": "rllab.hookspecs",
    "rllab.lora": "rllab.models.lora",
    "rllab.optimizer": "rllab.training.optimizer",
    "rllab.parts": "rllab.training.parts",
    "rllab.placement": "rllab.parallel.placement",
    "rllab.provenance": "rllab.records.provenance",
    "rllab.reducer": "rllab.parallel.reducer",
    "rllab.rewards": "rllab.rollout.rewards",
    "rllab.runs": "rllab.training.runs",
    "rllab.tinymodel": "rllab.models.tiny",
    "rllab.tomlio": "rllab.records.tomlio",
    "rllab.tools": "rllab.rollout.tools",
    "rllab.trainer": "rllab.training.trainer",
}
"""A former module → the module that holds its names now."""

FORMER_NAMES = {
    "rllab.models": ("rllab.models.forward", (
        "CriticModel", "HIDDEN_PATH_MODEL_TYPES", "TOKENIZER_PROBE", "ValueHead", "enable_checkpointing",
        "grouped_response_logprobs", "is_sharded", "load_tokenizer", "position_ids_from_mask", "response_log_sum_sq_probs",
        "response_logprobs", "supports_hidden_path", "transformers_progress_bars_off",
    )),
    "rllab.rollout": ("rllab.rollout.stage", ("episode_batch",)),
}  # fmt: skip
"""A former module that is a package now → the module that holds the names it had, and those
names (``from rllab.models import grouped_response_logprobs``); read by the package's
``__getattr__``. Any other name is not looked up, so the package's own submodules import as ever."""


class RllabDeprecationWarning(DeprecationWarning):
    """An import path of an earlier release, working until rllab 1.0. Shown by default (Python
    hides a :class:`DeprecationWarning` raised outside ``__main__``) unless ``-W`` or
    ``PYTHONWARNINGS`` says otherwise."""


def forward(former: str, home: str, name: str):
    """``name`` of the module ``home``, asked for as ``from former import name``: the value, with a
    warning naming the import to use now. AttributeError if ``home`` has no such name."""
    if name.startswith("__"):  # the import machinery's own probes (__path__, __file__, ...)
        raise AttributeError(f"module {former!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)  # AttributeError names home and the name
    rllab = sys.modules["rllab"]
    published = name in rllab.__all__ and getattr(rllab, name) is value
    now = f"from rllab import {name}" if published else f"from {home} import {name}"
    warnings.warn(
        f"`from {former} import {name}` is deprecated and works until rllab 1.0: use `{now}`",
        RllabDeprecationWarning,
        stacklevel=3,
    )
    return value


def former_names(package: str):
    """The ``__getattr__`` of ``package`` (a key of :data:`FORMER_NAMES`): names it held as a module."""

    home, names = FORMER_NAMES[package]

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return forward(package, home, name)

    return __getattr__


class _FormerModule(types.ModuleType):
    """What ``import rllab.environment`` gives: each name forwarded, with a warning, on first use."""

    def __getattr__(self, name: str):
        return forward(self.__name__, FORMER_MODULES[self.__name__], name)

    def __dir__(self):
        return dir(importlib.import_module(FORMER_MODULES[self.__name__]))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the former modules (only those: ``find_spec`` answers None for every other name)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in FORMER_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=f"moved to {FORMER_MODULES[fullname]}")

    def create_module(self, spec):
        return _FormerModule(spec.name, f"Moved to :mod:`{FORMER_MODULES[spec.name]}` (works until rllab 1.0).")

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    """Put the finder on ``sys.meta_path`` once, and show rllab's deprecations by default."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
    if not sys.warnoptions:  # an explicit -W / PYTHONWARNINGS decides alone
        warnings.filterwarnings("default", category=RllabDeprecationWarning)
