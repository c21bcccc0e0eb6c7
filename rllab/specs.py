"""Knobs, component specs and the conversion of config values into a component's frozen config.

A component's knobs are the fields of an ``@attrs.frozen`` class declared with :func:`knob`;
:func:`build_config` validates a mapping of values into it, strictly (no silent int → bool,
no unknown keys), with errors that name the plugin, the knob, the value and the allowed range.
"""

from __future__ import annotations

import difflib
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

import attrs
import cattrs

from rllab.errors import ConfigError
from rllab.traits import resolve

SELECTOR_KEY = "name"
"""The key of a component table that picks the component (``{ name = "wandb", project = "x" }``); no
knob may be called so (registration refuses it)."""

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
    """Optional inputs the component needs from the algorithm (``"values"``, ``"reward_components"``, ...)."""
    traits: Mapping[str, Any] = attrs.field(factory=lambda: MappingProxyType({}), hash=False)
    """What the component declared about itself in ``register(...)``, checked against
    :data:`rllab.traits.TRAITS` (undeclared traits are absent: read them with :meth:`trait`)."""
    provider: str = ""
    """The plugin that registered it (entry-point name, module name or file path)."""
    distribution: str | None = None
    """The installed distribution that ships the plugin, if any."""

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip()

    def trait(self, name: str, config: Any = None) -> Any:
        """The declared value of trait ``name`` (the kind's default when undeclared); a per-config
        trait given as a callable is called with ``config``. ``ValueError`` if ``name`` is not a
        trait of this kind."""
        return resolve(self.kind, self.name, self.traits, name, config)

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

    def trait(self, name: str) -> Any:
        """The component's trait ``name`` under its own config (see :meth:`ComponentSpec.trait`)."""
        return self.spec.trait(name, self.config)

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


_TOML_TYPE = {bool: "true or false (a TOML boolean, lower case)", int: "an integer", float: "a number", str: "a string"}


def _strict(expected: type):
    def structure(value, _t):
        ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not ok:
            hint = ""
            if expected is bool and isinstance(value, str) and value.lower() in ("true", "false"):
                hint = f" (write {value.lower()}, without quotes)"
            raise TypeError(f"expected {_TOML_TYPE[expected]}, got {type(value).__name__} {value!r}{hint}")
        return value

    return structure


for _t in (int, float, bool, str):
    _converter.register_structure_hook(_t, _strict(_t))


def _table(value, _t):
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a table, e.g. {{key = \"value\", n = 10}}, got {type(value).__name__} {value!r}")
    return dict(value)


_converter.register_structure_hook(dict, _table)


def _str_or_strs(value, _t):
    if value is None and _t is StrOrStrsOrNone:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"expected a string or a list of strings, got {type(value).__name__} {value!r}")


StrOrStrs = str | tuple[str, ...]
"""A knob type: one string or a list of them (``urls = "http://a"`` or ``urls = ["http://a", "http://b"]``)."""
StrOrStrsOrNone = str | tuple[str, ...] | None
_converter.register_structure_hook(StrOrStrs, _str_or_strs)
_converter.register_structure_hook(StrOrStrsOrNone, _str_or_strs)


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def _float_or_floats(value, _t):
    if value is None and _t is FloatOrFloatsOrNone:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(_number(v) for v in value)
    return _number(value)


FloatOrFloats = float | tuple[float, ...]
"""A knob type: one number or a list of them (``upper = 2.0`` or ``upper = [2.0, 0.1]``)."""
FloatOrFloatsOrNone = float | tuple[float, ...] | None
_converter.register_structure_hook(FloatOrFloats, _float_or_floats)
_converter.register_structure_hook(FloatOrFloatsOrNone, _float_or_floats)


def build_config(spec: ComponentSpec, values: Mapping[str, Any], *, section: str | None = None) -> Any:
    """Validate ``values`` into ``spec.config``; errors name the plugin, knob, value and range
    (and, given the config ``section`` the knobs came from, how to set a missing one)."""
    cls = attrs.resolve_types(spec.config)
    fields = attrs.fields_dict(cls)
    who = f"{spec.kind} {spec.name!r} (plugin {spec.provider})"
    for key in values:
        if key not in fields:
            known = ", ".join(fields) or "none"
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            raise ConfigError(f"{who} has no knob {key!r}{hint} Its knobs: {known}.", key=key)
    kwargs = {}
    for key, value in values.items():
        f = fields[key]
        try:
            kwargs[key] = _converter.structure(value, f.type) if f.type is not None else value
        except Exception as e:  # cattrs raises several kinds; all mean a wrong type
            allowed = f.metadata.get("allowed", "")
            extra = f" ({allowed})" if allowed else ""
            quote = ""
            if isinstance(value, (int, float)) and not isinstance(value, bool) and "str" in _type_name(f.type):
                # e.g. a hash of digits alone, read as a number on the command line (leading zeros already lost)
                quote = f"; text of digits alone is read as a number: quote it ({key}='\"...\"' on the command line, \"...\" in TOML)"
            elif isinstance(value, (Mapping, list, tuple)) and f.type is str:
                # e.g. a reward service's headers given as an object inside task.reward_knobs: the knob holds JSON text
                import json

                try:
                    quote = f"; it takes that as JSON text: {key} = {json.dumps(json.dumps(value))}"
                except (TypeError, ValueError):
                    pass
            raise ConfigError(
                f"{who}: knob {key} = {value!r} has the wrong type: expected {_type_name(f.type)}{extra}"
                f" [{_flatten(e)}]{quote}",
                key=key,
            ) from None
    missing = [k for k, f in fields.items() if f.default is attrs.NOTHING and f.init and k not in kwargs]
    if missing:  # a required knob: say which and how to set it, not the constructor's signature error
        k = missing[0]
        about = fields[k].metadata.get("help", "")
        how = f" (on the command line: {section}.{k}=...)" if section else ""
        raise ConfigError(f"{who} needs knob {k!r}{f' ({about})' if about else ''}, which has no default; set it{how}", key=k)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        bad = next((k for k in kwargs if str(e).startswith(f"{k} ")), None)
        raise ConfigError(f"{who}: {e}", key=bad) from None


def _flatten(e: BaseException) -> str:
    subs = getattr(e, "exceptions", None)
    if subs:
        return "; ".join(_flatten(s) for s in subs)
    return str(e)
