"""Running a recorded run again and saying whether it came out the same (``rllab reproduce``).

:func:`reproduce_run` re-runs a run directory from its recorded ``config.toml``, pinned to the
starting model its ``provenance.json`` names (``model.sha256``; with ``start``, that exported
model is used in a private cache), under the torch thread count it recorded, and then:

- when the new run's provenance matches the recorded one (:func:`rllab.records.provenance.differences`
  finds nothing), it compares every logged metric value for value, step by step
  (:func:`first_difference`; timings and memory, :data:`UNCOMPARED`, are left out): the verdict is
  ``identical``, or the first step and metric that differ;
- when it does not (another CPU, other library versions, another thread count, edited code; or
  the recorded run was resumed under another provenance, its ``resumes``), it
  names each differing field and compares only what can still hold: the evaluation of the
  untrained start (step 0), when the starting model is the same. It never calls such a rerun
  identical.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import attrs
import torch

from rllab.records import provenance
from rllab.config import load_config
from rllab.errors import RllabError
from rllab.lab import Lab
from rllab.models import tiny as tinymodel
from rllab.training.rundir import CONFIG_FILE
from rllab.training.trainer import run_experiment

METRICS_FILE = "metrics.jsonl"
"""What the rerun compares: the ``jsonl`` logger's file (its default name)."""

UNCOMPARED = ("time/", "perf/")
"""Metric prefixes left out of the comparison: wall-clock timings and memory, which differ
between any two runs."""

IDENTICAL, DIFFERENT, PROVENANCE_DIFFERS = "identical", "different", "provenance differs"


@attrs.frozen
class Difference:
    """The first logged value that differs: its step, metric and the two values (None: absent)."""

    step: int
    metric: str
    recorded: Any
    reproduced: Any

    def describe(self) -> str:
        return f"step {self.step}, {self.metric}: recorded {_show(self.recorded)}, reproduced {_show(self.reproduced)}"


@attrs.frozen
class Outcome:
    """What :func:`reproduce_run` found.

    ``verdict``: :data:`IDENTICAL`, :data:`DIFFERENT` (the provenance matched and a value did not)
    or :data:`PROVENANCE_DIFFERS`. ``fields``: the differing provenance fields ``(field, recorded,
    reproduced)``. ``first``: the first differing value of the compared rows, if any.
    ``start_eval``: with a differing provenance, whether the untrained start's evaluation (step 0)
    still matched (None: not comparable, the starting model differs). ``compared``: how many
    values were compared.
    """

    verdict: str
    run_dir: Path
    fields: list = attrs.field(factory=list)
    first: Difference | None = None
    start_eval: bool | None = None
    compared: int = 0

    @property
    def exit_code(self) -> int:
        """0 identical; 1 a value differs that should not (all of them under a matching
        provenance, the start's evaluation under a differing one), or nothing could be compared
        (the start, config, data or a seed differ); 2 the provenance differs and the start's
        evaluation still matched."""
        if self.verdict == IDENTICAL:
            return 0
        return 2 if self.verdict == PROVENANCE_DIFFERS and self.start_eval else 1


def _show(v: Any) -> str:
    return "absent" if v is None else repr(v)


