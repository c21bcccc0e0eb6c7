"""Tools an environment exposes: named functions the model calls in a parseable format.

A :class:`Tool` is a name, a description, a JSON-schema ``parameters`` object (what a chat
template's ``tools=`` takes, see :meth:`Tool.schema`) and a function — plain or ``async def``.
An episode hands each model turn to :func:`tool_step`, which parses the calls in it, runs them
and answers with the :class:`rllab.rollout.environment.Step` to return: the results as a ``"tool"``
observation, or an error observation — never an exception. When a called tool is async the
answer is an awaitable of that Step (the turn's async calls awaited together), which ``step``
returns as it is: the rollout loop awaits every episode's step together, so a tool that waits
does not stall the batch.

Call formats
------------
Two formats are recognised in a turn (``formats`` picks which; both by default):

``hermes`` — what Hermes/Qwen-style chat models emit (and their chat templates render for
``tools=``): a JSON object with ``name`` and ``arguments`` between tags, several per turn
allowed::

    <tool_call>{"name": "calc", "arguments": {"expression": "123*45"}}</tool_call>

``arguments`` may be omitted (no arguments) or be a JSON string of the object (OpenAI's wire
form). Anything else between the tags, or an unclosed ``<tool_call>``, is a malformed call.

``compact`` — short enough for the tiny character-level model (``< > ( )`` are in its
alphabet): the tool's name and its arguments in parentheses between angle brackets::

    <calc(123*45)>
    <lookup(kx, 2)>

The text between the parentheses is passed verbatim (stripped) when the tool has one
parameter, so it may contain commas; otherwise it is split on commas and the pieces (stripped
strings) are passed to the parameters in the order ``parameters["properties"]`` declares them.
In this format ``<`` followed by a letter or ``_`` starts a call: one that does not complete as
``<name(...)>`` is malformed.

Text outside the calls is ignored (a chat model may reason before calling). A turn without a
call is not a tool turn: :func:`tool_step` returns None and the environment scores it as an
answer.

What a turn's call becomes
--------------------------
- every call parses and runs: the results, in call order, joined by newlines (a string result
  as it is, anything else as JSON), as a ``role="tool"`` observation;
- a malformed call (``parse_failures``): an observation ``error: malformed tool call: ...`` and
  the episode goes on; or, with ``failed_parse_reward`` set, the episode ends with that reward;
  no call of the turn runs;
- an unknown tool name (``tool_errors``): ``error: unknown tool 'x' (tools: a, b)``;
- arguments that do not fit the parameters, or a tool that raises (``tool_errors``):
  ``error: NAME raised TypeName: message``.

With ``terse_errors`` the three read ``error: malformed call``, ``error: unknown tool`` and
``error: tool failed``: a small model cannot use the details, and they would fill its context.

:attr:`Step.metrics` counts ``tool_calls`` (calls parsed), ``tool_errors`` and
``parse_failures``; the rollout loop sums them over a batch's episodes.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence

import attrs

from rllab.rollout.environment import Step
from rllab.errors import RllabError

FORMATS = ("hermes", "compact")
"""The call formats :func:`parse_tool_calls` knows."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(re.escape(_HERMES_OPEN) + r"(.*?)" + re.escape(_HERMES_CLOSE), re.DOTALL)
_COMPACT_CALL = re.compile(r"<([A-Za-z_][A-Za-z0-9_]*)\((.*?)\)>", re.DOTALL)
_COMPACT_START = re.compile(r"<[A-Za-z_]")


class ToolCallParseError(RllabError, ValueError):
    """A turn that attempts a tool call the parser cannot read (its message says why)."""


class ToolDefinitionError(RllabError, ValueError):
    """A tool declared wrongly (bad name, duplicate name, parameters that are not a JSON schema)."""


# --------------------------------------------------------------------------- tools


def _check_name(inst, attribute, value):
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ToolDefinitionError(f"tool name {value!r} is not an identifier (letters, digits, '_'; not starting with a digit)")


