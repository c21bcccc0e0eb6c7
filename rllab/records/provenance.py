"""What produced a result: ``provenance.json`` in every run directory and suite result.

A run's record (:func:`collect`) holds what decides its numbers and can differ between two
machines running the same config:

- ``code``: rllab's version and, run from a git checkout, the commit and a sha256 of
  ``git diff HEAD`` (uncommitted edits of tracked files; untracked files are not in it);
- ``python`` and ``libraries``: the interpreter, the version of every installed distribution
  imported by the run (torch, transformers, peft, trl, datasets, numpy, …), and
  ``environment``: one sha256 over every ``name==version`` installed;
- ``machine``: the CPU model, its vector ISA flags (AVX2, AVX-512, AMX, …), the kernel family
  torch dispatches to (``torch.backends.cpu.get_cpu_capability()``), torch's intra- and
  inter-op thread counts and the ``*_NUM_THREADS`` variables; GPU names, CUDA, cuDNN and the
  driver when CUDA is present;
- ``hashes``: the resolved config, every data file the run read (by content; a directory by all
  its files), every plugin file loaded by path, and the starting model's files
  (:func:`model_sha256`: the warm start or ``model.path``);
- ``seeds``: every setting named ``seed`` in the config.

:func:`differences` compares two records field by field, leaving out what names a place rather
than a content (paths, the host, the time): two runs on one machine with one config have none.
A file path in a record is informational; data, plugins and the start are compared by hash.

Plugins that read data files call :func:`note_data_file` (the built-in ``jsonl`` and
``dataset`` tasks do); the config's own values that name an existing file are hashed too, so a
third-party task that reads a file named by one of its knobs is covered without doing anything.

The hashes live in :mod:`rllab.records.hashing` and the environment in :mod:`rllab.records.machine`;
their names are importable from here as well.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from rllab.errors import ConfigError
from rllab.records.hashing import (  # noqa: F401  (published here too: the record's hashes)
    MEMO_BYTES,
    MODEL_RECORDS,
    STARTS_ENV,
    check_start,
    find_start,
    model_sha256,
    sha256_data,
    sha256_file,
    sha256_tree,
    starts_dirs_said,
)
from rllab.records.machine import (  # noqa: F401  (published here too: the record's environment)
    ISA_FLAGS,
    cpu_info,
    environment,
    environment_hash,
    git_state,
    imported_libraries,
    torch_info,
)

PROVENANCE_FILE = "provenance.json"
FORMAT = 1
"""Bumped when a field changes meaning."""


# --------------------------------------------------------------------------- data files read


_reads = threading.local()


def note_data_file(path: str | os.PathLike) -> None:
    """Record that the run reads ``path`` (a file, or a directory of one data set); plugins that
    read data call it. Outside :func:`recording_data` it does nothing."""
    found = getattr(_reads, "files", None)
    if found is not None:
        p = Path(path).expanduser().resolve()
        if p not in found:
            found.append(p)


@contextmanager
def recording_data() -> Iterator[list[Path]]:
    """Collect the paths :func:`note_data_file` is given inside the block (in this thread)."""
    before = getattr(_reads, "files", None)
    _reads.files = found = [] if before is None else before
    try:
        yield found
    finally:
        _reads.files = before


def config_files(section: Mapping[str, Any]) -> list[Path]:
    """Existing files a config section's values name (nested tables and lists too); a
    ``file.py:function`` reference counts its file. Only a value that looks like a path counts
    (it holds a ``/`` or a ``.``), so a bare word never hashes a directory that happens to bear
    its name."""
    out: list[Path] = []

    def visit(v):
        if isinstance(v, Mapping):
            for x in v.values():
                visit(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)
        elif isinstance(v, str) and v.strip() and len(v) < 4096:
            text = v.rsplit(":", 1)[0] if ".py:" in v else v
            if "/" not in text and os.sep not in text and "." not in text:
                return  # a bare word ("exact", "train") is a choice, not a path, even where a file of that name exists
            try:
                p = Path(text).expanduser()
                if p.is_file() or (p.is_dir() and text not in (".", "..")):
                    if p.resolve() not in out:
                        out.append(p.resolve())
            except (OSError, ValueError):
                pass

    visit(section)
    return out


def data_hashes(paths: Iterable[str | os.PathLike]) -> dict[str, str]:
    """``{path: sha256}`` of each file (or data-set directory) in ``paths``."""
    return {str(p): sha256_data(p) for p in paths}


def content_keyed(section: Mapping[str, Any], hashes: Mapping[str, str]) -> dict:
    """A config section with each value that names a hashed file replaced by ``"sha256:HEX"``:
    what identifies the data by content (the warm start's cache key), wherever it lies."""

    def swap(v):
        if isinstance(v, Mapping):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [swap(x) for x in v]
        if isinstance(v, str) and v.strip():
            try:
                resolved = str(Path(v).expanduser().resolve())
            except (OSError, ValueError):
                return v
            if resolved in hashes:
                return f"sha256:{hashes[resolved]}"
        return v

    return {k: swap(v) for k, v in section.items()}


# --------------------------------------------------------------------------- a run's record


def config_sha256(config: Mapping[str, Any]) -> str:
    """The sha256 of a resolved config (``ExperimentConfig.to_dict()``), without what does not
    change a result: its name, output directory, loggers, recorded provenance and the pins
    (``model.sha256``, and any section's setting named ``sha256`` or ``*_sha256``, e.g. ``algorithm.teacher_sha256``)."""
    data = {k: v for k, v in config.items() if k not in ("name", "output_dir", "provenance", "loggers")}
    for sec, section in data.items():  # a pin checks an input by content; it does not change it
        if isinstance(section, Mapping):
            data[sec] = {k: v for k, v in section.items() if not (isinstance(k, str) and (k == "sha256" or k.endswith("_sha256")))}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def seeds(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every setting named ``seed`` (or ending in ``_seed``) in a config, by its dotted key."""
    out = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(seeds(v, key + "."))
        elif isinstance(k, str) and (k == "seed" or k.endswith("_seed")) and not isinstance(v, (list, dict)):
            out[key] = v
    return out


def plugin_files(lab) -> list[dict]:
    """The plugins loaded by path or module name, each with the sha256 of its file."""
    out = []
    for p in getattr(lab, "plugins", ()):
        if not p.ok or p.source not in ("file", "module"):
            continue
        path = p.name if p.source == "file" else getattr(sys.modules.get(p.name), "__file__", None)
        entry = {"name": p.name, "source": p.source}
        if path and Path(path).is_file():
            entry.update(path=str(path), sha256=sha256_file(path))
        out.append(entry)
    return out


def component_inputs(components: Iterable[Any]) -> list[dict]:
    """The other inputs the run's components read (a distillation teacher's weights, …): each
    component that has a ``provenance_inputs()`` method returns ``[{"setting", "path", "sha256"}]``
    (the setting that names the input, where it lies and the hash of its contents)."""
    out = []
    for component in components:
        method = getattr(component, "provenance_inputs", None)
        if callable(method):
            out.extend(dict(entry) for entry in method() or ())
    return out


def collect(config: Mapping[str, Any], *, lab=None, data: Mapping[str, str] = {}, start: Mapping[str, Any] | None = None,
            inputs: Iterable[Mapping[str, Any]] = ()) -> dict:
    """A run's provenance record.

    :param config: the resolved config (``cfg.to_dict()``).
    :param data: ``{path: sha256}`` of the data files the run read (:func:`data_hashes`).
    :param start: the starting model: ``{"kind": "warm_start" | "model.path", "path", "sha256"}``.
    :param inputs: the components' other hashed inputs (:func:`component_inputs`).
    """
    record = {
        "format": FORMAT,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **environment(),
        "hashes": {
            "config": config_sha256(config),
            "data": [{"path": p, "sha256": h} for p, h in data.items()],
            "plugins": plugin_files(lab),
            "start": dict(start) if start is not None else None,
        },
        "seeds": seeds({k: v for k, v in config.items() if k != "provenance"}),
    }
    inputs = [dict(i) for i in inputs]
    if inputs:  # only where a component read one: the records without stay as they were
        record["hashes"]["inputs"] = inputs
    return record


def write(directory: str | os.PathLike, record: Mapping[str, Any]) -> Path:
    """Write ``record`` to ``DIRECTORY/provenance.json`` (atomically)."""
    path = Path(directory) / PROVENANCE_FILE
    tmp = path.with_name(f".{PROVENANCE_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read(directory_or_file: str | os.PathLike) -> dict:
    """The record of a run directory or suite result (or a ``provenance.json`` itself)."""
    p = Path(directory_or_file)
    if not p.exists():
        raise ConfigError(f"{p} does not exist: give a run directory, a suite result or a {PROVENANCE_FILE}")
    path = p / PROVENANCE_FILE if p.is_dir() else p
    if not path.is_file():
        raise ConfigError(f"{p} has no {PROVENANCE_FILE}: it was not written by a run of this rllab (runs record one since 0.1.0)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        hint = f" (give a run directory, a suite result or its {PROVENANCE_FILE})" if path.name != PROVENANCE_FILE else ""
        where = f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise ConfigError(f"{path} is not a provenance record: not valid JSON ({e.msg if isinstance(e, json.JSONDecodeError) else e.reason}{where}){hint}") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path} is not a provenance record: it holds a JSON {type(record).__name__}, not an object")
    return record


def note_resume(directory: str | os.PathLike, record: Mapping[str, Any], *, step: int) -> dict | None:
    """On a resume at ``step``: when ``record`` (the resuming process's) differs from the run's
    own record (:func:`differences`, the config's hash aside: a resume may extend
    ``train.steps``), append ``{"step", "recorded_at", "differences": {field: [before, now]}}`` to
    its ``resumes`` and return that entry; the steps after it ran elsewhere. A run without a
    record (written before runs kept one) is left without one."""
    path = Path(directory) / PROVENANCE_FILE
    if not path.is_file():
        return None
    before = read(path)
    changed = {k: [a, b] for k, a, b in differences(before, record) if k != "hashes.config"}
    if not changed:
        return None
    entry = {"step": step, "recorded_at": record.get("recorded_at"), "differences": changed}
    write(directory, {**before, "resumes": [*before.get("resumes", []), entry]})
    return entry


# --------------------------------------------------------------------------- comparing records


BESIDE_THE_RECORD = ("format", "resumes")
"""Top-level keys that are not fields of the record: its format version and the resumes under
another provenance (:func:`note_resume`)."""

PLACES = ("recorded_at", "machine.host", "machine.platform", "machine.cpu.cores")
"""Fields that say where or when, not what: never a difference (``machine.platform`` names the OS
kernel build; the libraries, CPU and thread counts that compute are compared)."""


def comparable(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record flattened to ``{dotted field: value}`` for comparison: places and times left out,
    paths replaced by the contents' hashes (data by the multiset of their hashes, plugins by name
    and hash, the start by its hash)."""
    rec = json.loads(json.dumps(record, default=str))
    hashes = rec.pop("hashes", {}) or {}
    flat = flatten({k: v for k, v in rec.items() if k not in BESIDE_THE_RECORD})
    for key in PLACES:
        flat.pop(key, None)
    flat["hashes.config"] = hashes.get("config")
    flat["hashes.data"] = sorted(d.get("sha256") for d in hashes.get("data", ()))
    flat["hashes.plugins"] = sorted(f"{Path(d['name']).name if d.get('source') == 'file' else d['name']}:{d.get('sha256')}"
                                    for d in hashes.get("plugins", ()))
    start = hashes.get("start") or {}
    flat["hashes.start"] = start.get("sha256")
    if hashes.get("inputs"):
        flat["hashes.inputs"] = sorted(f"{d.get('setting')}:{d.get('sha256')}" for d in hashes["inputs"])
    return flat


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings → ``{"a.b.c": value}`` (keys after ``prefix``); an empty mapping is a value of its own."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, value in a, value in b)`` for each field of two records (:func:`comparable`)
    that differs, in sorted order; empty when the two were made alike."""
    fa, fb = comparable(a), comparable(b)
    keys = sorted(set(fa) | set(fb))
    # a library imported by one process and not (yet) by the other is not another version: the
    # environment's hash says whether the installed sets differ
    keys = [k for k in keys if not k.startswith("libraries.") or (k in fa and k in fb)]
    return [(k, fa.get(k), fb.get(k)) for k in keys if fa.get(k) != fb.get(k)]


IDENTITY_BREAKERS = {
    "machine.torch.threads": "torch's thread count (reductions split differently)",
    "machine.torch.cpu_capability": "the CPU kernels torch dispatches to (another vector ISA)",
    "machine.cpu.isa": "the CPU's vector instruction sets",
    "machine.cpu.model": "the CPU model",
    "libraries.": "a library version",
    "environment.sha256": "the installed environment",
    "python.": "the Python interpreter",
    "code.": "rllab's code (version, commit or uncommitted edits)",
    "machine.torch.cuda": "the GPU, CUDA or driver",
    "hashes.config": "the config",
    "hashes.data": "the data files' contents",
    "hashes.plugins": "a plugin file's contents",
    "hashes.start": "the starting model's weights",
    "seeds.": "a seed",
}
"""What a differing field means, by its prefix (for the messages of ``rllab reproduce``)."""


def explain(field: str) -> str:
    """What a differing field of :func:`differences` means."""
    field = field.rpartition(": ")[2]  # "resumed at step N: FIELD"
    for prefix, why in IDENTITY_BREAKERS.items():
        if field == prefix or field.startswith(prefix):
            return why
    return "recorded setting"


def format_value(v: Any, limit: int = 70) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
