"""The built-in environments (calculator, search, guess): their rules, played with scripted turns."""

from __future__ import annotations

import attrs
import pytest
import torch

from rllab.rollout.environment import Environment, Episode, Step
from rllab.rollout.tools import run_step
from rllab_tasks.environments.tools import (
    CalculatorConfig, CalculatorEnvironment, GuessConfig, GuessEnvironment, SearchConfig, SearchEnvironment, calculate,
)

ENVS = {
    "calculator": (CalculatorEnvironment, CalculatorConfig),
    "search": (SearchEnvironment, SearchConfig),
    "guess": (GuessEnvironment, GuessConfig),
}


def make(name, **knobs):
    factory, config = ENVS[name]
    return factory(config=config(**knobs))


def play(env, example, turns):
    """Steps of an episode fed ``turns`` (stops at done; at most env.max_turns turns)."""
    episode = env.start(example)
    assert isinstance(episode, Episode)
    steps = []
    for text in turns[: env.max_turns]:
        steps.append(run_step(episode.step(text)))
        if steps[-1].done:
            break
    return steps


def total(steps):
    return sum(s.reward for s in steps)


@pytest.mark.parametrize("name", sorted(ENVS))
def test_each_environment_follows_the_protocol_and_is_deterministic_given_a_seed(name):
    env = make(name)
    assert isinstance(env, Environment)
    a = env.train_examples(32, torch.Generator().manual_seed(7))
    b = env.train_examples(32, torch.Generator().manual_seed(7))
    c = env.train_examples(32, torch.Generator().manual_seed(8))
    assert a == b and [e.meta for e in a] == [e.meta for e in b]
    assert [e.meta for e in a] != [e.meta for e in c]
    assert make(name).eval_examples() == env.eval_examples() and len(env.eval_examples()) >= 16


@pytest.mark.parametrize("name", sorted(ENVS))
def test_demonstration_episodes_solve_their_example(name):
    env = make(name)
    for ex in env.train_examples(50, torch.Generator().manual_seed(0)) + env.eval_examples()[:50]:
        turns = env.demonstration(ex)
        assert len(turns) <= env.max_turns
        steps = play(env, ex, turns)
        assert len(steps) == len(turns) and steps[-1].done and all(not s.done for s in steps[:-1])
        assert env.solved(ex, total(steps)), (ex, turns, steps)


@pytest.mark.parametrize("name", ["calculator", "search"])
def test_tool_environments_hold_out_prompts_by_hash(name):
    env = make(name)
    held_out = {e.prompt for e in env.eval_examples()}
    train = {e.prompt for e in env.train_examples(2000, torch.Generator().manual_seed(1))}
    assert len(held_out) == 200 and not held_out & train


# --------------------------------------------------------------------------- calculator


def test_calculator_calls_the_tool_then_scores_the_answer():
    env = make("calculator")
    ex = env.train_examples(1, torch.Generator().manual_seed(3))[0]
    a, b = ex.meta["a"], ex.meta["b"]
    assert ex.prompt == f"{a}*{b}=" and ex.answer == str(a * b) and 100 <= a < 1000 and 10 <= b < 100
    assert env.demonstration(ex) == [f"<calc({a}*{b})>", str(a * b)]
    steps = play(env, ex, [f"<calc({a}*{b})>", f" {a * b} "])
    assert steps[0] == Step(observation=f"{a * b}\n", role="tool", metrics={"tool_calls": 1, "tool_errors": 0, "parse_failures": 0})
    assert steps[1] == Step(reward=1.0, done=True)
    assert play(env, ex, [str(a * b + 1)]) == [Step(reward=0.0, done=True)]  # answering unaided, wrongly


