"""A config that sets knobs of a task while it plays an environment (or the reverse) is refused
naming the settings the user gave and, when the other side has one, its own knob of that name."""

from __future__ import annotations

import pytest

from rllab.cli import main
from rllab.config import load_config
from rllab.errors import ConfigError


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides))
    return str(e.value)


def test_a_task_knob_beside_an_environment_names_the_setting_and_the_environments_close_knobs():
    msg = refused("env=calculator", "task.digits=3")
    assert "'?'" not in msg
    assert msg.startswith("<config>: task.digits=3 sets a knob of a task, but this config draws its examples from environment 'calculator'")
    # calculator has no `digits`; it has digits_a and digits_b
    assert "environment 'calculator' has no knob 'digits', its closest: env.digits_b, env.digits_a" in msg


def test_a_task_knob_the_environment_also_has_is_named_as_the_environments():
    msg = refused("env=calculator", "task.seed=3", "task.eval_size=5")
    assert "task.seed=3 task.eval_size=5 set knobs of a task" in msg
    assert msg.endswith("environment 'calculator' has its own: env.seed=3 env.eval_size=5")


def test_an_environment_knob_beside_a_task_or_alone():
    msg = refused("task=addition", "env.max_turns=3")
    assert "env.max_turns=3 sets a knob of an environment, but this config draws its examples from task 'addition'" in msg
    assert "name an environment to play (env=NAME)" in msg
    msg = refused("env.max_turns=3")
    from rllab import Lab

    assert msg == ("<config>: env.max_turns=3 sets a knob of [env], which names no environment: choose one with env=NAME "
                   f"(one of {', '.join(Lab().names('environment'))})")
    assert "None" not in msg
    msg = refused("task.digits=3", "env.max_turns=3")
    assert "task.digits=3 and env.max_turns=3 set knobs of a task and of an environment, and neither is named" in msg


def test_both_named_and_an_unknown_name_keep_their_own_messages():
    assert "both task 'addition' and env 'calculator' are set" in refused("task=addition", "env=calculator")
    assert "unknown environment 'calculatr'. Did you mean 'calculator'?" in refused("env=calculatr", "task.digits=2")


def test_a_file_with_a_task_table_and_an_environment(tmp_path):
    f = tmp_path / "exp.toml"
    f.write_text('env = "calculator"\n\n[task]\ndigits = 3\n')
    with pytest.raises(ConfigError, match=r"task.digits=3 sets a knob of a task, but this config draws its examples from "
                                          r"environment 'calculator' \(line 1\)"):
        load_config(f)


def test_the_command_line_says_it_in_one_line(capsys):
    assert main(["run", "env=calculator", "task.digits=3"]) == 1
    err = capsys.readouterr().err
    assert "task.digits=3" in err and "env.digits_a" in err and "Traceback" not in err


def test_a_task_method_that_cannot_take_the_runs_arguments_is_refused_at_build():
    """Traceback: a task written with ``def train_examples(self)`` (the protocol is
    ``train_examples(n, rng)``) crashed deep in the warm start with a TypeError. The built task's
    methods are checked against how the run calls them, naming the method and the call."""
    import rllab
    from rllab.training.export import check_protocol_signatures
    from rllab.types import Example

    class NoArgs(rllab.SingleTurn):
        def train_examples(self):
            return []

        def eval_examples(self):
            return []

        def demonstration(self, example):
            return "1"

        def reward(self, example, completion):
            return 1.0

    with pytest.raises(ConfigError, match=r"task 'mine': NoArgs.train_examples\(\) cannot be called as train_examples\(n, rng\)"):
        check_protocol_signatures(NoArgs(), who="task 'mine'")

    class OneArgReward(NoArgs):
        def train_examples(self, n, rng=None):
            return [Example(prompt="1+0=", answer="1")] * n

        def reward(self, completion):
            return 1.0

    with pytest.raises(ConfigError, match=r"OneArgReward.reward\(completion\) cannot be called as reward\(example, completion\)"):
        check_protocol_signatures(OneArgReward(), who="task 'mine'")

    class Fine(OneArgReward):
        def reward(self, example, completion, *extra, **kw):
            return 1.0

    check_protocol_signatures(Fine(), who="task 'mine'")
    lab = rllab.Lab()
    for section, name in (("task", "addition"), ("task", "sort"), ("env", "calculator"), ("env", "guess"), ("env", "search")):
        from rllab.training.export import build_source

        build_source(load_config(None, [f"{section}={name}"], lab=lab), lab)  # the built-ins pass


def test_an_environment_is_checked_as_one_whatever_section_names_it():
    """An environment's steps reward themselves: it has no ``reward`` to check, and its own methods
    are checked as the run calls them, named as an environment (what it is, not the config section)."""
    import rllab
    from rllab.rollout.single_turn import kind_of
    from rllab.training.export import check_protocol_signatures

    class Env(rllab.Environment):
        def train_examples(self, n, rng):
            return []

        def eval_examples(self):
            return []

        def start(self):
            return None

    with pytest.raises(ConfigError, match=r"environment 'e': Env.start\(\) cannot be called as start\(example\)"):
        check_protocol_signatures(Env(), who=f"{kind_of(Env()).name} 'e'")

    class Fine(Env):
        def start(self, example):
            return None

    check_protocol_signatures(Fine(), who="environment 'e'")


def test_reward_weights_that_do_not_fit_the_components_are_refused_when_the_task_is_built():
    """Said late: a task's reward_weights of another length (or holding a non-number) was refused
    only at its first reward, after the warm start; it is refused when the task is built."""
    import rllab
    from rllab.training.export import build_source
    from rllab.types import Example

    class Three(rllab.SingleTurn):
        reward_components = ("correct", "format")
        reward_weights = (1.0, 0.2, 0.5)

        def train_examples(self, n, rng):
            return [Example(prompt="1+0=", answer="1")] * n

        def eval_examples(self):
            return []

        def demonstration(self, example):
            return "1"

        def reward(self, example, completion):
            return {"correct": 1.0, "format": 1.0}

    class Plugin:
        @rllab.hookimpl
        def register_tasks(self, register):
            register("three", lambda *, config: Three(), reward_components=Three.reward_components)

    lab = rllab.Lab(plugins=[Plugin()])
    with pytest.raises(rllab.RllabError, match=r"task 'three': reward_weights has 3 entries for its 2 reward components"):
        build_source(load_config(None, ["task=three"], lab=lab), lab)
