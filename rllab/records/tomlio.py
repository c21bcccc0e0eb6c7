"""TOML in and out for configs: command-line values, the line of a key, a small writer."""

from __future__ import annotations

import re
import tomllib
from typing import Any, Mapping


def parse_value(text: str) -> Any:
    """A command-line value as TOML would read it (numbers, booleans, lists); else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def line_of(text: str, section: str | None, key: str | None) -> str:
    """' (line N)' for ``key`` inside ``[section]`` of a TOML text, when it can be found."""
    if not text or not key:
        return ""
    lines = text.splitlines()
    in_section = section is None
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith("["):
            in_section = section is not None and s.strip("[] ") == section
            continue
        if in_section and re.match(rf"[\"']?{re.escape(key)}[\"']?\s*=", s):
            return f" (line {i})"
    return ""


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
"""How a TOML basic string writes the characters it may not hold as they are (other control characters: ``\\uXXXX``)."""


def dump_toml(data: Mapping[str, Any]) -> str:
    """A minimal TOML writer for resolved configs (tables, scalars, lists, inline dicts)."""

    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if c < " " or c == "\x7f" else c) for c in v) + '"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, Mapping):
            return "{ " + ", ".join(f"{_key(k)} = {val(x)}" for k, x in v.items()) + " }"
        raise TypeError(f"cannot write {v!r} to TOML")

    def _key(k: str) -> str:
        return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else val(k)

    lines = []
    tables = []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            tables.append((k, v))
        elif k == "schedule":
            continue
        else:
            lines.append(f"{_key(k)} = {val(v)}")
    for k, v in tables:
        lines.append(f"\n[{k}]")
        lines.extend(f"{_key(kk)} = {val(vv)}" for kk, vv in v.items() if vv is not None)
    for e in data.get("schedule", ()):
        lines.append("\n[[schedule]]")
        lines.append(f"step = {e['step']}")
        lines.append(f"set = {val(e['set'])}")
    return "\n".join(lines) + "\n"
