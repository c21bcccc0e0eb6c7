"""rllab_tasks' module paths before it was split by role still import, each name with a
DeprecationWarning naming the module that holds it now (its table: rllab_tasks/_former.py)."""

from __future__ import annotations

import importlib
import re
import warnings

import pytest

import rllab_tasks  # noqa: F401  (installs the table)
from rllab import RllabDeprecationWarning
from rllab_tasks._former import FORMER_MODULES, FORMER_NAMES

MOVED = [
    # (former module, name, the module that holds it now)
    ("rllab_tasks.arithmetic", "AdditionTask", "rllab_tasks.tasks.arithmetic"),
    ("rllab_tasks.datafiles", "read_rows", "rllab_tasks.tasks.datafiles"),
    ("rllab_tasks.dataset", "DatasetConfig", "rllab_tasks.tasks.dataset"),
    ("rllab_tasks.files", "reward_exact", "rllab_tasks.tasks.files"),
    ("rllab_tasks.reasoning", "ReasoningGymTask", "rllab_tasks.tasks.reasoning"),
    ("rllab_tasks.reasoning", "ReasoningGymRetryEnvironment", "rllab_tasks.environments.reasoning_retry"),
    ("rllab_tasks.strings", "SortTask", "rllab_tasks.tasks.strings"),
    ("rllab_tasks.gem_env", "GemConfig", "rllab_tasks.environments.gem"),
    ("rllab_tasks.openenv_env", "OpenEnvError", "rllab_tasks.environments.openenv"),
    ("rllab_tasks.textarena_env", "TextArenaConfig", "rllab_tasks.environments.textarena"),
    ("rllab_tasks.curriculum", "Curriculum", "rllab_tasks.samplers.curriculum"),
    ("rllab_tasks.environments", "_ToolEnvironment", "rllab_tasks.environments.tools"),
    ("rllab_tasks.samplers", "DefaultSampler", "rllab_tasks.samplers.pools"),
]


@pytest.mark.parametrize("former,name,home", MOVED, ids=lambda v: v if "." in v else None)
def test_a_former_path_forwards_with_a_warning_naming_the_new_module(former, name, home):
    scope: dict = {}
    with pytest.warns(DeprecationWarning, match=re.escape(f"`from {former} import {name}` is deprecated")) as seen:
        exec(f"from {former} import {name}", scope)
    assert {(str(w.message).rsplit("use ", 1)[1], w.category) for w in seen} == {
        (f"`from {home} import {name}`", RllabDeprecationWarning)
    }
    assert scope[name] is getattr(importlib.import_module(home), name)


def test_every_former_path_is_tested():
    assert {m for m, _, _ in MOVED} == set(FORMER_MODULES) | set(FORMER_NAMES)


def test_the_new_packages_import_their_submodules_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        exec("from rllab_tasks.environments import tools\nfrom rllab_tasks.samplers import pools", {})
