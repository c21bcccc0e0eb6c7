"""Module paths this plugin had before it was split by role, kept working until rllab 1.0.

``from rllab_tasks.arithmetic import AdditionTask`` still imports, with a :class:`DeprecationWarning`
(:class:`rllab.RllabDeprecationWarning`) naming the module that holds the name now; nothing is
imported until a name is asked for. The mechanism is :class:`rllab.FormerPaths`.
"""

from __future__ import annotations

import rllab

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

FORMER = rllab.FormerPaths(FORMER_MODULES, FORMER_NAMES)
"""The table: ``FORMER.install()`` when the plugin loads; each former package's ``__init__`` sets
``__getattr__ = FORMER.package_getattr(__name__)``."""
