"""Reading local data-set files through ``datasets``, and checking their rows.

:func:`read_rows` reads JSON lines / JSON (``.jsonl``, ``.json``), Parquet (``.parquet``), CSV
(``.csv``) and ``save_to_disk`` directories, never a hub: a path that does not exist is refused
before ``datasets`` is asked. :func:`parse_prompt`, :func:`column` and :func:`text_value` check one
row's values, with errors that name the file, the row (counted from 1) and the column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
EVAL_SPLITS = ("eval", "test", "validation")


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ImportError("the dataset task reads files through the datasets package: pip install 'rllab[data]'") from None
    return datasets


def read_rows(path: str, *, who: str) -> dict[str, list[dict]]:
    """The rows of a local file or ``save_to_disk`` directory, by split: ``{"train": rows}`` for a
    file or a single data set, one entry per split for a saved ``DatasetDict``."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{who}: no such file or directory: {p} (data sets are read from local paths only)")
    datasets = _datasets()
    quiet = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # no "Generating train split" bar for a local file
    try:
        if p.is_dir():
            ds = datasets.load_from_disk(str(p))
        else:
            builder = BUILDERS.get(p.suffix.lower())
            if builder is None:
                raise ValueError(f"unknown file type {p.suffix!r}; use one of {', '.join(BUILDERS)} or a save_to_disk directory")
            ds = datasets.load_dataset(builder, data_files=str(p), split="train")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{who}: {p}: {e}") from None
    except Exception as e:  # datasets / arrow raise many kinds on a malformed file
        raise ValueError(f"{who}: cannot read {p}: {type(e).__name__}: {e}") from None
    finally:
        if not quiet:
            datasets.enable_progress_bars()
    if isinstance(ds, datasets.DatasetDict):
        return {name: split.to_list() for name, split in ds.items()}
    return {"train": ds.to_list()}


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
    (checked by :func:`rllab.chat.check_prompt`, returned as a tuple of plain dicts)."""
    from rllab.chat import check_prompt

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
