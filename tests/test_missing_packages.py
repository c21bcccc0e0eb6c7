"""Every adapter and extra whose package is missing stops a command with one line naming the
``pip install`` that brings it, never a traceback: the environments (gem, openenv, textarena,
reasoning_gym_retry), the tasks (reasoning_gym, dataset), math-verify, peft and the loggers. The
packages are hidden (``sys.modules[name] = None`` makes ``import name`` fail), so the test runs
whether or not they are installed."""

from __future__ import annotations

import json
import sys

import pytest

import rllab
from rllab.cli import main
from tests.tiny import TINY, overrides

BASE = [*overrides(TINY), "model.warm_start.steps=0", "train.steps=1", "-q"]


def _data(tmp_path) -> str:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(20)))
    return str(path)


CASES = [
    # (id, hidden modules, overrides (DATA: a small data file), the extra the message names)
    ("gem", ["gem"], ["env=gem"], "gem"),
    ("openenv", ["openenv"], ["env=openenv", "env.url=http://127.0.0.1:9"], "openenv"),
    ("textarena", ["textarena"], ["env=textarena"], "envs"),
    ("reasoning_gym_retry", ["reasoning_gym"], ["env=reasoning_gym_retry"], "reasoning"),
    ("reasoning_gym", ["reasoning_gym"], ["task=reasoning_gym"], "reasoning"),
    ("dataset", ["datasets"], ["task=dataset", "task.path=DATA"], "data"),
    ("math_verify", ["math_verify"], ["task=dataset", "task.path=DATA", 'task.rewards="math_verify"'], "math"),
    # not a sample's failure to skip: every sample would fail alike
    ("math_verify_skip", ["math_verify"], ["task=dataset", "task.path=DATA", 'task.rewards="math_verify"', "rollout.reward_errors=skip"], "math"),
    ("remote_reward", ["requests"], ["task=dataset", "task.path=DATA", 'task.rewards="remote"',
                                     """task.reward_knobs='{"remote": {"url": "http://127.0.0.1:9/score"}}'"""], "remote"),
    ("peft", ["peft"], ["model.lora.r=4"], "lora"),
    ("tensorboard", ["torch.utils.tensorboard"], ['loggers=["tensorboard"]'], "tensorboard"),
    ("wandb", ["wandb"], ['loggers=["wandb"]'], "wandb"),
    ("mlflow", ["mlflow"], ['loggers=["mlflow"]'], "mlflow"),
    ("trackio", ["trackio"], ['loggers=["trackio"]'], "trackio"),
]


@pytest.mark.parametrize("hidden, args, extra", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_missing_package_is_one_line_naming_its_install(model_cache, tmp_path, capsys, monkeypatch, hidden, args, extra):
    for mod in hidden:
        monkeypatch.setitem(sys.modules, mod, None)
    args = [a.replace("DATA", _data(tmp_path)) for a in args]
    rc = main(["run", *BASE, *args, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert f"pip install 'rllab[{extra}]'" in err and "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[0].startswith("error:"), err
    assert all("File \"" not in ln for ln in lines), err
    assert "failed on prompt" not in err and "Fix the reward function" not in err, err  # not blamed on a sample


@pytest.mark.parametrize("name, knobs, extra", [("gem", [], "gem"), ("openenv", ["--knob", "url=http://127.0.0.1:9"], "openenv"),
                                                ("textarena", [], "envs")])
def test_the_contract_check_of_an_environment_without_its_package_says_so_once(capsys, monkeypatch, name, knobs, extra):
    monkeypatch.setitem(sys.modules, {"gem": "gem", "openenv": "openenv", "textarena": "textarena"}[name], None)
    assert main(["check", name, *knobs]) == 1
    err = capsys.readouterr().err
    assert err.count(f"pip install 'rllab[{extra}]'") == 1 and "check(s) failed" not in err, err


def test_the_error_is_both_an_rllab_error_and_an_import_error():
    assert issubclass(rllab.MissingExtraError, rllab.RllabError) and issubclass(rllab.MissingExtraError, ImportError)