def read_metrics(path: Path) -> dict[int, dict[str, Any]]:
    """``{step: {metric: value}}`` from a ``metrics.jsonl`` (rows of one step merged, in order)."""
    if not path.is_file():
        raise RllabError(f"{path} is missing: rllab reproduce compares the metrics the jsonl logger writes (loggers = [\"jsonl\", ...])")
    out: dict[int, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            out.setdefault(int(row.pop("step")), {}).update(row)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def first_difference(recorded: dict[int, dict], reproduced: dict[int, dict], steps: list[int] | None = None) -> tuple[Difference | None, int]:
    """The first ``(step, metric)`` whose value differs between two runs' metrics (steps in order,
    metrics in the recorded order, then those only the rerun logged), leaving out
    :data:`UNCOMPARED`; and how many values were compared. ``steps``: only those (default: all)."""
    compared = 0
    for step in steps if steps is not None else sorted(set(recorded) | set(reproduced)):
        a, b = recorded.get(step), reproduced.get(step)
        if a is None or b is None:
            return Difference(step, "(the whole step)", "logged" if a is not None else None, "logged" if b is not None else None), compared
        for key in list(a) + [k for k in b if k not in a]:
            if key.startswith(UNCOMPARED):
                continue
            if not _same(a.get(key), b.get(key)):
                return Difference(step, key, a.get(key), b.get(key)), compared
            compared += 1
    return None, compared


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if n and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextmanager
def _private_cache(start: Path | None, recorded_start: dict | None) -> Iterator[None]:
    """With ``start`` (an exported starting model), a model cache of the rerun's own holding it
    under the directory name the recorded run's warm start had, so the rerun finds it there."""
    if start is None or not recorded_start or recorded_start.get("kind") != "warm_start":
        yield
        return
    root = Path(tempfile.mkdtemp(prefix="rllab-reproduce-cache-"))
    shutil.copytree(start, root / Path(recorded_start["path"]).name)
    old = os.environ.get(tinymodel.CACHE_ENV)
    os.environ[tinymodel.CACHE_ENV] = str(root)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(tinymodel.CACHE_ENV, None)
        else:
            os.environ[tinymodel.CACHE_ENV] = old
        shutil.rmtree(root, ignore_errors=True)


def reproduce_run(result: str | os.PathLike, *, lab: Lab | None = None, run_dir: str | os.PathLike | None = None,
                  start: str | os.PathLike | None = None, progress: bool = False) -> Outcome:
    """Re-run the run in ``result`` and compare (module docstring).

    :param run_dir: where the rerun writes (default: a new temporary directory); it must not hold a run.
    :param start: an exported starting model (``rllab provenance RUN --export-start DIR``) to begin
        from, checked against the recorded hash; default: the model the config builds or names,
        pinned to the recorded hash (a mismatch is a :class:`~rllab.errors.ConfigError` naming both).
    """
    result = Path(result)
    cfg_path = result / CONFIG_FILE
    if not cfg_path.is_file():
        from rllab.training.export import inside_run_hint

        raise RllabError(f"{result} is not a run directory (no {CONFIG_FILE}){inside_run_hint(result) or '; for a suite result give --cell NAME[/SEED]'}")
    recorded = provenance.read(result)
    recorded_metrics = read_metrics(result / METRICS_FILE)
    rec_start = (recorded.get("hashes") or {}).get("start") or {}
    pairs: list[tuple[str, Any]] = []
    if rec_start.get("sha256"):
        pairs.append(("model.sha256", rec_start["sha256"]))
    start_path = None
    if start is not None:
        start_path = Path(start).expanduser()
        provenance.check_start(start_path, rec_start.get("sha256"), setting="--start")
        if rec_start.get("kind") == "model.path":
            pairs.append(("model.path", str(start_path)))
    lab = lab or Lab()
    data = tomllib.loads(cfg_path.read_text(encoding="utf-8"))
    data["loggers"] = ["jsonl"]  # the compared file; nothing is sent to a tracker again
    data["plugins"] = [p if not p.endswith(".py") or Path(p).is_absolute() else str(result / p) for p in data.get("plugins", ())]
    cfg = load_config(data, pairs, lab=lab)
    out = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="rllab-reproduce-"))
    threads = ((recorded.get("machine") or {}).get("torch") or {}).get("threads")
    usable = threads if isinstance(threads, int) and 0 < threads <= (os.cpu_count() or threads) else None
    with _private_cache(start_path, rec_start), _torch_threads(usable):
        run_experiment(cfg, lab=lab, run_dir=out, progress=progress, overwrite=False)
    fields = provenance.differences(recorded, provenance.read(out))
    for resume in recorded.get("resumes", ()):  # the recorded run went on elsewhere after a resume
        fields += [(f"resumed at step {resume['step']}: {k}", a, b) for k, (a, b) in resume["differences"].items()]
    reproduced = read_metrics(out / METRICS_FILE)
    if not fields:
        first, n = first_difference(recorded_metrics, reproduced)
        return Outcome(IDENTICAL if first is None else DIFFERENT, out, fields, first, None, n)
    first, n = first_difference(recorded_metrics, reproduced)
    start_eval = None
    if not any(f[0] in ("hashes.start", "hashes.config", "hashes.data") or f[0].startswith("seeds.") for f in fields):
        at_start, _ = first_difference(recorded_metrics, reproduced, steps=[0])
        start_eval = at_start is None
    return Outcome(PROVENANCE_DIFFERS, out, fields, first, start_eval, n)