def _check_parameters(inst, attribute, value):
    if not isinstance(value, Mapping) or value.get("type", "object") != "object":
        raise ToolDefinitionError(f"tool {inst.name!r}: parameters must be a JSON schema of type 'object', got {value!r}")
    props = value.get("properties", {})
    if not isinstance(props, Mapping):
        raise ToolDefinitionError(f"tool {inst.name!r}: parameters['properties'] must be a mapping, got {props!r}")
    unknown = sorted(set(value.get("required", ())) - set(props))
    if unknown:
        raise ToolDefinitionError(f"tool {inst.name!r}: required parameters {unknown} are not among its properties {sorted(props)}")


@attrs.frozen
class Tool:
    """A named function the model may call.

    :param name: what the model writes to call it (an identifier).
    :param function: called with the arguments as keywords; may be ``async def`` (awaited) or
        return an awaitable. Its return value becomes the observation (a string as it is,
        anything else as JSON); what it raises becomes an error observation.
    :param description: one line for the model (rendered by chat templates).
    :param parameters: a JSON schema of type ``object``; ``properties`` names the parameters in
        the order compact calls pass them, ``required`` those a call must give.
    """

    name: str = attrs.field(validator=_check_name)
    function: Callable[..., Any]
    description: str = ""
    parameters: Mapping[str, Any] = attrs.field(
        factory=lambda: {"type": "object", "properties": {}}, validator=_check_parameters
    )

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return tuple(self.parameters.get("properties", {}))

    def schema(self) -> dict:
        """The OpenAI-style function schema chat templates take in ``tools=``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }

    def bind(self, call: "ToolCall") -> dict[str, Any]:
        """The keyword arguments of ``call`` for this tool; raises TypeError when they do not fit."""
        names = self.parameter_names
        if call.arguments is None:  # compact: positional strings
            args = call.positional
            if len(names) == 1:
                args = (call.raw.strip(),) if call.raw.strip() else ()
            if len(args) > len(names):
                raise TypeError(f"takes {len(names)} argument(s) ({', '.join(names) or 'none'}), got {len(args)}")
            kwargs = dict(zip(names, args))
        else:
            kwargs = dict(call.arguments)
            unknown = sorted(set(kwargs) - set(names))
            if unknown and names:
                raise TypeError(f"unknown argument(s) {unknown}; parameters: {', '.join(names)}")
        missing = [n for n in self.parameters.get("required", ()) if n not in kwargs]
        if missing:
            raise TypeError(f"missing required argument(s) {missing}")
        return kwargs


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def tool(function: Callable[..., Any], *, name: str | None = None, description: str | None = None) -> Tool:
    """A :class:`Tool` from a function's signature: its name, its docstring's first line, and a
    parameter per argument (typed from ``str``/``int``/``float``/``bool`` annotations, else
    ``string``; required when it has no default)."""
    sig = inspect.signature(function)
    hints = {k: v for k, v in getattr(function, "__annotations__", {}).items()}
    props, required = {}, []
    for p in sig.parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise ToolDefinitionError(f"tool {name or function.__name__!r}: parameter {p.name!r} must be a named parameter, not *args/**kwargs")
        hint = hints.get(p.name)
        hint = {"str": str, "int": int, "float": float, "bool": bool}.get(hint, hint) if isinstance(hint, str) else hint
        props[p.name] = {"type": _JSON_TYPES.get(hint, "string")}
        if p.default is p.empty:
            required.append(p.name)
    doc = (inspect.getdoc(function) or "").strip().splitlines()
    return Tool(
        name=name or function.__name__,
        function=function,
        description=description if description is not None else (doc[0] if doc else ""),
        parameters={"type": "object", "properties": props, "required": required},
    )


def tool_map(tools: "Iterable[Tool] | Mapping[str, Tool]") -> dict[str, Tool]:
    """Tools by name; refuses a duplicate name or something that is not a :class:`Tool`."""
    items = tools.values() if isinstance(tools, Mapping) else tools
    out: dict[str, Tool] = {}
    for t in items:
        if not isinstance(t, Tool):
            raise ToolDefinitionError(f"expected rllab.rollout.tools.Tool, got {type(t).__name__} {t!r}")
        if t.name in out:
            raise ToolDefinitionError(f"two tools are named {t.name!r}")
        out[t.name] = t
    return out


# --------------------------------------------------------------------------- parsing


@attrs.frozen
class ToolCall:
    """One parsed call: ``arguments`` (keywords, hermes) or ``positional`` (strings, compact)."""

    name: str
    arguments: Mapping[str, Any] | None = None
    positional: tuple[str, ...] = ()
    format: str = "hermes"
    raw: str = ""
    """compact: the text between the parentheses, verbatim."""


def _check_formats(formats: Sequence[str]) -> tuple[str, ...]:
    formats = tuple(formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(f"tool-call formats {list(formats)!r}: must be a non-empty selection of {list(FORMATS)}")
    return formats


def _hermes_call(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ToolCallParseError(f"{_HERMES_OPEN} holds invalid JSON ({e.msg} at char {e.pos}): {body.strip()[:80]!r}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ToolCallParseError(f'{_HERMES_OPEN} must hold an object with a string "name", got {body.strip()[:80]!r}')
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise ToolCallParseError(f'"arguments" of {obj["name"]!r} is a string that is not JSON: {args[:80]!r}') from None
    if not isinstance(args, dict):
        raise ToolCallParseError(f'"arguments" of {obj["name"]!r} must be an object, got {args!r}'[:200])
    return ToolCall(name=obj["name"], arguments=args, format="hermes")


def parse_tool_calls(text: str, formats: Sequence[str] = FORMATS) -> list[ToolCall]:
    """The tool calls in a model turn, in order (empty: the turn makes no call).

    :raises ToolCallParseError: the turn attempts a call in one of ``formats`` that is malformed.
    """
    formats = _check_formats(formats)
    found: list[tuple[int, ToolCall]] = []
    rest = text
    if "hermes" in formats:
        for m in _HERMES_BLOCK.finditer(text):
            found.append((m.start(), _hermes_call(m.group(1))))
        rest = _HERMES_BLOCK.sub(lambda m: " " * len(m.group(0)), text)
        if _HERMES_OPEN in rest:
            raise ToolCallParseError(f"{_HERMES_OPEN} without its closing {_HERMES_CLOSE}")
    if "compact" in formats:
        matches = list(_COMPACT_CALL.finditer(rest))
        starts = {m.start() for m in matches}
        for s in _COMPACT_START.finditer(rest):
            if s.start() not in starts:
                raise ToolCallParseError(
                    f"a call must read <name(arguments)>, got {rest[s.start():s.start() + 40]!r}"
                )
        for m in matches:
            inner = m.group(2)
            pos = tuple(a.strip() for a in inner.split(",")) if inner.strip() else ()
            found.append((m.start(), ToolCall(name=m.group(1), positional=pos, format="compact", raw=inner)))
    return [c for _, c in sorted(found, key=lambda x: x[0])]


def format_tool_call(name: str, arguments: Mapping[str, Any] | Sequence[Any] = (), *, format: str = "compact") -> str:
    """The text of a call as :func:`parse_tool_calls` reads it (for demonstrations and prompts).

    ``arguments``: a mapping (keywords) or a sequence (compact positional values; for hermes a
    mapping is required). Compact values are written with ``str`` in the given order, joined by commas.
    """
    if format == "hermes":
        if not isinstance(arguments, Mapping):
            raise ValueError(f"a hermes call takes arguments as a mapping, got {arguments!r}")
        return f"{_HERMES_OPEN}{json.dumps({'name': name, 'arguments': dict(arguments)})}{_HERMES_CLOSE}"
    if format == "compact":
        values = arguments.values() if isinstance(arguments, Mapping) else arguments
        return f"<{name}({','.join(str(v) for v in values)})>"
    raise ValueError(f"tool-call format {format!r}: must be one of {list(FORMATS)}")


# --------------------------------------------------------------------------- running


def render_result(value: Any) -> str:
    """A tool's return value as observation text: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _error(call: ToolCall, e: BaseException, terse: bool) -> tuple[str, bool]:
    return ("error: tool failed" if terse else f"error: {call.name} raised {type(e).__name__}: {e}"), False


