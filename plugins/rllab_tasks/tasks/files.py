"""``jsonl``: prompts and answers read from a JSON-lines file, and its reward functions.

Each row gives ``row["prompt"]`` (a string, or chat messages: a list of ``{"role", "content"}``
objects rendered with the model's chat template) and ``row["answer"]``; a completion is scored 1.0 or 0.0 by
``exact`` / ``contains`` / ``numeric`` (the ``reward`` knob). Rows are split into training and
evaluation by a salted hash of the prompt (:mod:`rllab_tasks.split`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import attrs
import torch

import rllab
from rllab import note_data_file
from rllab.rollout.chat import check_prompt
from rllab.types import Example

from ..split import eval_fraction_knob, in_eval_split, seed_knob

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def first_number(text: str) -> float | None:
    """The first number written in ``text`` (``-3``, ``2.5``, ``1e3``), or None."""
    m = _NUMBER.search(text)
    if m is None:
        return None
    try:
        return float(m.group())
    except ValueError:
        return None


def reward_exact(answer: str, completion: str, tolerance: float) -> float:
    """1.0 iff the completion, stripped of surrounding whitespace, equals the stripped answer."""
    return 1.0 if completion.strip() == answer.strip() else 0.0


def reward_contains(answer: str, completion: str, tolerance: float) -> float:
    """1.0 iff the stripped answer occurs anywhere in the completion."""
    return 1.0 if answer.strip() in completion else 0.0


def reward_numeric(answer: str, completion: str, tolerance: float) -> float:
    """1.0 iff the first number in the completion is within ``tolerance`` of the answer:
    ``|x − y| ≤ tolerance · max(1, |y|)`` (absolute near zero, relative for large answers)."""
    x, y = first_number(completion), float(answer)
    if x is None or not math.isfinite(x):
        return 0.0
    return 1.0 if abs(x - y) <= tolerance * max(1.0, abs(y)) else 0.0


REWARD_FNS = {"exact": reward_exact, "contains": reward_contains, "numeric": reward_numeric}


@attrs.frozen
class JsonlConfig:
    """Knobs of the jsonl task."""

    path: str = rllab.knob(help='JSONL file with one {"prompt": ..., "answer": ...} object per line (required)')
    reward: str = rllab.knob("exact", help="how a completion is scored", choices=tuple(REWARD_FNS))
    tolerance: float = rllab.knob(1e-6, help="numeric reward: |x − y| ≤ tolerance·max(1, |y|)", ge=0.0)
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = rllab.knob(1_000_000, help="at most this many held-out rows", ge=1)
    eval_path: str | None = rllab.knob(
        None,
        help="a separate JSONL file of held-out rows (same format); when set, every row of path trains and the "
        "held-out rows are this file's, in order (eval_fraction is not used)",
    )
    seed: int = seed_knob()


class JsonlTask(rllab.SingleTurn):
    """Prompts and answers from a JSONL file, scored by a named reward function.

    Each line is an object with a ``prompt`` — a string, or chat messages
    ``[{"role": "user", "content": ...}, ...]`` (roles system/user/assistant/tool) — and a string
    ``answer`` (a number is accepted as the answer and kept as its text). Optional keys:
    ``demonstration`` (used by the warm start instead of the answer) and ``split`` (``"train"`` or ``"eval"``, overriding the hash split);
    every other key lands in ``Example.meta``. Blank lines are skipped.

    With ``eval_path``, the held-out rows come from that file instead of the hash split: every
    row of ``path`` trains, every row of ``eval_path`` is held out (a row whose ``split`` says
    otherwise is an error naming its file and line).
    """

    name = "jsonl"

    def __init__(self, config: JsonlConfig):
        self.config = config
        path = Path(config.path).expanduser()
        if path.is_dir():
            raise ValueError(f"task 'jsonl': path {path} is a directory; give a JSONL file (task=dataset also reads save_to_disk directories)")
        if not path.is_file():
            raise FileNotFoundError(f"task 'jsonl': no such file: {path}")
        if config.reward not in REWARD_FNS:
            raise ValueError(f"task 'jsonl': unknown reward {config.reward!r}; known: {', '.join(REWARD_FNS)}")
        self.reward_fn = REWARD_FNS[config.reward]
        self.train: list[Example] = []
        self.eval: list[Example] = []
        eval_path = None if config.eval_path is None else Path(config.eval_path).expanduser()
        if eval_path is not None and eval_path.is_dir():
            raise ValueError(f"task 'jsonl': eval_path {eval_path} is a directory; give a JSONL file")
        if eval_path is not None and not eval_path.is_file():
            raise FileNotFoundError(f"task 'jsonl': no such file: {eval_path} (eval_path)")
        for ex, split, where in self._rows(path):
            if eval_path is not None:
                if split == "eval":
                    raise ValueError(f"{where}: split 'eval' in the training file while eval_path is set")
                self.train.append(ex)
                continue
            is_eval = split == "eval" if split is not None else in_eval_split(
                ex.prompt, seed=config.seed, eval_fraction=config.eval_fraction
            )
            (self.eval if is_eval else self.train).append(ex)
        if eval_path is not None:
            for ex, split, where in self._rows(eval_path):
                if split == "train":
                    raise ValueError(f"{where}: split 'train' in the eval_path file")
                self.eval.append(ex)
            if not self.eval:
                raise ValueError(f"task 'jsonl': eval_path {eval_path} has no rows")
        if not self.train and (not self.eval or eval_path is not None):
            raise ValueError(f"task 'jsonl': {path} has no rows (it is empty or holds only blank lines); give one JSON object per line")
        if not self.train:
            raise ValueError(
                f"task 'jsonl': {path} has no training rows ({len(self.eval)} eval rows: marked split 'eval' or in the held-out "
                f"share); add rows, mark some split 'train' or lower task.eval_fraction"
            )
        self.eval = self.eval[: config.eval_size]

    def _rows(self, path: Path):
        """(example, split, "task 'jsonl': file:line") for each non-blank line of ``path``."""
        note_data_file(path)  # its contents are hashed into the run's provenance.json
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    ex, split = self._parse(path, lineno, line)
                    yield ex, split, f"task 'jsonl': {path}:{lineno}"

    def _parse(self, path: Path, lineno: int, line: str) -> tuple[Example, str | None]:
        where = f"task 'jsonl': {path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
        for key in ("prompt", "answer"):
            if key not in row:
                raise ValueError(f"{where}: missing key {key!r}")
        prompt, answer = row.pop("prompt"), row.pop("answer")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str):
            raise ValueError(f"{where}: answer must be a string or a number, got {type(answer).__name__}")
        if not isinstance(prompt, (str, list)):
            raise ValueError(f"{where}: prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
        prompt = check_prompt(prompt, where=f"{where}: prompt")
        if self.config.reward == "numeric":
            try:
                float(answer)
            except ValueError:
                raise ValueError(f"{where}: answer {answer!r} is not a number (reward 'numeric')") from None
        split = row.pop("split", None)
        if split not in (None, "train", "eval"):
            raise ValueError(f"{where}: split must be 'train' or 'eval', got {split!r}")
        demo = row.pop("demonstration", None)
        if demo is not None:
            row["demonstration"] = str(demo)
        return Example(prompt=prompt, answer=answer, meta=row), split

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        """``n`` training rows drawn uniformly with replacement using ``rng``."""
        idx = torch.randint(0, len(self.train), (n,), generator=rng).tolist()
        return [self.train[i] for i in idx]

    def eval_examples(self) -> list[Example]:
        """The held-out rows, in file order."""
        return list(self.eval)

    def reward(self, example: Example, completion: str) -> float:
        return self.reward_fn(example.answer, completion, self.config.tolerance)

    def demonstration(self, example: Example) -> str:
        """The row's ``demonstration`` if it has one, else its answer."""
        return example.meta.get("demonstration", example.answer)

    def __repr__(self):
        return f"<task 'jsonl' {self.config!r}>"


def jsonl(*, config: JsonlConfig) -> JsonlTask:
    """Prompt/answer rows from a JSONL file, scored by exact, contains or numeric match."""
    return JsonlTask(config)
