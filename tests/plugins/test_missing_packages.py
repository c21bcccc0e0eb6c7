"""A component whose optional package is missing is refused in one line, naming the ``pip
install``, before ``rllab run`` creates a run directory: every environment adapter, the tasks that
read with a package (dataset, reasoning_gym), the reward functions that ask a server (remote,
llm_judge: requests) and every tracker's logger (each is asked with its package hidden, whether or not it is installed here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rllab.cli import main

CASES = [
    (["env=gem"], "gem", "the gem environment needs the gem-llm package: pip install 'rllab[gem]'"),
    (["env=openenv", "env.url=http://127.0.0.1:9"], "openenv",
     "the openenv environment needs the openenv-core package: pip install 'rllab[openenv]'"),
    (["env=textarena"], "textarena", "the textarena environment needs the textarena package: pip install 'rllab[envs]'"),
    (["task=reasoning_gym"], "reasoning_gym", "the reasoning_gym task needs the reasoning-gym package: pip install 'rllab[reasoning]'"),
    (["env=reasoning_gym_retry"], "reasoning_gym",
     "the reasoning_gym task needs the reasoning-gym package: pip install 'rllab[reasoning]'"),
    (["task=dataset", "task.path=examples/data/sums_trl.jsonl"], "datasets",
     "the dataset task reads files through the datasets package: pip install 'rllab[data]'"),
    *[(["task=dataset", "task.path=examples/data/sums_trl.jsonl", f"task.rewards={rewards}",
        f'task.reward_knobs={{"{name}": {{"url": "http://127.0.0.1:9/score"}}}}'], "requests",
       "the remote and llm_judge rewards need the requests package, which is not installed: pip install 'rllab[remote]'")
      for name, rewards in (("remote", "remote"), ("llm_judge", '["exact", "llm_judge"]'), ("remote_rm", "remote_rm"))],
    *[([f'loggers=["jsonl", "{name}"]'], name,
       f"the '{name}' logger needs the {name} package, which is not installed: pip install 'rllab[{name}]' "
       f"(or remove '{name}' from loggers)") for name in ("wandb", "mlflow", "trackio", "tensorboard")],
]


@pytest.mark.parametrize("settings, module, says", CASES, ids=[c[0][2] if len(c[0]) > 2 else c[0][0] for c in CASES])
def test_a_missing_package_is_one_line_before_any_run_directory(tmp_path, monkeypatch, capsys, settings, module, says):
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == module else find(name, *a, **k))
    run_dir = tmp_path / "run"
    assert main(["run", *settings, "--steps", "1", "--run-dir", str(run_dir)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: {says}"  # one line, nothing after it
    assert not run_dir.exists() and not list(tmp_path.iterdir())



PLUGIN = '''
import rllab
from rllab_loggers import jsonl, JsonlConfig


def my_logger(*, config, run_dir):
    return jsonl(config=config, run_dir=run_dir)


my_logger.check_installed = {check}


@rllab.hookimpl
def register_loggers(register):
    register("my_logger", my_logger, config=JsonlConfig)
'''


@pytest.mark.parametrize("check, says", [
    ("lambda: (_ for _ in ()).throw(rllab.MissingExtraError(\"my_logger needs mypkg: pip install mypkg\"))",
     "error: my_logger needs mypkg: pip install mypkg"),
    ("'mypkg'", "error: logger 'my_logger': its check_installed is 'mypkg', not a function to call"),
])
def test_a_plugins_own_component_declares_its_package_alike(tmp_path, capsys, check, says):
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(PLUGIN.format(check=check))
    run_dir = tmp_path / "run"
    assert main(["run", "--plugin", str(plugin), 'loggers=["my_logger"]', "--steps", "1", "--run-dir", str(run_dir)]) == 1
    assert capsys.readouterr().err.strip().startswith(says)
    assert not run_dir.exists()


NEEDS_PLUGIN = '''
import rllab
from rllab_tasks.tasks.dataset import DatasetConfig, dataset


def my_dataset(*, config):
    return dataset(config=config)


my_dataset.needs = {needs}


def my_reward(*, prompts, completions, config, **columns):
    return [0.0] * len(completions)


my_reward.check_installed = lambda: (_ for _ in ()).throw(rllab.MissingExtraError("my_reward needs mypkg: pip install mypkg"))


@rllab.hookimpl
def register_tasks(register):
    register("my_dataset", my_dataset, config=DatasetConfig)


@rllab.hookimpl
def register_reward_functions(register):
    register("my_reward", my_reward)
'''


@pytest.mark.parametrize("needs, says", [
    ("lambda config: [('reward_function', name) for name in config.rewards]", "error: my_reward needs mypkg: pip install mypkg"),
    ("'my_reward'", "error: task 'my_dataset': its needs is 'my_reward', not a function to call"),
    ("lambda config: 'my_reward'", "error: task 'my_dataset': its needs gave 'm', not a (kind, name) pair"),
    ("lambda config: [('reward_fn', 'my_reward')]", "error: unknown component kind 'reward_fn'"),
])
def test_a_component_declares_the_components_its_config_uses(tmp_path, capsys, needs, says):
    """A task's ``needs`` names the registered components its config uses (here a reward function),
    whose ``check_installed`` is then asked before the run creates anything."""
    plugin = tmp_path / "needs_plugin.py"
    plugin.write_text(NEEDS_PLUGIN.format(needs=needs))
    run_dir = tmp_path / "run"
    data = Path(__file__).resolve().parents[2] / "examples" / "data" / "sums_trl.jsonl"
    args = ["run", "--plugin", str(plugin), "task=my_dataset", f"task.path={data}", 'task.rewards=["my_reward"]',
            "--steps", "1", "--run-dir", str(run_dir)]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(says), err
    assert not run_dir.exists()