def test_calculator_answers_errors_and_retries_within_max_turns():
    env = make("calculator", max_turns=3, terse_errors=False)
    ex = env.train_examples(1, torch.Generator().manual_seed(3))[0]
    a, b = ex.meta["a"], ex.meta["b"]
    steps = play(env, ex, ["<calc(12/4)>", "<calc x>", f"<calc({a}*{b})>", str(a * b)])
    assert len(steps) == 3 and not steps[-1].done  # max_turns = 3: the answer never comes
    assert steps[0].observation == "error: calc raised ValueError: cannot evaluate '12/4': integers, + - * and parentheses only\n"
    assert steps[1].observation.startswith("error: malformed tool call") and steps[1].metrics["parse_failures"] == 1
    assert steps[2].observation == f"{a * b}\n"
    hermes = f'<tool_call>{{"name": "calc", "arguments": {{"expression": "{a}*{b}"}}}}</tool_call>'
    assert play(env, ex, [hermes])[0].observation == f"{a * b}\n"
    terse = make("calculator")
    assert [s.observation for s in play(terse, ex, ["<calc(12/4)>"]) + play(terse, ex, ["<calc x>"]) + play(terse, ex, ["<sqrt(4)>"])] == [
        "error: tool failed\n", "error: malformed call\n", "error: unknown tool\n",
    ]
    assert len(play(terse, ex, ["<calc(1)>", "<calc(2)>", "3"])) == 2  # max_turns = 2 by default
    penalised = make("calculator", failed_parse_reward=-1.0)
    assert play(penalised, ex, ["<calc"]) == [Step(reward=-1.0, done=True, metrics={"tool_calls": 0, "tool_errors": 0, "parse_failures": 1})]


def test_the_calculator_control_has_no_tool_and_shows_the_bare_answer():
    env = make("calculator", tool=False, terse_errors=False)
    ex = env.eval_examples()[0]
    assert env.tools == [] and env.demonstration(ex) == [ex.answer]
    (s,) = play(env, ex, [f"<calc({ex.meta['a']}*{ex.meta['b']})>"])
    assert s.observation == "error: unknown tool 'calc' (tools: none)\n" and s.metrics["tool_errors"] == 1


def test_calculate_evaluates_integer_expressions_only():
    assert calculate("123*45") == 5535 and calculate("(2+3)*4-1") == 19
    for bad in ("2**8", "1/2", "abs(1)", "", "-3"):
        with pytest.raises(ValueError, match="cannot evaluate"):
            calculate(bad)


# --------------------------------------------------------------------------- search


def test_search_draws_a_store_per_example_and_find_reads_it():
    env = make("search")
    exs = env.train_examples(200, torch.Generator().manual_seed(5))
    ex = exs[0]
    m = ex.meta
    assert ex.prompt == f"{m['attribute']} of {m['name']}?" and ex.answer == m["store"][f"{m['name']} {m['attribute']}"]
    assert len(m["store"]) == 9 and all(v.isdigit() and len(v) == 3 for v in m["store"].values())
    assert env.demonstration(ex) == [f"<find({m['name']},{m['attribute']})>", ex.answer]
    other = next(k for k in m["store"] if k != f"{m['name']} {m['attribute']}")
    n, a = other.split()
    steps = play(env, ex, [f"<find({n}, {a})>", m["store"][other]])
    assert steps[0].observation == m["store"][other] + "\n"  # a distractor
    assert steps[1] == Step(reward=1.0 if m["store"][other] == ex.answer else 0.0, done=True)
    assert play(env, ex, ["<find(zzzz,pin)>"])[0].observation == "no entry\n"
    # values are drawn per example: the same question has different answers across examples
    by_prompt = {}
    for e in exs + env.train_examples(3000, torch.Generator().manual_seed(6)):
        by_prompt.setdefault(e.prompt, set()).add(e.answer)
    assert any(len(v) > 1 for v in by_prompt.values())


def test_search_lists_its_tool_and_refuses_bad_arguments_as_observations():
    env = make("search", terse_errors=False)
    (t,) = env.tools
    assert t.name == "find" and t.parameter_names == ("name", "attribute")
    ex = env.eval_examples()[0]
    (s,) = play(env, ex, [f"<find({ex.meta['name']})>"])
    assert s.observation == "error: find raised TypeError: missing required argument(s) ['attribute']\n"


# --------------------------------------------------------------------------- guess


def test_guess_gives_feedback_and_charges_each_miss():
    env = make("guess")
    ex = env.eval_examples()[10]
    assert ex.prompt == "guess 1-16:" and ex.meta["secret"] == 11
    steps = play(env, ex, ["8", "12", "10", "11"])
    assert [s.observation for s in steps[:3]] == ["higher\n", "lower\n", "higher\n"]
    assert [s.reward for s in steps] == [-0.1, -0.1, -0.1, 1.0] and steps[-1].done
    assert total(steps) == pytest.approx(0.7) and env.solved(ex, total(steps))
    assert env.demonstration(ex) == ["8", "12", "10", "11"]


