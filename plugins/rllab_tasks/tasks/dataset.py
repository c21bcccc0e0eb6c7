"""``dataset``: prompts from a local data set, scored by reward functions.

Reads JSON lines, JSON, Parquet, CSV or a ``save_to_disk`` directory through ``datasets``
(:mod:`rllab_tasks.tasks.datafiles`; nothing from a hub) in either of the two formats users have:

``trl``   ``prompt`` a string or a list of ``{"role", "content"}`` messages; every other column
          is passed to the reward functions (TRL's ``**kwargs``). The reference answer is the
          ``answer`` column (``answer_column`` to change it) when there is one.
``verl``  verl's RL parquet: ``data_source``, ``prompt`` (messages), ``reward_model``
          (``{"ground_truth": ...}``) and ``extra_info``; the reference answer is
          ``reward_model.ground_truth``. ``auto`` picks ``verl`` when the data has a
          ``reward_model`` column.

Rewards: ``rewards`` names reward functions (registered names, ``module:function`` or
``path.py:function``, in TRL's or verl's signature; see :mod:`rllab.rollout.rewards`), weighted by
``reward_weights``; two or more become the task's reward components (``gdpo``,
``normalize_then_sum``). Default: ``math_verify`` for verl data, ``exact`` otherwise. With
several, accuracy is the first function's value ≥ 1 (``correct_component`` names another), never
the weighted sum.

Splits: ``eval_path`` (a second file), else a ``split`` column (``train`` / ``eval``, ``test``,
``validation``), else the ``test``/``validation`` split of a saved ``DatasetDict``, else a held-out
``eval_fraction`` of the rows, shuffled by ``seed``. Training prompts are drawn uniformly with
replacement. The warm start trains on the ``demonstration`` column, else on the answer; a row
with neither refuses the warm start with a message saying what to do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs
import torch

import rllab
from rllab.rollout.rewards import RewardSet, reward_names
from rllab.rollout.accuracy import correct_component
from rllab.types import Example

from .datafiles import EVAL_SPLITS, column, installed, parse_prompt, read_rows, text_value
from ..rewards import SHAPING

FORMATS = ("auto", "trl", "verl")
DEFAULT_REWARDS = {"trl": ("exact",), "verl": ("math_verify",)}
ANSWER_REWARDS = ("exact", "contains", "numeric", "math_verify", "math")
"""Built-in reward functions that compare a completion with the reference answer."""


def _refs(value) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _json_object(inst, attribute, value):
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"{attribute.name} = {value!r} is not JSON: {e}") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise ValueError(f"{attribute.name} = {value!r} must be a JSON object of objects (name -> knobs)")


@attrs.frozen
class DatasetConfig:
    """Knobs of the dataset task."""

    path: str = rllab.knob(help="a .jsonl/.json/.parquet/.csv file or a save_to_disk directory (required)")
    format: str = rllab.knob("auto", help="'trl', 'verl', or 'auto' (verl when there is a reward_model column)", choices=FORMATS)
    rewards: str | tuple[str, ...] = rllab.knob(
        (), help="reward functions: registered names, module:function or path.py:function; "
        "empty: math_verify for verl data, exact otherwise",
    )
    reward_weights: tuple[float, ...] | None = rllab.knob(None, help="one weight per reward function (TRL's reward_weights); None: all 1")
    correct_component: str | None = rllab.knob(
        None, help="with several reward functions, the one whose value ≥ 1 means a correct answer (rollout/accuracy, "
        "eval/accuracy); None: the first. Accuracy never comes from the weighted sum",
    )
    reward_knobs: str = rllab.knob(
        "{}", help='knobs of registered reward functions, as a JSON object by name: \'{"format": {"pattern": "<a>.*</a>"}}\'',
        validator=_json_object,
    )
    prompt_column: str = rllab.knob("prompt", help="the prompt: a string or a list of {role, content} messages")
    answer_column: str | None = rllab.knob(
        None, help="the reference answer (dotted names read nested objects); None: reward_model.ground_truth for "
        "verl data, 'answer' when the data has it"
    )
    demonstration_column: str = rllab.knob("demonstration", help="a correct completion for the warm start (optional column)")
    split_column: str = rllab.knob("split", help="rows marked train / eval (test, validation) when the data has this column")
    eval_path: str | None = rllab.knob(None, help="a separate evaluation file (then every row of path trains)")
    eval_fraction: float = rllab.knob(0.1, help="share of rows held out when there is no split column or eval_path", gt=0.0, lt=1.0)
    eval_size: int = rllab.knob(1000, help="at most this many held-out rows", ge=1)
    seed: int = rllab.knob(0, help="shuffles the rows before the held-out fraction is cut")


def _name_it(row: dict, knob: str) -> str:
    """How to name the column instead: the knob, and the row's columns it could be."""
    guess = next((k for k in row if k.lower() in {"prompt_column": PROMPT_NAMES, "answer_column": ANSWER_NAMES}.get(knob, ())), None)
    return f"; name the column with task.{knob}" + (f" (task.{knob}={guess}?)" if guess else "")


