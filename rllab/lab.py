"""The Lab: plugin manager, plugin loading and the component registries.

A :class:`Lab` loads plugins from three places, in order:

1. the ``rllab`` entry-point group (built-ins and pip-installed plugins alike), filtered by the
   ``RLLAB_PLUGINS`` environment variable — unset: load all; empty: load none; otherwise a
   comma-separated allow-list of entry-point or distribution names;
2. ``plugins=`` given to the constructor (``--plugin`` on the command line): a path to a ``.py``
   file, an importable module name, or a module/object with hook implementations.

It then calls every registration hook once, per plugin, so each component is recorded with the
plugin that provided it. ``lab.get(kind, name, **knobs)`` returns the component bound to a
validated frozen config.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import attrs
import cattrs
import pluggy

from rllab import hookspecs

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
    "logger": "register_loggers",
}

ENV_ALLOW = "RLLAB_PLUGINS"


# --------------------------------------------------------------------------- errors


class RllabError(Exception):
    """Base class of rllab's user-facing errors."""


class UnknownKindError(RllabError, KeyError):
    def __str__(self):  # KeyError quotes its message otherwise
        return self.args[0]


class UnknownComponentError(RllabError, KeyError):
    """A component name that no loaded plugin registered."""

    def __str__(self):
        return self.args[0]


class DuplicateComponentError(RllabError):
    """Two plugins registered the same (kind, name)."""


class ConfigError(RllabError, ValueError):
    """A bad knob or a malformed config."""


class PluginLoadError(RllabError):
    """A plugin that could not be imported or failed while registering."""


# --------------------------------------------------------------------------- knobs


def knob(
    default: Any = attrs.NOTHING,
    *,
    help: str,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Iterable[Any] | None = None,
    validator: Callable | None = None,
    factory: Callable | None = None,
    optional: bool = False,
):
    """Declare a component knob: an attrs field with a help text and a checked range.

    ``ge``/``gt``/``le``/``lt`` bound numbers, ``choices`` restricts to listed values; ``None``
    is allowed when it is the default or when ``optional=True`` (annotate the field
    ``float | None``). The range shows in ``rllab plugins show`` and in error messages.
    """
    parts = []
    for op, bound in (("≥", ge), (">", gt), ("≤", le), ("<", lt)):
        if bound is not None:
            parts.append(f"{op} {bound}")
    choices_t = tuple(choices) if choices is not None else None
    if choices_t is not None:
        parts.append("one of " + ", ".join(repr(c) for c in choices_t))
    if optional or default is None:
        parts.append("or None")
        optional = True
    allowed = " and ".join(parts[:-1]) + " " + parts[-1] if optional and len(parts) > 1 else " and ".join(parts)

    def check(inst, attribute, value):
        if value is None and optional:
            return
        if choices_t is not None and value not in choices_t:
            raise ValueError(f"{attribute.name} = {value!r} is not allowed: must be {allowed}")
        checks = (
            (ge, lambda v, b: v >= b),
            (gt, lambda v, b: v > b),
            (le, lambda v, b: v <= b),
            (lt, lambda v, b: v < b),
        )
        for bound, ok in checks:
            if bound is not None and not ok(value, bound):
                raise ValueError(f"{attribute.name} = {value!r} is out of range: must be {allowed}")
        if validator is not None:
            validator(inst, attribute, value)

    kwargs: dict[str, Any] = {"validator": check, "metadata": {"help": help, "allowed": allowed}}
    if factory is not None:
        kwargs["factory"] = factory
    else:
        kwargs["default"] = default
    return attrs.field(**kwargs)


@attrs.frozen
class NoConfig:
    """This component has no knobs."""


# --------------------------------------------------------------------------- specs


