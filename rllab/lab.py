"""The Lab: plugin manager, plugin loading and the component registries.

A :class:`Lab` loads plugins from two places, in order:

1. the ``rllab`` entry-point group — rllab's built-ins and pip-installed plugins take the same
   path. ``RLLAB_PLUGINS`` restricts the *third-party* ones: unset, all load; empty, none;
   otherwise a comma-separated allow-list of entry-point or distribution names. rllab's own
   built-ins always load, unless ``RLLAB_BUILTINS=0`` (none) or ``RLLAB_BUILTINS=a,b`` (only
   those), which is how a plugin is tested on its own;
2. ``plugins=`` given to the constructor (``--plugin`` on the command line): a path to a ``.py``
   file, an importable module name, or a module/object with hook implementations. Each is loaded
   once, however often it is named; a file that does not exist is an error.

It then calls every registration hook once, per plugin, so each component is recorded with the
plugin that provided it. ``lab.get(kind, name, **knobs)`` returns the component bound to a
validated frozen config.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

import attrs
import pluggy

from rllab import hookspecs
from rllab.errors import (  # noqa: F401  (re-exported: rllab.lab is where users met them first)
    ConfigError,
    DuplicateComponentError,
    PluginLoadError,
    RllabError,
    UnknownComponentError,
    UnknownKindError,
)
from rllab.plugin_sources import (  # noqa: F401  (re-exported: where plugins come from)
    BUILTIN_DISTRIBUTION, ENV_ALLOW, ENV_BUILTINS, RENAMED_BUILTINS, _env_set, _renamed, import_file,
)
from rllab.specs import SELECTOR_KEY, Component, ComponentSpec, KnobInfo, NoConfig, PluginInfo, build_config, knob  # noqa: F401
from rllab.traits import check_traits

# kind -> registration hook
KINDS: dict[str, str] = {
    "advantage_estimator": "register_advantage_estimators",
    "policy_loss": "register_policy_losses",
    "kl_penalty": "register_kl_penalties",
    "loss_aggregation": "register_loss_aggregations",
    "importance_correction": "register_importance_corrections",
    "value_loss": "register_value_losses",
    "kl_controller": "register_kl_controllers",
    "preference_loss": "register_preference_losses",
    "rollout_backend": "register_rollout_backends",
    "task": "register_tasks",
    "environment": "register_environments",
    "reward_function": "register_reward_functions",
    "logger": "register_loggers",
    "sampler": "register_samplers",
    "algorithm": "register_algorithms",
}

__version__ = "0.1.0"
"""rllab's version (``rllab.__version__``): recorded in every run directory."""


# --------------------------------------------------------------------------- the Lab


