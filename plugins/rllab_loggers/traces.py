"""The ``traces`` logger: a few whole samples per step, to read what the model wrote.

``loggers = ["jsonl", { name = "traces", per_step = 4 }]`` appends ``per_step`` samples of every
training step to ``RUN_DIR/traces.jsonl``, one JSON object per sample. The samples are taken
round-robin over the step's groups (one per group in turn, the group and the sample within it
moving on every step), so over a run every group position is seen.

Each evaluation also writes ``per_eval`` of its greedy held-out answers (``"kind": "eval"``; training
samples are ``"kind": "train"``).

Each record holds the step, the group (``group``: the prompt's row index in the batch's groups)
and:

- ``prompt``: the opening prompt's text; ``texts``: each model turn's decoded text;
- ``tokens``: every response-side token as text, ``model``: whether the model sampled it (False on
  an environment's observation tokens), ``turn``: the model turn it belongs to (observations
  count with the turn they answer);
- ``reward``, ``components`` (name -> value, a task with several reward components), ``turns``,
  ``length`` (model tokens), ``finish_reason``, ``staleness`` (weight versions behind the trainer,
  asynchronous rollouts; null when synchronous) and ``token_versions`` (partial rollouts);
- ``advantages``: the advantage of each token the update trains on (0 elsewhere, and everywhere for
  an algorithm without advantages, as ``online_dpo``);
- ``sampler_logprobs`` and ``trainer_logprobs``: the log-probs of each sampled token under the
  sampler and under the trainer's policy before the update, and ``mismatch``: per model turn, the
  sum over its tokens of sampler − trainer. On an on-policy step (one minibatch, no correction
  reading them) the trainer's log-probs are those of the update's own first forward, before its
  optimizer step (no forward of their own). ``trainer_logprobs`` and ``mismatch`` are null for an
  algorithm that gives no trainer log-probs (``online_dpo``), and on a step whose forwards reached
  some rows only after an optimizer step (bypass mode with several minibatches).

``rllab traces RUN`` reads the file (:mod:`rllab_loggers.traces_view`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs

import rllab

FILENAME = "traces.jsonl"


def _positive(inst, attribute, value) -> None:
    if value < 1:
        raise ValueError(f"traces: {attribute.name} = {value!r} must be at least 1 (samples written per step)")


def inside_run_dir(inst, attribute, value) -> None:
    """A knob naming a file inside the run directory: a relative path that stays there."""
    from pathlib import PurePath

    p = PurePath(value)
    if not value.strip() or value.endswith(("/", "\\")) or p.is_absolute() or ".." in p.parts:
        raise ValueError(f"{attribute.name} = {value!r} must name a file inside the run directory (a relative path such as "
                         f"'samples.jsonl' or 'logs/samples.jsonl')")


@attrs.frozen
class TracesConfig:
    """Knobs of the traces logger."""

    per_step: int = rllab.knob(4, help="samples written per training step (round-robin over the step's groups)", validator=_positive)
    per_eval: int = rllab.knob(
        8, help="greedy held-out answers written per evaluation (kind 'eval'; a different slice of the held-out set each "
        "time); 0: none", ge=0,
    )
    filename: str = rllab.knob(FILENAME, help="file inside the run directory", validator=inside_run_dir)


def pick_rows(groups: list[list[int]], n: int, step: int) -> list[int]:
    """``n`` rows of a batch whose groups are ``groups`` (lists of row indices): group ``(step·n + i)
    mod G`` for the i-th pick, and within it the sample ``((step·n + i) div G) mod size``, so
    consecutive steps go on where the last stopped and every sample position comes round."""
    if not groups:
        return []
    G, out = len(groups), []
    for i in range(min(n, sum(len(g) for g in groups))):
        k = (step - 1) * n + i
        rows = groups[k % G]
        row = rows[(k // G) % len(rows)]
        if row in out:  # a small batch: fewer groups than picks; take the next free row
            row = next(r for g in groups for r in g if r not in out)
        out.append(row)
    return out


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def record(step: int, group: int, episode: Any, row: int, batch: Any, advantages: Any, trainer_log_prob: Any,
           tokenizer: Any, component_names: tuple[str, ...]) -> dict:
    """The trace of row ``row`` of a step (its episode ``episode``), as a JSON-ready dict."""
    c = episode.completion
    n = len(c.token_ids)
    model = list(c.model_mask) if c.model_mask is not None else [True] * n
    T = batch.response_mask.shape[1]
    cols = min(n, T)
    turn, turns = [], 0
    for i, m in enumerate(model):  # a turn starts at each model token after an observation (or at the start)
        if m and (i == 0 or not model[i - 1]):
            turns += 1
        turn.append(max(turns, 1))
    sampler = [float(x) for x in c.log_probs]
    trainer = None
    if trainer_log_prob is not None:
        trainer = [float(x) for x in trainer_log_prob[row, :cols].detach().float().cpu()] + [0.0] * (n - cols)
    mismatch = None
    if trainer is not None:
        mismatch = [0.0] * max(turns, 1)
        for i in range(n):
            if model[i]:
                mismatch[turn[i] - 1] += sampler[i] - trainer[i]
    adv = [0.0] * n if advantages is None else (
        [float(x) for x in (advantages[row, :cols] * batch.response_mask[row, :cols]).detach().float().cpu()] + [0.0] * (n - cols))
    staleness = getattr(episode, "staleness", None)
    return {
        "kind": "train", "step": int(step), "group": int(group), "prompt": tokenizer.decode(list(c.prompt_ids), skip_special_tokens=True),
        "texts": list(episode.texts), "tokens": [tokenizer.decode([t]) for t in c.token_ids], "model": model, "turn": turn,
        "reward": _finite(float(episode.reward)),
        "components": {k: _finite(float(v)) for k, v in zip(component_names, episode.score)},
        "turns": int(episode.turns), "length": int(sum(model)), "finish_reason": c.finish_reason,
        "staleness": None if staleness is None else int(staleness),
        "token_versions": list(episode.token_versions) if episode.token_versions is not None else None,
        "advantages": [round(a, 6) for a in adv],
        "sampler_logprobs": [round(x, 6) for x in sampler],
        "trainer_logprobs": None if trainer is None else [round(x, 6) for x in trainer],
        "mismatch": None if mismatch is None else [round(m, 6) for m in mismatch],
    }


def eval_record(step: int, index: int, episode: Any, tokenizer: Any) -> dict:
    """A greedy held-out answer as a trace (kind ``eval``; ``group`` is its index in the held-out
    set): no advantages (0) and no trainer log-probs (null)."""
    c = episode.completion
    n = len(c.token_ids)
    model = list(c.model_mask) if c.model_mask is not None else [True] * n
    turn, turns = [], 0
    for i, m in enumerate(model):
        if m and (i == 0 or not model[i - 1]):
            turns += 1
        turn.append(max(turns, 1))
    return {
        "kind": "eval", "step": int(step), "group": int(index), "prompt": tokenizer.decode(list(c.prompt_ids), skip_special_tokens=True),
        "texts": list(episode.texts), "tokens": [tokenizer.decode([t]) for t in c.token_ids], "model": model, "turn": turn,
        "reward": _finite(float(episode.reward)), "components": {}, "turns": int(episode.turns), "length": int(sum(model)),
        "finish_reason": c.finish_reason, "staleness": None, "token_versions": None, "advantages": [0.0] * n,
        "sampler_logprobs": [round(float(x), 6) for x in c.log_probs], "trainer_logprobs": None, "mismatch": None,
    }


def step_records(*, step, episodes, batch, advantages, trainer_log_prob, tokenizer, n: int) -> list[dict]:
    """The traces of ``n`` rows of a step, picked round-robin over its groups (:func:`pick_rows`)."""
    order: dict[int, list[int]] = {}
    for row, g in enumerate(batch.index.tolist()):
        order.setdefault(g, []).append(row)
    groups = [order[g] for g in sorted(order)]
    group_of = {r: i for i, rows in enumerate(groups) for r in rows}
    names = tuple(batch.reward_component_names)
    return [record(step, group_of[row], episodes[row], row, batch, advantages, trainer_log_prob, tokenizer, names)
            for row in pick_rows(groups, n, step)]


TABLE_COLUMNS = ("step", "group", "prompt", "completion", "reward", "advantage", "length", "turns", "finish_reason",
                 "staleness", "mismatch")
"""The columns of a trace as a tracker's table row (:func:`table_row`)."""


