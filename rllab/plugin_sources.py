"""Where plugins come from: the environment variables that choose which installed plugins a
:class:`rllab.Lab` loads (``RLLAB_PLUGINS`` for third-party ones, ``RLLAB_BUILTINS`` for rllab's
own, which still accepts the built-ins' former names), and a plugin file imported by its path.
The Lab (:mod:`rllab.lab`, which publishes these names too) reads them while it loads plugins."""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path

ENV_ALLOW = "RLLAB_PLUGINS"
ENV_BUILTINS = "RLLAB_BUILTINS"
BUILTIN_DISTRIBUTION = "rllab"

RENAMED_BUILTINS = {
    "rllab_gae": "rllab_advantages",
    "rllab_grpo": "rllab_advantages",
    "rllab_ppo": ("rllab_policy_losses", "rllab_value_losses"),
    "rllab_tis": "rllab_corrections",
    "rllab_agg": "rllab_aggregations",
    "rllab_dpo": "rllab_preference_losses",
    "rllab_rl": "rllab_algorithms",
    "rllab_pref": "rllab_algorithms",
    "rllab_hf": "rllab_backends",
    "rllab_sglang": "rllab_backends",
}
"""Built-in plugin names before the plugins were named by role; ``RLLAB_BUILTINS`` still accepts them."""


def _env_set(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    return None if raw is None else {s.strip() for s in raw.split(",") if s.strip()}


def _renamed(names: set[str]) -> set[str]:
    """``names`` with the old built-in names replaced by the new ones, each with a FutureWarning."""
    out = set()
    for name in sorted(names):
        new = RENAMED_BUILTINS.get(name)
        if new is None:
            out.add(name)
            continue
        new = (new,) if isinstance(new, str) else new
        warnings.warn(
            f"{ENV_BUILTINS}: the built-in plugin {name!r} is now {' and '.join(map(repr, new))}; "
            "the old name will stop working in a future release",
            FutureWarning,
            stacklevel=4,
        )
        out.update(new)
    return out


def import_file(path: Path, *, prefix: str, reuse: bool = False):
    """The Python file ``path`` imported as a module (named ``<prefix>_<stem>_<hash>``); with
    ``reuse``, the module already imported from it if any. A file that fails to import leaves
    nothing behind in ``sys.modules``."""
    mod_name = f"{prefix}_{path.stem}_{abs(hash(str(path))) % 10**8}"
    if reuse and mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module