class Lab:
    """Plugin manager plus registries.

    :param plugins: extra plugins: ``.py`` paths, module names, or objects with hookimpls.
    :param entry_points: load the ``rllab`` entry-point group (filtered by ``RLLAB_PLUGINS`` and
        ``RLLAB_BUILTINS``).
    :param strict: raise on duplicate registrations (True) or record them as problems (False,
        used by ``rllab plugins`` so a conflict can be inspected).
    :param defer: load the plugins now but run their registration hooks on the first lookup
        (:meth:`register_components`). A plugin whose ``__init__`` imports its components' modules
        inside the hook (as the built-ins do) then costs no torch import until a component is
        needed: the command line defers, so ``--help`` and config errors that need no component
        answer at once. Until then :attr:`problems` and :attr:`plugins` hold import failures only.
    """

    def __init__(self, plugins: Iterable[Any] = (), *, entry_points: bool = True, strict: bool = True, defer: bool = False):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: list[PluginInfo] = []
        self.problems: list[str] = []
        self._registry: dict[str, dict[str, ComponentSpec]] = {k: {} for k in KINDS}
        self._aliases: dict[str, dict[str, str]] = {k: {} for k in KINDS}
        self._dists: dict[str, tuple[str | None, str | None]] = {}
        self.skipped: list[tuple[str, str]] = []
        """Installed plugins left out by ``RLLAB_PLUGINS`` / ``RLLAB_BUILTINS``: (name, variable)."""
        if entry_points:
            self._load_entry_points()
        for p in plugins:
            self.add_plugin(p, _register=False)
        self._pending: bool | None = strict
        """The ``strict`` of the registration still to run, or None once it ran."""
        if not defer:
            self.register_components()

    def refuse_named_failures(self) -> None:
        """Raise when a plugin the user named (``--plugin``, ``plugins = [...]``) did not load: that
        is not a warning to scroll past while the command goes on without it."""
        named = [p for p in self.plugins if not p.ok and p.source in ("file", "module")]
        if named:
            said = "; ".join(f"{p.name}: {p.error}" for p in named)
            them = "them" if len(named) > 1 else "it"
            raise RllabError(f"plugin{'s' if len(named) > 1 else ''} given by name did not load ({said}); fix {them}, "
                             f"or drop {them} from --plugin / plugins = [...]")

    def register_components(self) -> None:
        """Run every loaded plugin's registration hooks, if a deferred Lab has not yet (every
        lookup calls this; it does nothing the second time)."""
        if self._pending is not None:
            strict, self._pending = self._pending, None
            self._register_all(strict=strict)

    # -- loading

    def _load_entry_points(self) -> None:
        allow = _env_set(ENV_ALLOW)
        builtins = _env_set(ENV_BUILTINS)
        if builtins is not None and builtins & {"1", "all", "true"}:
            builtins = None
        if builtins is not None:
            builtins = _renamed(builtins)
        for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
            dist = getattr(ep, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else None
            version = dist.version if dist is not None else None
            builtin = dist_name == BUILTIN_DISTRIBUTION
            gate, env = (builtins, ENV_BUILTINS) if builtin else (allow, ENV_ALLOW)
            if gate is not None and ep.name not in gate and dist_name not in gate:
                self.skipped.append((ep.name, env))
                continue
            if self.pm.has_plugin(ep.name):
                continue
            try:
                obj = ep.load()
                self.pm.register(obj, name=ep.name)
            except Exception as e:  # keep the rest loaded
                self._broken(ep.name, dist_name, version, "entry point", e, phase="importing")
                continue
            self._dists[ep.name] = (dist_name, version)
            self.plugins.append(PluginInfo(ep.name, dist_name, version, "entry point"))

    def add_plugin(self, plugin: Any, *, name: str | None = None, _register: bool = True) -> None:
        """Load one more plugin (path, module name or object) and register its components.

        A plugin already loaded (the same file, module or object) is not loaded again. A ``.py``
        path that does not exist raises :class:`PluginLoadError`.
        """
        source = "object"
        try:
            if isinstance(plugin, (str, Path)) and (str(plugin).endswith(".py") or Path(plugin).is_file()):
                path = Path(plugin).expanduser().resolve()
                if not path.is_file():
                    raise PluginLoadError(f"plugin file not found: {plugin} (resolved to {path})")
                source = "file"
                name = name or str(path)
                if self.pm.has_plugin(name):
                    return
                obj = import_file(path, prefix="rllab_file_plugin")
            elif isinstance(plugin, str):
                source = "module"
                name = name or plugin
                if self.pm.has_plugin(name):
                    return
                obj = importlib.import_module(plugin)
            else:
                obj = plugin
                name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
                if self.pm.is_registered(obj) or self.pm.has_plugin(name):
                    return
            self.pm.register(obj, name=name)
        except PluginLoadError:
            raise
        except Exception as e:
            self._broken(name or str(plugin), None, None, source, e, phase="importing")
            return
        unknown = self._unknown_hooks(obj)
        if unknown:  # a misspelt hook name registers nothing: said, not skipped in silence
            self.pm.unregister(obj)
            self._broken(name, None, None, source, ValueError(unknown), phase="registering")
            return
        version = getattr(obj, "__version__", None)
        self.plugins.append(PluginInfo(name, None, str(version) if version is not None else None, source))
        if _register and self._pending is not None:  # deferred: this plugin registers with the rest
            self.register_components()
        elif _register:
            self._register_all(strict=True, only=name)

    def _unknown_hooks(self, obj: Any) -> str:
        """What is wrong with ``obj``'s ``@rllab.hookimpl`` functions whose name is no rllab hook
        (e.g. ``register_taskz``), each with the close hook names; "" when every one is a hook."""
        hooks = sorted(n for n in dir(self.pm.hook) if not n.startswith("_") and getattr(getattr(self.pm.hook, n), "spec", None) is not None)
        said = []
        for attr in dir(obj):
            opts = None if attr.startswith("_") else self.pm.parse_hookimpl_opts(obj, attr)
            if opts is None or (opts.get("specname") or attr) in hooks:
                continue
            close = difflib.get_close_matches(attr, hooks, n=1)
            said.append(f"{attr} is not an rllab hook" + (f" (did you mean {close[0]}?)" if close else f" (hooks: {', '.join(hooks)})"))
        return "; ".join(said)

    def _broken(self, name, dist, version, source, e: BaseException, phase: str) -> None:
        tb = traceback.format_exception_only(type(e), e)[-1].strip()
        msg = f"plugin {name!r} failed while {phase}: {tb}"
        self.problems.append(msg)
        self.plugins = [p for p in self.plugins if p.name != name]
        self.plugins.append(PluginInfo(name, dist, version, source, error=tb))

    def _register_all(self, *, strict: bool, only: str | None = None) -> None:
        for kind, hook_name in KINDS.items():
            hook = getattr(self.pm.hook, hook_name)
            for impl in hook.get_hookimpls():
                provider = impl.plugin_name
                if only is not None and provider != only:
                    continue
                if any(p.name == provider and not p.ok for p in self.plugins):
                    continue
                try:
                    impl.function(register=self._registrar(kind, provider, strict))
                except DuplicateComponentError:
                    raise
                except Exception as e:
                    dist, version = self._dists.get(provider, (None, None))
                    self._broken(provider, dist, version, self._source_of(provider), e, phase=f"running {hook_name}")
                    self._unregister_provider(provider)
        self._check_sources(strict=strict)

    def _check_sources(self, *, strict: bool) -> None:
        """A task and an environment under one name would make ``task=NAME`` and ``env=NAME``
        ambiguous to read and to report: refused at load, naming both providers."""
        for name in sorted(set(self._registry["task"]) & set(self._registry["environment"])):
            task, env = self._registry["task"][name], self._registry["environment"][name]
            msg = (
                f"{name!r} is registered both as a task (plugin {task.provider!r}) and as an environment (plugin "
                f"{env.provider!r}); a task and an environment may not share a name. Rename one, or restrict "
                f"loading with {ENV_ALLOW}."
            )
            if strict:
                raise DuplicateComponentError(msg)
            if msg not in self.problems:
                self.problems.append(msg)

    def _source_of(self, provider: str) -> str:
        for p in self.plugins:
            if p.name == provider:
                return p.source
        return "object"

    def _unregister_provider(self, provider: str) -> None:
        for kind in KINDS:
            for n in [n for n, s in self._registry[kind].items() if s.provider == provider]:
                del self._registry[kind][n]
            for a in [a for a, n in self._aliases[kind].items() if n not in self._registry[kind]]:
                del self._aliases[kind][a]

    def _registrar(self, kind: str, provider: str, strict: bool):
        def register(
            name: str,
            fn: Callable,
            *,
            config: type | None = None,
            summary: str | None = None,
            aliases: Iterable[str] = (),
            requires: Iterable[str] = (),
            **traits: Any,
        ) -> None:
            if not isinstance(name, str) or not name:
                raise TypeError(f"{kind} names must be non-empty strings, got {name!r}")
            if not callable(fn):
                raise TypeError(f"{kind} {name!r}: fn must be callable, got {fn!r}")
            if config is not None and not attrs.has(config):
                raise TypeError(f"{kind} {name!r}: config must be an attrs class, got {config!r}")
            if isinstance(fn, type) and getattr(fn, "__abstractmethods__", None):  # a base class's required members
                missing = ", ".join(sorted(fn.__abstractmethods__))
                raise TypeError(f"plugin {provider!r}: {kind} {name!r}: class {fn.__name__} does not define {missing}, which its base class requires")
            if config is not None and SELECTOR_KEY in attrs.fields_dict(config):
                raise TypeError(
                    f"plugin {provider!r}: {kind} {name!r}: its config {config.__name__} has a knob named {SELECTOR_KEY!r}, the "
                    f"key that picks the component in a config table ({{ {SELECTOR_KEY} = \"{name}\", ... }}), so it could "
                    f"never be set and a saved config.toml would lose the component's name; call the knob otherwise "
                    f"(e.g. 'run_name')"
                )
            requires = (requires,) if isinstance(requires, str) else tuple(requires)
            if not all(isinstance(r, str) and r for r in requires):
                raise TypeError(f"{kind} {name!r}: requires must be a tuple of input names, got {requires!r}")
            checked = check_traits(kind, f"plugin {provider!r}: {kind} {name!r}", fn, traits, kinds=tuple(KINDS))
            doc_line = (fn.__doc__ or "").strip().splitlines()
            spec = ComponentSpec(
                kind=kind,
                name=name,
                fn=fn,
                config=config or NoConfig,
                summary=summary or (doc_line[0] if doc_line else ""),
                aliases=tuple(aliases),
                requires=tuple(requires),
                traits=checked,
                provider=provider,
                distribution=self._dists.get(provider, (None, None))[0],
            )
            for key in (name, *spec.aliases):
                existing = self._lookup(kind, key)
                if existing is not None:
                    msg = (
                        f"{kind} {key!r} is registered twice: by plugin {existing.provider!r} and by plugin "
                        f"{provider!r}. Uninstall one, or restrict loading with {ENV_ALLOW}."
                    )
                    if strict:
                        raise DuplicateComponentError(msg)
                    self.problems.append(msg)
                    return
            self._registry[kind][name] = spec
            for a in spec.aliases:
                self._aliases[kind][a] = name

        return register

    # -- lookup

    def _check_kind(self, kind: str) -> None:
        if kind not in KINDS:
            close = difflib.get_close_matches(kind, list(KINDS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UnknownKindError(f"unknown component kind {kind!r}.{hint} Kinds: {', '.join(KINDS)}.")

    def _lookup(self, kind: str, name: str) -> ComponentSpec | None:
        reg = self._registry[kind]
        if name in reg:
            return reg[name]
        alias = self._aliases[kind].get(name)
        return reg.get(alias) if alias else None

    def names(self, kind: str) -> list[str]:
        """Registered names of a kind (aliases not included), sorted."""
        self.register_components()
        self._check_kind(kind)
        return sorted(self._registry[kind])

    def specs(self, kind: str | None = None) -> list[ComponentSpec]:
        self.register_components()
        kinds = [kind] if kind else list(KINDS)
        out = []
        for k in kinds:
            self._check_kind(k)
            out.extend(self._registry[k][n] for n in sorted(self._registry[k]))
        return out

    def spec(self, kind: str, name: str) -> ComponentSpec:
        """The spec registered as ``name`` (or an alias) of ``kind``; a helpful error if none: the
        close names of that kind, or of any other kind, and what may be missing."""
        self.register_components()
        self._check_kind(kind)
        found = self._lookup(kind, name)
        if found is not None:
            return found
        known = sorted(self._registry[kind]) + sorted(self._aliases[kind])
        close = _close_names(str(name), known, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        elsewhere = [s.kind for s in self.find(str(name))]
        if elsewhere:
            hint += f" {name!r} is registered as {_kinds_text(elsewhere)}, not as {_kinds_text([kind])}."
        elif not close:
            hint += self._suggest(str(name), skip=kind)
        elif (ratio := difflib.SequenceMatcher(None, str(name).lower(), close[0].lower()).ratio()) < 1:
            # a closer name of another kind may be what was meant (a name in the wrong section)
            hint += self._suggest(str(name), skip=kind, lead=" Or, of another kind,", tail="?", cutoff=ratio + 1e-9)
        listed = ", ".join(sorted(self._registry[kind])) or "(none loaded)"
        extra = "" if elsewhere else self._missing_hint()
        raise UnknownComponentError(f"unknown {kind} {name!r}.{hint} Known {kind} names: {listed}.{extra}")

    def find(self, name: str) -> list[ComponentSpec]:
        """Every spec of any kind registered under ``name`` or an alias of it."""
        self.register_components()
        return [s for k in KINDS if (s := self._lookup(k, name)) is not None]

    def resolve(self, name: str, kind: str | None = None) -> list[ComponentSpec]:
        """The specs ``name`` names: of ``kind`` (one, or :meth:`spec`'s error), or of every kind
        (at least one). A name no kind has raises :class:`UnknownComponentError` with the close
        names of every kind, each with its kind, and what may be missing (a plugin not loaded)."""
        if not str(name).strip():
            raise UnknownComponentError(f"the component name is empty ({name!r}): give one; 'rllab plugins' lists them.")
        if kind is not None:
            return [self.spec(kind, name)]
        found = self.find(name)
        if found:
            return found
        hint = self._suggest(str(name))
        raise UnknownComponentError(f"unknown component {name!r}: no kind of component has that name.{hint}{self._missing_hint()}")

    def _suggest(self, name: str, *, skip: str | None = None, lead: str = " Did you mean", tail: str = "?",
                 cutoff: float = 0.6) -> str:
        """`` Did you mean 'a' (a policy_loss) or 'b' (a task)?`` over every kind's names and
        aliases (but those of ``skip``) at least ``cutoff`` similar, or ``""`` when none is."""
        kinds_of: dict[str, list[str]] = {}
        for k in KINDS:
            if k == skip:
                continue
            for n in (*self._registry[k], *self._aliases[k]):
                kinds_of.setdefault(n, []).append(k)
        close = _close_names(name, list(kinds_of), n=3, cutoff=max(cutoff, 0.6))
        if not close:
            return ""
        return f"{lead} " + " or ".join(f"{c!r} ({_kinds_text(kinds_of[c])})" for c in close) + tail

    def _missing_hint(self) -> str:
        """Why a name may be missing: a plugin not loaded, broken, or left out by the environment."""
        out = (
            " If it comes from a plugin, that plugin may not be loaded: pass --plugin FILE.py (or a module "
            "name), list it in the config's plugins = [...], or install its package; 'rllab plugins' lists what is loaded."
        )
        broken = [f"{p.name} ({p.error})" for p in self.plugins if not p.ok]
        if broken:
            out += f" Broken plugins: {'; '.join(broken)}."
        if self.skipped:
            by_env: dict[str, list[str]] = {}
            for plugin, env in self.skipped:
                by_env.setdefault(env, []).append(plugin)
            out += "".join(
                f" {env}={os.environ.get(env, '')!r} left out the installed plugins {', '.join(names)}."
                for env, names in by_env.items()
            )
        return out

    def get(self, kind: str, name: str, **knobs: Any) -> Component:
        """The component ``name`` of ``kind`` bound to a config validated from ``knobs``."""
        spec = self.spec(kind, name)
        return Component(spec=spec, config=build_config(spec, knobs))

    @property
    def hook(self):
        """The event hooks: ``lab.hook.on_step_end(step=..., metrics=...)``."""
        return self.pm.hook


def _close_names(name: str, candidates: list[str], *, n: int, cutoff: float) -> list[str]:
    """The ``candidates`` closest to ``name``, compared without case (``GRPO`` finds ``grpo``)."""
    lower: dict[str, str] = {}
    for c in candidates:
        lower.setdefault(c.lower(), c)
    return [lower[c] for c in difflib.get_close_matches(name.lower(), list(lower), n=n, cutoff=cutoff)]


def _kinds_text(kinds: Iterable[str]) -> str:
    """``an advantage_estimator and an algorithm``."""
    parts = [f"{'an' if k[0] in 'aeiou' else 'a'} {k}" for k in dict.fromkeys(kinds)]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