def tool_step(
    text: str,
    tools: "Iterable[Tool] | Mapping[str, Tool]",
    *,
    formats: Sequence[str] = FORMATS,
    failed_parse_reward: float | None = None,
    wrap: str = "{}",
    terse_errors: bool = False,
) -> "Step | Awaitable[Step] | None":
    """Run the tool calls of one model turn and answer with the episode's :class:`Step`.

    :param text: the model's turn, decoded.
    :param tools: the tools the episode exposes.
    :param formats: the call formats recognised (see the module docstring).
    :param failed_parse_reward: None: a malformed call is answered with an error observation
        and the episode goes on; a number: the episode ends with this reward.
    :param wrap: a ``str.format`` pattern with one ``{}`` the observation text is put into
        (e.g. ``"{}\\n"``), for a model that needs the result delimited.
    :param terse_errors: error observations name the kind of error only (``error: malformed
        call``, ``error: unknown tool``, ``error: tool failed``) — a few tokens, for a small
        model's context; the full messages otherwise.
    :returns: None when the turn makes no call (score it as an answer); else a not-done Step
        with ``role="tool"`` (or the done Step of a failed parse with ``failed_parse_reward``)
        and metrics ``tool_calls``, ``tool_errors``, ``parse_failures`` — or, when a called tool
        is async, an awaitable of that Step (its calls awaited together). Either is what an
        episode's ``step`` returns as it is: the rollout loop awaits every episode's awaitable
        together. Plain tools run at once, in call order.
    """
    tools = tool_map(tools)
    try:
        calls = parse_tool_calls(text, formats)
    except ToolCallParseError as e:
        metrics = {"tool_calls": 0, "tool_errors": 0, "parse_failures": 1}
        if failed_parse_reward is not None:
            return Step(reward=float(failed_parse_reward), done=True, metrics=metrics)
        text = "error: malformed call" if terse_errors else f"error: malformed tool call: {e}"
        return Step(observation=wrap.format(text), role="tool", metrics=metrics)
    if not calls:
        return None
    results: list[tuple[str, bool] | None] = [None] * len(calls)
    pending: list[tuple[int, ToolCall, Awaitable]] = []
    for i, call in enumerate(calls):
        t = tools.get(call.name)
        if t is None:
            results[i] = ("error: unknown tool" if terse_errors else
                          f"error: unknown tool {call.name!r} (tools: {', '.join(sorted(tools)) or 'none'})"), False
            continue
        try:
            value = t.function(**t.bind(call))
        except Exception as e:  # noqa: BLE001 — a tool's failure is the model's observation, not a crash
            results[i] = _error(call, e, terse_errors)
            continue
        if inspect.isawaitable(value):
            pending.append((i, call, value))
        else:
            results[i] = render_result(value), True

    def answer() -> Step:
        errors = sum(not ok for _, ok in results)
        return Step(
            observation=wrap.format("\n".join(r for r, _ in results)),
            role="tool",
            metrics={"tool_calls": len(calls), "tool_errors": errors, "parse_failures": 0},
        )

    if not pending:
        return answer()

    async def wait() -> Step:
        values = await asyncio.gather(*(a for _, _, a in pending), return_exceptions=True)
        for (i, call, _), value in zip(pending, values):
            if isinstance(value, BaseException) and not isinstance(value, Exception):
                raise value
            results[i] = _error(call, value, terse_errors) if isinstance(value, Exception) else (render_result(value), True)
        return answer()

    return wait()


def run_step(result: "Step | Awaitable[Step]") -> Step:
    """The Step of an episode's ``step`` return value, run to completion when it is awaitable
    (for scripted episodes and tests outside an event loop)."""
    if inspect.isawaitable(result):
        async def wait():
            return await result

        return asyncio.run(wait())
    return result