def test_guess_rewards_fewer_turns_and_fails_when_guesses_run_out():
    env = make("guess")
    ex = env.eval_examples()[7]  # secret 8: binary search finds it first
    assert total(play(env, ex, ["8"])) == 1.0
    assert total(play(env, ex, ["4", "8"])) == pytest.approx(0.9)
    lost = play(env, ex, ["1", "2", "x", "17", "3"])
    assert len(lost) == 5 and not lost[-1].done and lost[2].observation == "invalid\n" and lost[3].metrics == {"invalid_guesses": 1}
    assert total(lost) == pytest.approx(-0.5) and not env.solved(ex, total(lost))


def test_guess_evaluates_every_secret_once_and_binary_search_solves_all_within_max_turns():
    env = make("guess", high=31, max_turns=5)
    assert [e.meta["secret"] for e in env.eval_examples()] == list(range(1, 32))
    assert max(len(env.demonstration(e)) for e in env.eval_examples()) == 5


def test_guess_refuses_a_turn_cost_that_makes_a_late_win_a_loss():
    with pytest.raises(ValueError, match="turn_cost = 0.25 with max_turns = 5"):
        GuessConfig(turn_cost=0.25)
    assert attrs.evolve(GuessConfig(), turn_cost=0.24).turn_cost == 0.24


# --------------------------------------------------------------------------- registration and run defaults


def test_the_plugin_registers_the_three_environments(lab):
    assert {"calculator", "search", "guess"} <= set(lab.names("environment"))
    assert not {"calculator", "search", "guess"} & set(lab.names("task"))


def test_rollout_defaults_fill_the_settings_a_config_leaves_unset(lab):
    from rllab.config import load_config

    cfg = load_config(None, ["env=calculator"], lab=lab)
    assert (cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (16, 0.5)
    cfg = load_config(None, ["env=calculator", "rollout.max_new_tokens=8", "rollout.temperature=1.0"], lab=lab)
    assert (cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (8, 1.0)  # the config's own win
    cfg = load_config(None, ["env=guess"], lab=lab)
    assert (cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (8, 0.5)  # guess: its turns are short


def test_bad_rollout_defaults_are_refused_naming_the_environment():
    import rllab
    from rllab.config import load_config
    from rllab.errors import ConfigError

    def plugin(defaults):
        class Env(GuessEnvironment):
            rollout_defaults = defaults

        class P:
            @staticmethod
            @rllab.hookimpl
            def register_environments(register):
                register("odd_guess", Env, config=GuessConfig)

        return P

    with pytest.raises(ConfigError, match=r"environment 'odd_guess' .* unknown \[rollout\] settings \['max_tokens'\]"):
        load_config(None, ["env=odd_guess"], lab=rllab.Lab([plugin({"max_tokens": 4})]))
    with pytest.raises(ConfigError, match=r"environment 'odd_guess' .*rollout_defaults: .*temperature"):
        load_config(None, ["env=odd_guess"], lab=rllab.Lab([plugin({"temperature": -1.0})]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["calculator", "search", "guess"])
def test_every_builtin_environment_learns_visibly_with_the_default_grpo_run(name, tmp_path):
    """The default run lifts held-out success by at least 15 points (many minutes each on 2 cores)."""
    from rllab.config import load_config
    from rllab.training.trainer import run_experiment

    summary = run_experiment(load_config(None, [f"env={name}", "train.checkpoint_every=0"], preset="grpo"), run_dir=tmp_path / name, progress=False)
    assert summary["final/accuracy"] - summary["initial/accuracy"] >= 0.15, summary


def test_demonstration_episodes_of_one_prompt_with_shared_first_turns_are_told_apart():
    """guess has a single prompt and its binary searches share their first turns: the warm
    start's scripted episodes must still each follow their own example."""
    from rllab.rollout.chat import PromptRenderer
    from rllab.rollout.demonstrations import demonstration_episodes
    from rllab.models.tokenizer import build_tokenizer

    env = make("guess")
    examples = env.eval_examples()[::-1] + env.eval_examples()
    episodes = demonstration_episodes(env, examples, PromptRenderer(build_tokenizer()), name="guess")
    for ex, ep in zip(examples, episodes):
        assert list(ep.texts) == env.demonstration(ex) and env.solved(ex, ep.reward), (ex.meta, ep.texts)


def test_plugins_show_lists_an_environments_tools(capsys):
    from rllab.cli import main

    assert main(["plugins", "show", "calculator"]) == 0
    out = capsys.readouterr().out
    assert "calc" in out and "expression" in out and "Evaluate an arithmetic expression" in out
    assert main(["plugins", "show", "guess"]) == 0
    assert "tools (" not in capsys.readouterr().out  # no tools, no table
