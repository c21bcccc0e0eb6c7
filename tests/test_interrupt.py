"""Ctrl-C during ``rllab run``: exit code 130, the run keeps its last checkpoint, and the console
says how to continue it (``rllab run --resume RUN_DIR``), which then finishes the run."""

from __future__ import annotations

import json

import pytest

import rllab.training.trainer
from rllab.cli import main
from tests.tiny import TINY, overrides


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def test_an_interrupted_run_says_how_to_continue_and_resumes(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    train_step = rllab.training.trainer.Trainer.train_step

    def interrupted_after_two(self):
        if self.step == 2:  # as a Ctrl-C lands in the third step
            raise KeyboardInterrupt
        return train_step(self)

    monkeypatch.setattr(rllab.training.trainer.Trainer, "train_step", interrupted_after_two)
    args = ["run", *overrides({**TINY, "train.checkpoint_every": 1, "train.eval_every": 0}), "--steps", "3", "-q", "--run-dir", str(run)]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and f"{run} keeps its last checkpoint (step_000002)" in err.replace("\n", "")
    assert f"continue it with: rllab run --resume {run}" in err.replace("\n", "")
    assert not (run / "final.json").exists()
    trained = []  # the steps the resumed run starts from: only the third is left
    monkeypatch.setattr(rllab.training.trainer.Trainer, "train_step", lambda self: (trained.append(self.step), train_step(self))[1])
    assert main(["run", "--resume", str(run), "-q"]) == 0
    assert trained == [2]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rollout/reward" in r] == [1, 2, 3]  # step 3 trained once, after the resume
    assert json.loads((run / "final.json").read_text())["steps"] == 3


def test_a_run_interrupted_before_its_first_step_leaves_nothing_to_continue(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(rllab.training.trainer.Trainer, "train_step", interrupted)
    assert main(["run", *overrides(TINY), "--steps", "3", "-q", "--run-dir", str(run)]) == 130
    assert "--resume" not in capsys.readouterr().err and not run.exists()
