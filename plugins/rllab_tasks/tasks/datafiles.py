"""Reading local data-set files through ``datasets``, and checking their rows.

:func:`read_rows` reads JSON lines / JSON (``.jsonl``, ``.json``), Parquet (``.parquet``), CSV
(``.csv``) and ``save_to_disk`` directories, never a hub: a path that does not exist is refused
before ``datasets`` is asked. :func:`parse_prompt`, :func:`column` and :func:`text_value` check one
row's values, with errors that name the file, the row (counted from 1) and the column.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Mapping

from rllab.errors import MissingExtraError
from rllab import note_data_file

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
EVAL_SPLITS = ("eval", "test", "validation")


MISSING = "the dataset task reads files through the datasets package: pip install 'rllab[data]'"


def installed() -> None:
    """Refuse, naming the ``pip install``, when datasets is not installed: asked before a run
    creates anything (:func:`rllab.training.parts.check_installed`)."""
    if importlib.util.find_spec("datasets") is None:
        raise MissingExtraError(MISSING)


def _datasets():
    try:
        import datasets
    except ImportError:
        raise MissingExtraError(MISSING) from None
    return datasets


def read_rows(path: str, *, who: str) -> dict[str, list[dict]]:
    """The rows of a local file or ``save_to_disk`` directory, by split: ``{"train": rows}`` for a
    file or a single data set, one entry per split for a saved ``DatasetDict``."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{who}: no such file or directory: {p} (data sets are read from local paths only)")
    _check_shape(p, who)
    note_data_file(p)  # its contents are hashed into the run's provenance.json
    datasets = _datasets()
    quiet = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # no "Generating train split" bar for a local file
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own "Failed to load JSON" line: the error says it
    try:
        if p.is_dir():
            ds = datasets.load_from_disk(str(p))
        else:
            ds = datasets.load_dataset(BUILDERS[p.suffix.lower()], data_files=str(p), split="train")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{who}: {p}: {e}") from None
    except Exception as e:  # datasets / arrow raise many kinds on a malformed file
        if "corresponds to no data" in str(e):
            raise ValueError(f"{who}: {p} has no rows; {_NEEDS}") from None
        cause = e.__cause__ or e.__context__
        why = f"{type(e).__name__}: {e}" + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")
        raise ValueError(f"{who}: cannot read {p} as {p.suffix or 'a data set'}: {why}") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
        if not quiet:
            datasets.enable_progress_bars()
    if isinstance(ds, datasets.DatasetDict):
        tables = {name: split.to_list() for name, split in ds.items()}
    else:
        tables = {"train": ds.to_list()}
    if not any(tables.values()):
        raise ValueError(f"{who}: {p} has no rows; {_NEEDS}")
    return tables


_NEEDS = "a data set needs at least two rows (one to train on, one held out)"


def _check_shape(p: Path, who: str) -> None:
    """Refuse what ``datasets`` would answer with a puzzle: a directory that ``save_to_disk`` did not
    write, a file type it is not read as, an empty file, a text file of blank lines only."""
    if p.is_dir():
        if not any((p / marker).is_file() for marker in ("dataset_info.json", "dataset_dict.json", "state.json")):
            inside = sorted(str(f.relative_to(p)) for f in p.rglob("*") if f.suffix.lower() in BUILDERS)[:3]
            hint = f"; the data files in it: {', '.join(inside)} (give one as the path)" if inside else ""
            raise ValueError(
                f"{who}: {p} is a directory but not one written by Dataset.save_to_disk (no dataset_info.json or "
                f"dataset_dict.json); give a {', '.join(BUILDERS)} file or a save_to_disk directory{hint}"
            )
        return
    if not p.is_file():
        raise ValueError(f"{who}: {p} is not a regular file")
    if p.suffix.lower() not in BUILDERS:
        raise ValueError(
            f"{who}: {p}: unknown file type {p.suffix!r}; use one of {', '.join(BUILDERS)} or a save_to_disk directory "
            f"(the type is read from the file's extension)"
        )
    if p.stat().st_size == 0:
        raise ValueError(f"{who}: {p} is empty (0 bytes); {_NEEDS}")
    if p.suffix.lower() in (".jsonl", ".json", ".csv"):
        with p.open("rb") as f:
            head = f.read(1 << 16)
        if not head.strip() and len(head) == p.stat().st_size:
            raise ValueError(f"{who}: {p} holds only blank lines; {_NEEDS}")


def column(row: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    """``(found, value)`` of a column; a dotted name reads into nested objects
    (``reward_model.ground_truth``)."""
    if name in row:
        return True, row[name]
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def parse_prompt(value: Any, where: str) -> str | tuple[dict, ...]:
    """A prompt: a non-empty string, or a non-empty list of ``{"role", "content"}`` messages
    (checked by :func:`rllab.rollout.chat.check_prompt`, returned as a tuple of plain dicts)."""
    from rllab.rollout.chat import check_prompt

    if isinstance(value, str):
        if not value:
            raise ValueError(f"{where}: the prompt is empty")
        return value
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: the prompt must be a string or a list of {{role, content}} messages, got {type(value).__name__} {value!r}")
    return check_prompt(value, where=where)


def text_value(value: Any, where: str) -> str:
    """A string cell; a number is kept as its text (``42`` → ``"42"``, ``2.0`` → ``"2.0"``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{where}: expected a string or a number, got {type(value).__name__} {value!r}")