@attrs.frozen(kw_only=True)
class ComponentSpec:
    """A registered component: what ``register(...)`` records."""

    kind: str
    name: str
    fn: Callable
    config: type = NoConfig
    summary: str = ""
    aliases: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    provider: str = ""
    """The plugin that registered it (entry-point name, module name or file path)."""
    distribution: str | None = None
    """The installed distribution that ships the plugin, if any."""

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip()

    def knobs(self) -> list["KnobInfo"]:
        """Every knob of the config class, with default, type, allowed range and help."""
        out = []
        cls = attrs.resolve_types(self.config)
        docs = _field_docs(cls)
        for f in attrs.fields(cls):
            if f.default is attrs.NOTHING:
                default: Any = "(required)"
            elif isinstance(f.default, attrs.Factory):  # type: ignore[arg-type]
                default = f.default.factory()
            else:
                default = f.default
            out.append(
                KnobInfo(
                    name=f.name,
                    default=default,
                    type=_type_name(f.type),
                    allowed=f.metadata.get("allowed", ""),
                    help=f.metadata.get("help") or docs.get(f.name, ""),
                )
            )
        return out


@attrs.frozen
class KnobInfo:
    name: str
    default: Any
    type: str
    allowed: str
    help: str


def _type_name(t: Any) -> str:
    if isinstance(t, type):
        return t.__name__
    return str(t).replace("typing.", "")


def _field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (a string literal right after a field) from the class source."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, (ast.AnnAssign, ast.Assign)) and isinstance(b, ast.Expr):
            if isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
                target = a.target if isinstance(a, ast.AnnAssign) else a.targets[0]
                if isinstance(target, ast.Name):
                    docs[target.id] = " ".join(b.value.value.split())
    return docs


@attrs.frozen(kw_only=True)
class Component:
    """A component bound to its config: call it with the kind's keyword arguments."""

    spec: ComponentSpec
    config: Any

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    def __call__(self, **kwargs):
        return self.spec.fn(**kwargs, config=self.config)

    def __repr__(self):
        return f"<{self.spec.kind} {self.spec.name!r} {self.config!r}>"


@attrs.frozen
class PluginInfo:
    name: str
    distribution: str | None
    version: str | None
    source: str
    """'entry point', 'file', 'module' or 'object'."""
    error: str | None = None
    """Why it is broken, when it is."""

    @property
    def ok(self) -> bool:
        return self.error is None


# --------------------------------------------------------------------------- config building

_converter = cattrs.Converter(forbid_extra_keys=True)


def _strict(expected: type):
    def structure(value, _t):
        ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not ok:
            raise TypeError(f"expected {expected.__name__}, got {type(value).__name__} {value!r}")
        return value

    return structure


for _t in (int, float, bool, str):
    _converter.register_structure_hook(_t, _strict(_t))



def build_config(spec: ComponentSpec, values: Mapping[str, Any]) -> Any:
    """Validate ``values`` into ``spec.config``; errors name the plugin, knob, value and range."""
    cls = attrs.resolve_types(spec.config)
    fields = attrs.fields_dict(cls)
    who = f"{spec.kind} {spec.name!r} (plugin {spec.provider})"
    for key in values:
        if key not in fields:
            known = ", ".join(fields) or "none"
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{who} has no knob {key!r}{hint} Its knobs: {known}.")
    kwargs = {}
    for key, value in values.items():
        f = fields[key]
        try:
            kwargs[key] = _converter.structure(value, f.type) if f.type is not None else value
        except Exception as e:  # cattrs raises several kinds; all mean a wrong type
            allowed = f.metadata.get("allowed", "")
            extra = f" ({allowed})" if allowed else ""
            raise ConfigError(
                f"{who}: knob {key} = {value!r} has the wrong type: expected {_type_name(f.type)}{extra}"
                f" [{_flatten(e)}]"
            ) from None
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{who}: {e}") from None


def _flatten(e: BaseException) -> str:
    subs = getattr(e, "exceptions", None)
    if subs:
        return "; ".join(_flatten(s) for s in subs)
    return str(e)


# --------------------------------------------------------------------------- the Lab


