"""``rllab plugins``' table (and what ``plugins show NAME`` prints), kept between calls so that
listing needs no component (nor torch).

Listing the components runs every plugin's registration hook, which imports the components'
modules and with them torch: seconds on a small machine. The table's rows (:func:`collect`) are
therefore written to ``$RLLAB_CACHE/plugin-listing-KEY.json`` (default ``~/.cache/rllab/models``),
keyed by everything they are read from (:func:`fingerprint`): rllab's version and source files,
the interpreter, every installed distribution and its version, the ``RLLAB_PLUGINS`` /
``RLLAB_BUILTINS`` filters, and each loaded plugin — its name, distribution, version, whether it
failed to import — with the size and modification time of every ``.py`` file of its package. A
change to any of them is another key, so the table is collected afresh; a plugin given as an
object (no file) is never cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

FORMAT = 1


def cache_dir() -> Path:
    raw = os.environ.get("RLLAB_CACHE")
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "rllab" / "models"


def _files(root: Path) -> list[tuple[str, int, int]]:
    out = []
    for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
        try:
            st = path.stat()
        except OSError:
            continue
        out.append((str(path), st.st_mtime_ns, st.st_size))
    return out


def _package(module: Any) -> Path | None:
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file)
    return path.parent if path.name == "__init__.py" else path


def fingerprint(lab: Any) -> str | None:
    """The key of ``lab``'s listing (see the module notes); None when a plugin has no file to key it by."""
    import importlib.metadata as md

    from rllab.lab import __version__

    dists = sorted({f"{(d.metadata['Name'] or '?').lower()}=={d.version}" for d in md.distributions()})
    parts: list[Any] = [FORMAT, __version__, sys.executable, sys.version, dists,
                        {k: os.environ.get(k) for k in ("RLLAB_PLUGINS", "RLLAB_BUILTINS")},
                        _files(Path(__file__).resolve().parents[1])]  # rllab itself: how specs and knobs read
    for p in sorted(lab.plugins, key=lambda p: p.name):
        parts.append([p.name, p.distribution, p.version, p.source, p.error])
        if p.error is None:
            where = _package(lab.pm.get_plugin(p.name))
            if where is None:
                return None
            parts.append(_files(where))
    parts.append(sorted(map(list, lab.skipped)))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


def collect(lab: Any) -> dict:
    """The listing's rows (every kind), the broken plugins and the conflicts, as :func:`render` takes them."""
    from rllab.lab import KINDS

    lab.register_components()
    rows = []
    for kind in KINDS:
        for spec in lab.specs(kind):
            rows.append({
                "kind": kind,
                "name": spec.name + (f" ({', '.join(spec.aliases)})" if spec.aliases else ""),
                "provider": spec.provider,
                "distribution": spec.distribution if spec.distribution and spec.distribution != spec.provider else None,
                "knobs": ", ".join(f"{k.name}={k.default!r}" for k in spec.knobs()),
                "summary": spec.summary,
            })
    broken = [[p.name, p.error or ""] for p in lab.plugins if not p.ok]
    conflicts = [msg for msg in lab.problems if "registered twice" in msg]
    return {"schema": FORMAT, "rows": rows, "broken": broken, "conflicts": conflicts}


def load(key: str | None) -> dict | None:
    if key is None:
        return None
    path = cache_dir() / f"plugin-listing-{key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == FORMAT else None


def store(key: str | None, data: dict) -> None:
    """Write the listing under ``key`` (atomically; a cache that cannot be written is left alone)."""
    if key is None:
        return
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        for old in root.glob("plugin-listing-*.json"):  # one listing kept: the newest
            old.unlink(missing_ok=True)
        tmp = root / f".plugin-listing-{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, root / f"plugin-listing-{key}.json")
    except OSError:
        pass


def shown(lab: Any, key_parts: list, render) -> str:
    """What ``rllab plugins show`` prints for ``key_parts`` (the name, kind, ``--doc`` and the
    console's width and colours): kept beside the listing under the same key, else ``render()``'s
    text, kept. A name that does not resolve raises in ``render`` and is not kept."""
    key = fingerprint(lab)
    path = cache_dir() / f"plugin-shows-{key}.json" if key is not None else None
    sub = json.dumps(key_parts, default=str)
    try:
        kept = json.loads(path.read_text(encoding="utf-8")) if path is not None else {}
    except (OSError, ValueError):
        kept = {}
    if not isinstance(kept, dict):
        kept = {}
    if sub in kept:
        return kept[sub]
    text = render()
    if path is not None:
        kept[sub] = text
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for old in path.parent.glob("plugin-shows-*.json"):
                if old != path:
                    old.unlink(missing_ok=True)
            tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(kept), encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            pass
    return text


def listing(lab: Any, *, status=None) -> dict:
    """The listing of ``lab``: from the cache when its key matches, else collected (inside
    ``status``, a context manager such as a spinner) and stored."""
    key = fingerprint(lab)
    data = load(key)
    if data is None:
        with status if status is not None else _nothing():
            data = collect(lab)
        store(key, data)
    return data


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
