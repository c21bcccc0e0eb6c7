"""The README's data-set commands, on the example files under examples/data, as short CPU jobs
on the locally built chat model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from rllab.config import load_config
from rllab.training.trainer import Trainer

from ..tiny import TINY, overrides

pytest.importorskip("datasets")
pytest.importorskip("math_verify")

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def _readme_command(path: str) -> list[str]:
    """The overrides of the README's `rllab run` line that reads ``path``."""
    line = next(ln for ln in README.splitlines() if ln.startswith("rllab run task=dataset") and path in ln)
    return line.split()[2:]


@pytest.mark.parametrize("path", ["examples/data/sums_trl.jsonl", "examples/data/sums_verl.parquet"])
def test_the_readme_command_trains_on_the_example_file(tmp_path, monkeypatch, path):
    monkeypatch.chdir(ROOT)
    args = _readme_command(path)
    assert "model.tiny.tokenizer=chat" in args
    cfg = load_config(None, [*args, *overrides(TINY), "model.warm_start.steps=10", "train.steps=1", "rollout.max_new_tokens=4"])
    tr = Trainer(cfg, run_dir=tmp_path, progress=False)
    try:
        ex = tr.task.eval_examples()[0]
        assert isinstance(ex.prompt, tuple) and re.fullmatch(r"What is \d+\+\d+\?", ex.prompt[0]["content"])
        assert tr.task.rewards.names == ("math_verify",)
        assert tr.task.reward(ex, ex.answer) == 1.0
        m = tr.train_step()
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)) and "rollout/reward" in m
    finally:
        tr.close()


def test_the_readme_reward_function_is_trl_s_example_and_works_unchanged(tmp_path, monkeypatch):
    code = re.search(r"```python\n# rewards.py[^\n]*\n(.*?)```", README, re.S).group(1)
    (tmp_path / "rewards.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    rows = ROOT / "examples/data/sums_trl.jsonl"
    cfg = load_config(None, ["task=dataset", f"task.path={json.dumps(str(rows))}", 'task.rewards=["math_verify", "rewards.py:reward_len"]',
                             "task.reward_weights=[1.0, 0.01]"])
    from rllab.lab import Lab

    task = Lab().get("task", "dataset", **cfg.component("task").knobs)()
    ex = task.train[0]
    assert task.reward_components == ("math_verify", "reward_len")
    assert task.reward(ex, ex.answer) == {"math_verify": 1.0, "reward_len": -(20 - len(ex.answer))}