def table_row(rec: dict) -> list:
    """One trace as a flat row of :data:`TABLE_COLUMNS`: the completion is the model turns' text joined
    by newlines, the advantage the mean over the sample's trained tokens, the mismatch summed over turns."""
    trained = [a for a, m in zip(rec["advantages"], rec["model"]) if m and a != 0.0]
    return [rec["step"], rec["group"], rec["prompt"], "\n".join(rec["texts"]), rec["reward"],
            sum(trained) / len(trained) if trained else 0.0, rec["length"], rec["turns"], rec["finish_reason"],
            rec["staleness"], None if rec["mismatch"] is None else sum(rec["mismatch"])]


class TracesLogger:
    """Writes ``per_step`` samples of each step to ``path`` (JSON lines, flushed per step); metrics
    rows (``log``) are not its business."""

    def __init__(self, path: Path, per_step: int, per_eval: int = 0):
        self.path, self.per_step, self.per_eval = path, per_step, per_eval
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict) -> None:
        pass

    def samples(self, *, step, episodes, batch, advantages, trainer_log_prob, tokenizer) -> None:
        for rec in step_records(step=step, episodes=episodes, batch=batch, advantages=advantages,
                                trainer_log_prob=trainer_log_prob, tokenizer=tokenizer, n=self.per_step):
            self._f.write(json.dumps(rec) + "\n")
        self._f.flush()

    def eval_samples(self, *, step, episodes, tokenizer) -> None:
        """``per_eval`` greedy answers of an evaluation: the slice starting at ``step · per_eval`` (mod
        the set's size), so successive evaluations show different problems."""
        n = min(self.per_eval, len(episodes))
        if not n:
            return
        start = (step * self.per_eval) % len(episodes)
        for j in range(n):
            k = (start + j) % len(episodes)
            self._f.write(json.dumps(eval_record(step, k, episodes[k], tokenizer)) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def traces(*, config: TracesConfig, run_dir) -> TracesLogger:
    """Per-sample traces of each step in ``RUN_DIR/traces.jsonl`` (read them with ``rllab traces RUN``)."""
    return TracesLogger(Path(run_dir) / config.filename, config.per_step, config.per_eval)


def truncate_traces(*, run_dir, config: TracesConfig, step: int) -> None:
    """Drop the samples of steps after ``step`` (a run resumed from that step's checkpoint), and a
    last line cut off by a killed run (with a warning naming it)."""
    path = Path(run_dir) / config.filename
    if path.is_file():
        keep = [json.dumps(r) for r in read_json_lines(path, on_cut=warn_cut) if r["step"] <= step]
        path.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")


class BadLineError(ValueError):
    """A line of a JSON-lines file that is not JSON, before its last line; ``lineno`` counts from 1."""

    def __init__(self, path: Path, lineno: int, error: Exception):
        super().__init__(f"{str(path)!r} line {lineno} is not JSON ({error})")
        self.path, self.lineno, self.error = path, lineno, error


def warn_cut(path: Path, lineno: int) -> None:
    """The default report of a cut-off last line: a warning naming the file and the line."""
    import warnings

    warnings.warn(f"{path}: line {lineno}, the last, is cut off (a run stopped while writing it, or is writing it now); read the lines before it",
                  stacklevel=3)


def read_json_lines(path: Path, *, on_cut=warn_cut) -> list[Any]:
    """The objects of a JSON-lines file (blank lines skipped). A last line that is not whole JSON (a
    run killed while writing it: no newline ends it) is left out and reported with ``on_cut(path,
    lineno)``; any other bad line, a whole last line included, raises :class:`BadLineError` naming it."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    numbered = [(i, ln) for i, ln in enumerate(lines, 1) if ln.strip()]
    out = []
    for k, (i, ln) in enumerate(numbered):
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError as e:
            if k == len(numbered) - 1 and i == len(lines):  # no newline after it: a write cut short
                if on_cut is not None:
                    on_cut(Path(path), i)
                break
            raise BadLineError(Path(path), i, e) from None
    return out


def read_traces(path: Path, *, on_cut=warn_cut) -> list[dict]:
    """The records of a traces file (a cut-off last line left out: :func:`read_json_lines`)."""
    return read_json_lines(path, on_cut=on_cut)
