"""Content hashes: of a file, of a directory's files wherever it lies, of the starting model (its
hash remembered when it is large), and the exported starts a run pinned with ``model.sha256``
begins from. Read by a run's provenance record (:mod:`rllab.records.provenance`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

from rllab.errors import ConfigError

_CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _tree_files(root: Path, skip: Iterable[str] = ()) -> list[Path]:
    """The regular files under ``root`` in a fixed order, leaving out hidden ones (a name starting
    with ``.``, at any depth) and the top-level names in ``skip``."""
    skip = set(skip)
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or (len(rel.parts) == 1 and rel.name in skip):
            continue
        if p.is_file():
            out.append(p)
    return out


def sha256_tree(root: str | os.PathLike, skip: Iterable[str] = ()) -> str:
    """One sha256 over a directory's files: each file's path relative to ``root`` and the sha256
    of its bytes, in sorted order (so it is the same wherever the directory lies)."""
    root = Path(root)
    h = hashlib.sha256()
    for p in _tree_files(root, skip):
        h.update(f"{p.relative_to(root).as_posix()}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def sha256_data(path: str | os.PathLike) -> str:
    """A data file's sha256, or a directory's (:func:`sha256_tree`)."""
    p = Path(path)
    return sha256_tree(p) if p.is_dir() else sha256_file(p)


MODEL_RECORDS = ("rllab_warm_start.json",)
"""Files rllab writes beside a model about how it was made (timings included): not the model,
so not in its hash."""


MEMO_BYTES = 256 << 20
"""A model directory at least this large has its hash remembered (:func:`model_sha256`)."""


def _memo_dir() -> Path:
    root = os.environ.get("RLLAB_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "rllab" / "models") / ".hashes"


def model_sha256(model_dir: str | os.PathLike) -> str:
    """The starting model's hash: :func:`sha256_tree` of its directory (weights, config and
    tokenizer files), without hidden files and :data:`MODEL_RECORDS`.

    Every run hashes its start, so the hash of a large model (:data:`MEMO_BYTES`, e.g. a 7B
    ``model.path``) is remembered under the model cache (``.hashes/``), keyed by the directory and
    each file's name, size and modification time: a file rewritten in place is hashed again."""
    root = Path(model_dir)
    files = _tree_files(root, MODEL_RECORDS)
    stats = [(p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    if sum(size for _, size, _ in stats) < MEMO_BYTES:
        return sha256_tree(root, skip=MODEL_RECORDS)
    key = hashlib.sha256(json.dumps([str(root.resolve()), stats]).encode()).hexdigest()
    memo = _memo_dir() / f"{key}.sha256"
    try:
        known = memo.read_text().strip()
        if len(known) == 64:
            return known
    except OSError:
        pass
    digest = sha256_tree(root, skip=MODEL_RECORDS)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
        tmp.write_text(digest + "\n")
        os.replace(tmp, memo)
    except OSError:  # a read-only cache: the hash is computed each time
        pass
    return digest


def check_start(model_dir: str | os.PathLike, expected: str | None, *, setting: str = "model.sha256") -> str:
    """The hash of the model in ``model_dir``; with ``expected`` (a full sha256 or a prefix of at
    least 8 hex digits), a :class:`~rllab.errors.ConfigError` naming both hashes when it differs."""
    if not Path(model_dir).is_dir():
        what = "is not a directory" if Path(model_dir).exists() else "does not exist"
        raise ConfigError(
            f"{setting}: the starting model {str(model_dir)!r} {what}: give an exported start-<hash> directory "
            f"(rllab provenance RUN --export-start DIR writes one) or a model directory",
            key=setting.rpartition(".")[2],
        )
    actual = model_sha256(model_dir)
    if expected is not None:
        want = expected.strip().lower().removeprefix("sha256:")
        if not actual.startswith(want):
            raise ConfigError(
                f"{setting} = {expected!r}: the starting model in {model_dir} hashes to {actual}, not {want}. It is not the "
                f"pinned start: put the exported start with that hash (rllab provenance RUN --export-start DIR writes one) in a "
                f"directory of ${STARTS_ENV} ({starts_dirs_said()}) or point model.path at it, or remove {setting} to accept this one",
                key=setting.rpartition(".")[2],
            )
    return actual


def starts_dirs_said() -> str:
    """What :data:`STARTS_ENV` holds, for an error: each directory, and those that do not exist."""
    dirs = [d for d in os.environ.get(STARTS_ENV, "").split(os.pathsep) if d.strip()]
    if not dirs:
        return "unset"
    said = [f"{d!r}" + ("" if Path(d).expanduser().is_dir() else " does not exist") for d in dirs]
    return "now " + ", ".join(said)


STARTS_ENV = "RLLAB_STARTS"
"""Directories (separated by ``os.pathsep``) of exported starts (``start-<16 hex digits>``, as
``rllab provenance RUN --export-start DIR`` writes them) that a run pinned with ``model.sha256``
begins from instead of building its warm start."""


def find_start(expected: str, dirs: Iterable[str | os.PathLike] | None = None) -> Path | None:
    """The exported start in ``dirs`` (default: :data:`STARTS_ENV`'s) whose files hash to
    ``expected`` (a sha256 or a prefix of one), else None. A directory named for the hash whose
    files hash otherwise is skipped."""
    want = expected.strip().lower().removeprefix("sha256:")
    if dirs is None:
        dirs = [d for d in os.environ.get(STARTS_ENV, "").split(os.pathsep) if d.strip()]
    for d in dirs:
        for candidate in sorted(Path(d).expanduser().glob(f"start-{want[:16]}*")):
            if candidate.is_dir() and model_sha256(candidate).startswith(want):
                return candidate
    return None