PROMPT_NAMES = ("prompt", "question", "problem", "query", "input", "instruction", "messages", "text")
ANSWER_NAMES = ("answer", "solution", "target", "output", "label", "ground_truth", "response")


def dataset_components(config: DatasetConfig) -> tuple[str, ...]:
    """The reward components a config declares: the function names with two or more, else none."""
    refs = _refs(config.rewards)
    return reward_names(refs) if len(refs) >= 2 else ()


class DatasetTask(rllab.SingleTurn):
    """Prompts from a local data set, scored by reward functions (see the module docstring)."""

    name = "dataset"

    def __init__(self, config: DatasetConfig, *, lab: Any = None):
        self.config = config
        who = f"task {self.name!r}"
        tables = read_rows(config.path, who=who)
        first = next(iter(tables.values()), [])
        fmt = config.format
        if fmt == "auto":
            fmt = "verl" if first and "reward_model" in first[0] else "trl"
        self.format = fmt
        answer_col = config.answer_column or ("reward_model.ground_truth" if fmt == "verl" else "answer")
        required = config.answer_column is not None or fmt == "verl"
        src = Path(config.path).expanduser()
        self.train: list[Example] = []
        self.eval: list[Example] = []
        if config.eval_path is not None:
            self.train = [self._example(r, i, src, answer_col, required) for split in tables.values() for i, r in enumerate(split)]
            marked = next((e for e in self.train if e.meta["columns"].get(config.split_column, "train") not in ("train", None)), None)
            if marked is not None:
                raise ValueError(
                    f"{who}: {marked.meta['row']}, column {config.split_column!r}: "
                    f"{marked.meta['columns'][config.split_column]!r} in the training file while eval_path is set"
                )
            evals = read_rows(config.eval_path, who=f"{who}: eval_path")
            esrc = Path(config.eval_path).expanduser()
            self.eval = [self._example(r, i, esrc, answer_col, required) for split in evals.values() for i, r in enumerate(split)]
        elif len(tables) > 1:
            names = sorted(tables)
            for name in names:
                rows = [self._example(r, i, src, answer_col, required, split=name) for i, r in enumerate(tables[name])]
                (self.eval if name in EVAL_SPLITS else self.train).extend(rows)
        else:
            rows = [self._example(r, i, src, answer_col, required) for i, r in enumerate(first)]
            if first and config.split_column in first[0]:
                for ex in rows:
                    (self.eval if self._is_eval(ex) else self.train).append(ex)
            else:
                order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(config.seed)).tolist()
                k = min(len(rows) - 1, max(1, math.ceil(config.eval_fraction * len(rows))))
                self.eval = [rows[i] for i in order[:k]]
                self.train = [rows[i] for i in order[k:]]
        for split, rows in (("training", self.train), ("evaluation", self.eval)):
            if not rows:
                raise ValueError(
                    f"{who}: {src} has no {split} rows ({len(self.train)} training, {len(self.eval)} evaluation); "
                    f"{self._split_fix(split, tables, first)}"
                )
        self.eval = self.eval[: config.eval_size]
        self.has_answer = all(e.meta["ground_truth"] is not None for e in self.train + self.eval)
        refs = _refs(config.rewards) or DEFAULT_REWARDS[fmt]
        needs = [r for r in refs if r in ANSWER_REWARDS]
        if needs and not self.has_answer:
            missing = next(e for e in self.train + self.eval if e.meta["ground_truth"] is None)
            raise ValueError(
                f"{who}: {missing.meta['row']} has no {answer_col!r} column for the reward {needs[0]!r}"
                f"{' (the default)' if not config.rewards else ''}, which compares with the answer; name the answer "
                f"column (task.answer_column) or other reward functions (task.rewards)"
            )
        self.rewards = RewardSet.load(refs, config.reward_weights, lab=lab, who=who, knobs=json.loads(config.reward_knobs))
        if len(refs) >= 2:
            self.reward_components = self.rewards.names
            self.reward_weights = self.rewards.weights
        if config.correct_component is not None and tuple(self.rewards.names) != (config.correct_component,):
            self.correct_component = config.correct_component
        counted = correct_component(self, who=who)  # refuses a name that is not one of the components, listing them
        if counted in SHAPING:
            raise rllab.ConfigError(
                f"{who}: accuracy would count reward component {counted!r} ≥ 1, which never scores above 0 (a shaping "
                f"term): put the function that checks the answer first in task.rewards, or name it with "
                f"task.correct_component (one of {', '.join(map(repr, self.rewards.names))})", key="correct_component",
            )

    def _split_fix(self, split: str, tables: dict, first: list) -> str:
        """What to do about an empty training or evaluation split, given how the rows were split."""
        c = self.config
        if c.eval_path is not None:
            return "every row of path trains and every row of eval_path is held out"
        if len(tables) > 1:
            return (f"its splits are {', '.join(sorted(tables))}: evaluation reads {', '.join(EVAL_SPLITS)}, training the "
                    f"others; or give task.eval_path")
        if first and c.split_column in first[0]:
            return (f"its {c.split_column!r} column marks the rows; mark some {'train' if split == 'training' else 'eval'}, "
                    f"or give task.eval_path")
        return "a data set needs at least two rows (one to train on, one held out), or give task.eval_path"

    def _example(self, row: dict, i: int, src: Path, answer_col: str, required: bool, split: str | None = None) -> Example:
        c = self.config
        where = f"task {self.name!r}: {src} row {i + 1}" + (f" (split {split!r})" if split else "")
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
        found, prompt = column(row, c.prompt_column)
        if found and prompt is None:
            raise ValueError(f"{where}: missing column {c.prompt_column!r} in this row (null or absent); give every row a prompt or remove the row")
        if not found:
            raise ValueError(f"{where}: missing column {c.prompt_column!r} (columns: {', '.join(row)}){_name_it(row, 'prompt_column')}")
        prompt = parse_prompt(prompt, f"{where}, column {c.prompt_column!r}")
        found, answer = column(row, answer_col)
        if found and answer is not None:
            answer = text_value(answer, f"{where}, column {answer_col!r}")
        elif required:
            raise ValueError(f"{where}: missing column {answer_col!r} (columns: {', '.join(row)}){_name_it(row, 'answer_column')}")
        else:
            answer = None
        demo = row.get(c.demonstration_column)
        if demo is not None:
            demo = text_value(demo, f"{where}, column {c.demonstration_column!r}")
        columns = {k: v for k, v in row.items() if k not in (c.prompt_column, c.demonstration_column)}
        meta = {"columns": columns, "row": f"{src.name} row {i + 1}", "ground_truth": answer, "demonstration": demo}
        return Example(prompt=prompt, answer="" if answer is None else answer, meta=meta)

    def _is_eval(self, ex: Example) -> bool:
        value = ex.meta["columns"].get(self.config.split_column)
        if value == "train":
            return False
        if value in EVAL_SPLITS:
            return True
        raise ValueError(
            f"task {self.name!r}: {ex.meta['row']}, column {self.config.split_column!r}: expected 'train' or one of "
            f"{', '.join(EVAL_SPLITS)}, got {value!r}"
        )

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        """``n`` training rows drawn uniformly with replacement using ``rng``."""
        idx = torch.randint(0, len(self.train), (n,), generator=rng).tolist()
        return [self.train[i] for i in idx]

    def eval_examples(self) -> list[Example]:
        """The held-out rows (at most ``eval_size``), in a fixed order."""
        return list(self.eval)

    def reward_batch(
        self, examples: list[Example], completions: list[str], *, completion_ids: list[list[int]] | None = None
    ) -> list[float | dict[str, float]]:
        """The reward of each (example, completion) pair, each function called once on the batch
        (``completion_ids``, the sampled token ids, reach TRL-style functions as TRL passes them)."""
        return self.rewards.score(
            prompts=[e.prompt for e in examples], completions=list(completions),
            ground_truth=[e.meta["ground_truth"] for e in examples],
            columns=[e.meta["columns"] for e in examples], rows=[e.meta["row"] for e in examples],
            completion_ids=completion_ids,
        )

    def reward(self, example: Example, completion: str) -> float | dict[str, float]:
        return self.reward_batch([example], [completion])[0]

    def demonstration(self, example: Example) -> str:
        """The row's demonstration, else its reference answer; a row with neither is refused."""
        demo = example.meta.get("demonstration")
        if demo is not None:
            return demo
        if example.meta.get("ground_truth") is not None:
            return example.answer
        raise rllab.RllabError(
            f"task {self.name!r}: {example.meta['row']} has no {self.config.demonstration_column!r} column and no answer "
            f"to warm-start the tiny model on; add that column, set model.warm_start.steps = 0, or train a pretrained "
            f"model (model.path = ...)"
        )

    def __repr__(self):
        return f"<task {self.name!r} {self.config!r}>"


def dataset(*, config: DatasetConfig) -> DatasetTask:
    """Prompts from a local data set (JSONL/JSON/Parquet/CSV/save_to_disk; TRL or verl format), scored by reward functions."""
    return DatasetTask(config)


dataset.check_installed = installed


def _needs(config: DatasetConfig) -> list[tuple[str, str]]:
    """The registered reward functions this config's ``rewards`` names (``module:function`` paths
    aside), whose packages a run asks for before it creates anything
    (:func:`rllab.training.parts.check_installed`)."""
    named = (config.rewards,) if isinstance(config.rewards, str) else tuple(config.rewards or ())
    return [("reward_function", name) for name in named if isinstance(name, str) and ":" not in name]


dataset.needs = _needs
