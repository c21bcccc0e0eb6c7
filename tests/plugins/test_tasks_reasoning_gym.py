"""The reasoning_gym task: a procedural data set by name, scored by its own score_answer, offline."""

from __future__ import annotations

import pytest
import torch

import rllab
from rllab.errors import ConfigError

pytest.importorskip("reasoning_gym")

_LAB = rllab.Lab()


def _task(**knobs):
    return _LAB.get("task", "reasoning_gym", **{"eval_size": 20, **knobs})()


def test_a_data_set_by_name_is_scored_by_its_own_scorer():
    task = _task(dataset="leg_counting", options='{"min_animals": 1, "max_animals": 2}')
    ex = task.eval_examples()[0]
    assert "legs" in ex.prompt and ex.answer.isdigit()
    assert task.reward(ex, task.demonstration(ex)) == 1.0 and task.reward(ex, f" {ex.answer}\n") == 1.0
    assert task.reward(ex, str(int(ex.answer) + 1)) == 0.0 and task.reward(ex, "") == 0.0
    chain = _task(dataset="chain_sum")
    ex = chain.eval_examples()[0]
    assert chain.reward(ex, ex.answer) == 1.0


def test_seeds_are_honoured_and_the_splits_are_disjoint():
    a, b, c = _task(), _task(), _task(seed=1)
    assert [e.prompt for e in a.eval] == [e.prompt for e in b.eval] != [e.prompt for e in c.eval]
    draw = lambda t: [e.prompt for e in t.train_examples(16, torch.Generator().manual_seed(5))]  # noqa: E731
    assert draw(a) == draw(b)
    assert {e.prompt for e in a.eval}.isdisjoint(draw(a))


def test_unknown_names_and_bad_options_are_refused():
    with pytest.raises(ValueError, match="unknown data set 'leg_countin'. Did you mean 'leg_counting'"):
        _task(dataset="leg_countin")
    with pytest.raises(ConfigError, match="options = .* is not JSON"):
        _task(options="{min_animals: 2}")
    with pytest.raises(ValueError, match="refused options"):
        _task(options='{"no_such_knob": 2}')


def test_the_readme_commands_configure_the_tasks_they_name():
    import shlex
    from pathlib import Path

    from rllab.config import load_config

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    lines = [ln for ln in readme.splitlines() if ln.startswith("rllab run task=reasoning_gym")]
    assert len(lines) >= 2
    for line in lines:
        cfg = load_config(None, shlex.split(line)[2:] + ["task.eval_size=5"])
        task = _LAB.get("task", "reasoning_gym", **cfg.component("task").knobs)()
        ex = task.eval_examples()[0]
        assert task.reward(ex, ex.answer) == 1.0


# --------------------------------------------------------------------------- the multi-turn environment


def _retry(**knobs):
    from rllab_tasks.environments.reasoning_retry import ReasoningGymRetryConfig, reasoning_gym_retry

    return reasoning_gym_retry(config=ReasoningGymRetryConfig(**{"eval_size": 5, "dataset": "chain_sum", **knobs}))


def test_a_wrong_answer_gets_feedback_and_the_solving_turn_is_rewarded_discounted():
    env = _retry(discount=0.5, max_turns=4)
    ex = env.eval_examples()[0]
    wrong = str(int(ex.answer) + 1)
    episode = env.start(ex)
    steps = [episode.step(t) for t in ["no idea", wrong, f" {ex.answer}\n"]]
    assert [s.observation for s in steps] == ["Incorrect, try again.\n", "Incorrect, try again.\n", None]
    assert [s.reward for s in steps] == [0.0, 0.0, 0.25] and [s.done for s in steps] == [False, False, True]
    assert steps[0].metrics == {"wrong_answers": 1.0}
    assert env.max_turns == 4 and env.solved(ex, 0.25) and not env.solved(ex, 0.0)
    first = env.start(ex).step(ex.answer)
    assert (first.reward, first.done) == (1.0, True)
    assert env.demonstration(ex) == [ex.answer]
    custom = _retry(feedback="No.\n").start(ex).step(wrong)
    assert custom.observation == "No.\n" and not custom.done


def test_the_retry_environment_draws_the_reasoning_gym_tasks_examples_and_checks_its_knobs():
    env, task = _retry(), _task(dataset="chain_sum", eval_size=5)
    assert [e.prompt for e in env.eval_examples()] == [e.prompt for e in task.eval_examples()]
    draw = lambda x: [e.prompt for e in x.train_examples(6, torch.Generator().manual_seed(2))]  # noqa: E731
    assert draw(env) == draw(task)
    with pytest.raises(ValueError, match="unknown data set 'chain_su'"):
        _retry(dataset="chain_su")
    with pytest.raises(ValueError, match="discount = 0.0 is out of range"):
        _retry(discount=0.0)


def test_the_retry_environment_is_registered_and_passes_the_environment_contract():
    from rllab.testing import run_contract

    knobs = {"dataset": "chain_sum", "eval_size": 4}
    assert _LAB.get("environment", "reasoning_gym_retry", **knobs)().max_turns == 3
    assert [(r.check, r.message) for r in run_contract(_LAB, "environment", "reasoning_gym_retry", knobs) if not r.passed] == []
