"""Import verl 0.9.1's ``core_algos`` without its distributed runtime (``rllab crosscheck verl`` and
the reference tests).

``import verl`` runs ``verl/__init__.py``, which imports ``verl.protocol`` and with it Ray and
tensordict; none of that is needed by the pure tensor functions compared. :func:`load_verl` therefore

1. puts a bare package object for ``verl`` in ``sys.modules`` (its ``__path__`` points at the
   installed package, so submodules are found but ``verl/__init__.py`` never runs);
2. serves empty stand-in modules for the heavy third-party packages that are *not installed*
   (``ray``, ``tensordict``, ``codetiming``) and for ``verl.protocol``, through a meta-path
   finder: attribute look-ups on them return inert placeholder classes, which is all that
   module-level annotations and base classes need;
3. imports ``core_algos``, ``rollout_corr_helper`` and the actor config;
4. removes every ``verl*`` module and every stand-in from ``sys.modules`` again (restoring any
   entry that was there before) and takes the finder off ``sys.meta_path``.

The loaded module objects keep working afterwards because their globals hold the functions and
modules they call. Real third-party modules imported on the way (torch, numpy, omegaconf,
transformers) stay imported, as any import would leave them.

Install the reference with ``pip install omegaconf orjson && pip install --no-deps verl==0.9.1``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from dataclasses import dataclass

INSTALL_HINT = "pip install omegaconf orjson && pip install --no-deps verl==0.9.1"
EXPECTED_VERSION = "0.9.1"

# Heavy runtime dependencies that verl's tensor code never calls; stubbed only when missing.
HEAVY = ("ray", "tensordict", "codetiming")
# verl modules replaced by stand-ins even when their dependencies are installed.
VERL_STUBBED = ("verl.protocol",)

_lock = threading.Lock()
_cache: "VerlReference | None" = None
_error: str | None = None


class VerlUnavailable(RuntimeError):
    """verl (or one of its light dependencies) cannot be imported."""


@dataclass(frozen=True)
class VerlReference:
    """The reference modules and helpers the comparison tests use."""

    version: str
    core_algos: types.ModuleType
    rollout_corr: types.ModuleType
    torch_functional: types.ModuleType
    ActorConfig: type
    PolicyLossConfig: type

    def actor_config(self, policy_loss=None, **overrides):
        """An ``ActorConfig`` with the fields its validator insists on, plus ``overrides``.

        ``policy_loss`` is a dict of ``PolicyLossConfig`` fields (clip-cov / kl-cov knobs).
        """
        fields = dict(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
        fields.update(overrides)
        if policy_loss is not None:
            fields["policy_loss"] = self.PolicyLossConfig(**policy_loss)
        return self.ActorConfig(**fields)


class _Placeholder(type):
    """Metaclass of the inert classes a stand-in module hands out for any attribute."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves :class:`_StandIn` modules for ``roots`` (and their submodules) and ``exact``."""

    def __init__(self, roots, exact):
        self.roots = tuple(roots)
        self.exact = tuple(exact)
        self.served: list[str] = []

    def _handles(self, fullname):
        return fullname in self.exact or fullname.split(".")[0] in self.roots

    def find_spec(self, fullname, path=None, target=None):
        if not self._handles(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module):
        self.served.append(module.__name__)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _load() -> VerlReference:
    if "verl" in sys.modules:  # a real verl is already imported: use it as it is
        import verl.trainer.ppo.core_algos as core_algos
        import verl.trainer.ppo.rollout_corr_helper as rollout_corr
        import verl.utils.torch_functional as torch_functional
        from verl.workers.config import ActorConfig, PolicyLossConfig

        version = getattr(sys.modules["verl"], "__version__", "unknown")
        return VerlReference(
            version, core_algos, rollout_corr, torch_functional, ActorConfig, PolicyLossConfig
        )
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise VerlUnavailable(f"verl is not installed; install the reference with `{INSTALL_HINT}`")
    if not _installed("omegaconf"):
        raise VerlUnavailable(f"omegaconf is not installed; install it with `{INSTALL_HINT}`")
    root = list(spec.submodule_search_locations)
    try:
        with open(f"{root[0]}/version/version") as f:
            version = f.read().strip()
    except OSError:
        version = "unknown"

    missing = [name for name in HEAVY if not _installed(name)]
    finder = _StandInFinder(missing, VERL_STUBBED)
    before = {name: mod for name, mod in sys.modules.items() if _ours(name, missing)}

    package = types.ModuleType("verl")
    package.__path__ = root
    package.__file__ = None
    package.__version__ = version
    package.__spec__ = importlib.machinery.ModuleSpec("verl", None, is_package=True)
    package.__spec__.submodule_search_locations = root

    sys.meta_path.insert(0, finder)
    sys.modules["verl"] = package
    try:
        core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
        rollout_corr = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
        torch_functional = importlib.import_module("verl.utils.torch_functional")
        workers_config = importlib.import_module("verl.workers.config")
    except ImportError as exc:
        raise VerlUnavailable(
            f"verl {version} could not be imported ({exc!r}); the reference tests expect "
            f"`{INSTALL_HINT}`"
        ) from exc
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if _ours(n, missing)]:
            del sys.modules[name]
        sys.modules.update(before)
    return VerlReference(
        version,
        core_algos,
        rollout_corr,
        torch_functional,
        workers_config.ActorConfig,
        workers_config.PolicyLossConfig,
    )


def _ours(name: str, stubbed_roots) -> bool:
    top = name.split(".")[0]
    return top == "verl" or top in stubbed_roots


def load_verl() -> VerlReference:
    """Import the reference once per process; raise :class:`VerlUnavailable` if it cannot be."""
    global _cache, _error
    with _lock:
        if _cache is not None:
            return _cache
        if _error is not None:
            raise VerlUnavailable(_error)
        try:
            _cache = _load()
        except VerlUnavailable as exc:
            _error = str(exc)
            raise
        return _cache