class Lab:
    """Plugin manager plus registries.

    :param plugins: extra plugins: ``.py`` paths, module names, or objects with hookimpls.
    :param entry_points: load the ``rllab`` entry-point group (filtered by ``RLLAB_PLUGINS``).
    :param strict: raise on duplicate registrations (True) or record them as problems (False,
        used by ``rllab plugins`` so a conflict can be inspected).
    """

    def __init__(self, plugins: Iterable[Any] = (), *, entry_points: bool = True, strict: bool = True):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: list[PluginInfo] = []
        self.problems: list[str] = []
        self._registry: dict[str, dict[str, ComponentSpec]] = {k: {} for k in KINDS}
        self._aliases: dict[str, dict[str, str]] = {k: {} for k in KINDS}
        self._dists: dict[str, tuple[str | None, str | None]] = {}
        if entry_points:
            self._load_entry_points()
        for p in plugins:
            self.add_plugin(p, _register=False)
        self._register_all(strict=strict)

    # -- loading

    def _load_entry_points(self) -> None:
        allow_env = os.environ.get(ENV_ALLOW)
        allow = None if allow_env is None else {s.strip() for s in allow_env.split(",") if s.strip()}
        for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
            dist = getattr(ep, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else None
            version = dist.version if dist is not None else None
            if allow is not None and ep.name not in allow and (dist_name not in allow):
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
        """Load one more plugin (path, module name or object) and register its components."""
        source = "object"
        try:
            if isinstance(plugin, (str, Path)) and (str(plugin).endswith(".py") or Path(plugin).is_file()):
                path = Path(plugin).resolve()
                if not path.is_file():
                    raise FileNotFoundError(f"no such plugin file: {path}")
                source = "file"
                name = name or str(plugin)
                mod_name = f"rllab_file_plugin_{path.stem}_{abs(hash(str(path))) % 10**8}"
                spec = importlib.util.spec_from_file_location(mod_name, path)
                assert spec is not None and spec.loader is not None
                obj = importlib.util.module_from_spec(spec)
                sys.modules[mod_name] = obj
                try:
                    spec.loader.exec_module(obj)
                except BaseException:
                    sys.modules.pop(mod_name, None)
                    raise
            elif isinstance(plugin, str):
                source = "module"
                name = name or plugin
                obj = importlib.import_module(plugin)
            else:
                obj = plugin
                name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
            self.pm.register(obj, name=name)
        except Exception as e:
            self._broken(name or str(plugin), None, None, source, e, phase="importing")
            return
        self.plugins.append(PluginInfo(name, None, None, source))
        if _register:
            self._register_all(strict=True, only=name)

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
        ) -> None:
            if not isinstance(name, str) or not name:
                raise TypeError(f"{kind} names must be non-empty strings, got {name!r}")
            if not callable(fn):
                raise TypeError(f"{kind} {name!r}: fn must be callable, got {fn!r}")
            if config is not None and not attrs.has(config):
                raise TypeError(f"{kind} {name!r}: config must be an attrs class, got {config!r}")
            doc_line = (fn.__doc__ or "").strip().splitlines()
            spec = ComponentSpec(
                kind=kind,
                name=name,
                fn=fn,
                config=config or NoConfig,
                summary=summary or (doc_line[0] if doc_line else ""),
                aliases=tuple(aliases),
                requires=tuple(requires),
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
        self._check_kind(kind)
        return sorted(self._registry[kind])

    def specs(self, kind: str | None = None) -> list[ComponentSpec]:
        kinds = [kind] if kind else list(KINDS)
        out = []
        for k in kinds:
            self._check_kind(k)
            out.extend(self._registry[k][n] for n in sorted(self._registry[k]))
        return out

    def spec(self, kind: str, name: str) -> ComponentSpec:
        """The spec registered as ``name`` (or an alias) of ``kind``; a helpful error if none."""
        self._check_kind(kind)
        found = self._lookup(kind, name)
        if found is not None:
            return found
        known = sorted(self._registry[kind]) + sorted(self._aliases[kind])
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        listed = ", ".join(sorted(self._registry[kind])) or "(none loaded)"
        broken = [p.name for p in self.plugins if not p.ok]
        extra = f" Broken plugins: {', '.join(broken)}." if broken else ""
        raise UnknownComponentError(f"unknown {kind} {name!r}.{hint} Known {kind} names: {listed}.{extra}")

    def find(self, name: str) -> list[ComponentSpec]:
        """Every spec of any kind registered under ``name`` or an alias of it."""
        return [s for k in KINDS if (s := self._lookup(k, name)) is not None]

    def get(self, kind: str, name: str, **knobs: Any) -> Component:
        """The component ``name`` of ``kind`` bound to a config validated from ``knobs``."""
        spec = self.spec(kind, name)
        return Component(spec=spec, config=build_config(spec, knobs))

    @property
    def hook(self):
        """The event hooks: ``lab.hook.on_step_end(step=..., metrics=...)``."""
        return self.pm.hook
