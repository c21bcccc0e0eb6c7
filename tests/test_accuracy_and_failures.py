"""What accuracy counts (rllab.rollout.accuracy), and runs with nothing to learn from (rllab.rollout.episode_stats).

Accuracy comes from a declared notion of correct: the task's own ``solved``, else its correctness
reward component (``correct_component``, default the first), else a reward ≥ 1 — never a weighted
sum with shaping terms. A step whose every sample failed its reward, or whose every episode
overflowed its token budget, stops the run naming the cause; one where most failed goes on and
says so once; the no-learning warning names its cause, once.

Unit tests drive the rollout stage with a scripted backend; the last ones run ``rllab run`` on a
plugin file's task and environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rllab.rollout.environment import Step
from rllab.errors import ConfigError, EpisodeError, RewardError, RllabError
from rllab.rollout.stage import build_stage
from rllab.settings import RolloutConfig
from rllab.rollout.accuracy import is_solved, solved_rule
from rllab.types import Completion, Example

from .tiny import TINY, overrides


@pytest.fixture(scope="module")
def char():
    from rllab.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


class Echo:
    """A fake backend: every sample is the same token ids (``text`` then EOS)."""

    def __init__(self, tok, text="5"):
        self.ids = tuple(tok(text, add_special_tokens=False).input_ids) + (tok.eos_token_id,)

    def generate(self, prompts, params):
        return [Completion(prompt_ids=tuple(p), token_ids=self.ids, log_probs=(-0.1,) * len(self.ids), finish_reason="stop", prompt_index=i)
                for i, p in enumerate(prompts) for _ in range(params.n)]

    def last_metrics(self):
        return {}


class Task:
    """Prompts ``i+1=``; ``reward`` is what ``score`` gives a completion (a float or components)."""

    def __init__(self, score=lambda ex, text: 1.0, **attrs):
        self.score = score
        self.__dict__.update(attrs)

    def train_examples(self, n, rng):
        return [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(n)]

    def eval_examples(self):
        return self.train_examples(4, None)

    def reward(self, example, completion):
        return self.score(example, completion)

    def demonstration(self, example):
        return example.answer


def stage(tok, task, **rollout):
    return build_stage(task=task, task_name="t", backend=Echo(tok), tokenizer=tok, seed=0,
                        config=RolloutConfig(**{"prompts_per_step": 2, "group_size": 2, **rollout}))


# --------------------------------------------------------------------------- accuracy


def shaped(ex, text):
    """Correct, with a length penalty that pulls the weighted sum under 1 (README's multi-reward example)."""
    return {"correct": 1.0, "length": -18.0}


def test_accuracy_with_a_negative_shaping_component_is_the_primary_components(char):
    task = Task(shaped, reward_components=("correct", "length"), reward_weights=(1.0, 0.01))
    s = stage(char, task)
    m = s.sample(0).metrics
    assert m["rollout/reward"] == pytest.approx(0.82)  # the weighted sum, under 1
    assert m["rollout/accuracy"] == 1.0 and m["reward/correct"] == 1.0
    assert s.evaluate(4)["eval/accuracy"] == 1.0
    assert s.solved_rule == "reward component 'correct' ≥ 1 (the first, primary component)"


def test_a_named_correctness_component_is_the_one_counted(char):
    def score(ex, text):
        return {"format": 1.0, "correct": 0.0}

    task = Task(score, reward_components=("format", "correct"), correct_component="correct")
    s = stage(char, task)
    assert s.sample(0).metrics["rollout/accuracy"] == 0.0  # the first component (format) is 1, the named one 0
    assert s.evaluate(4)["eval/accuracy"] == 0.0
    assert "'correct'" in s.solved_rule and "task.correct_component" in s.solved_rule


def test_the_tasks_own_solved_wins(char):
    task = Task(shaped, reward_components=("correct", "length"), reward_weights=(1.0, 0.01),
                solved=lambda example, reward: reward > 0.5 and example.answer == "1")
    s = stage(char, task)
    assert s.sample(0).metrics["rollout/accuracy"] == 0.5  # prompt 0 ("0+1=" → "1") only
    assert s.solved_rule == "the task's own solved(example, reward) is true"


def test_an_unknown_correctness_component_is_refused_listing_the_components(char):
    task = Task(shaped, reward_components=("correct", "length"), correct_component="corect")
    with pytest.raises(ConfigError, match=r"correct_component = 'corect' is not one of its reward components; its reward "
                                          r"components are 'correct', 'length'"):
        stage(char, task)
    with pytest.raises(ConfigError, match="it has a single reward, no components: leave correct_component unset"):
        stage(char, Task(correct_component="correct"))


def test_is_solved_never_falls_back_to_the_weighted_sum():
    task = Task(shaped, reward_components=("correct", "length"), reward_weights=(1.0, 0.01))
    ex = Example(prompt="0+1=", answer="1")
    assert is_solved(task, ex, 0.82, {"correct": 1.0, "length": -18.0})
    assert is_solved(task, ex, 0.82, [1.0, -18.0])
    assert not is_solved(task, ex, 5.0, [0.0, 500.0])
    with pytest.raises(RllabError, match="pass the answer's components"):
        is_solved(task, ex, 0.82)
    assert solved_rule(Task()) == "reward ≥ 1" and is_solved(Task(), ex, 1.0) and not is_solved(Task(), ex, 0.99)


def test_the_dataset_tasks_correct_component_knob(tmp_path):
    pytest.importorskip("datasets")
    from rllab_tasks.tasks.dataset import DatasetConfig, DatasetTask

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(6)))
    both = ("exact", "length_penalty")
    task = DatasetTask(DatasetConfig(path=str(data), rewards=both, reward_weights=(1.0, 0.01)))
    assert solved_rule(task) == "reward component 'exact' ≥ 1 (the first, primary component)"
    task = DatasetTask(DatasetConfig(path=str(data), rewards=("exact", "format"), correct_component="format"))
    assert "'format'" in solved_rule(task)
    with pytest.raises(ConfigError, match="'exact', 'length_penalty'"):
        DatasetTask(DatasetConfig(path=str(data), rewards=both, correct_component="exactt"))
    # a shaping term first would make accuracy 0 whatever the answers: refused, saying what to do
    with pytest.raises(ConfigError, match="'length_penalty' ≥ 1, which never scores above 0.*task.correct_component"):
        DatasetTask(DatasetConfig(path=str(data), rewards=both[::-1]))
    assert "'exact'" in solved_rule(DatasetTask(DatasetConfig(path=str(data), rewards=both[::-1], correct_component="exact")))


# --------------------------------------------------------------------------- failures


def always_fails(ex, text):
    raise RuntimeError("grader offline")


@pytest.mark.parametrize("policy", ["skip", "zero"])
def test_a_reward_that_always_fails_stops_the_step_naming_the_task_and_error(char, policy):
    with pytest.raises(RewardError, match=rf"every one of this step's 4 samples failed \(rollout.reward_errors = '{policy}'\).*"
                                          r"task 't'.*RuntimeError: grader offline.*Fix the reward function"):
        stage(char, Task(always_fails), reward_errors=policy).sample(0)


def test_a_reward_that_fails_on_half_the_samples_continues(char):
    calls = []

    def half(ex, text):
        calls.append(1)
        if len(calls) % 2:
            raise RuntimeError("flaky grader")
        return 1.0

    m = stage(char, Task(half), reward_errors="zero").sample(0).metrics
    assert m["rollout/error_frac"] == 0.5 and m["rollout/reward_errors"] == 2.0
    assert m["rollout/accuracy"] == 0.5  # a failed sample is never solved


def test_the_raise_message_says_to_fix_the_reward_first(char):
    with pytest.raises(RewardError) as e:
        stage(char, Task(always_fails)).sample(0)
    text = str(e.value)
    assert "grader offline" in text and "Fix the reward function (or environment) first" in text
    assert "only carries a run past occasional failures" in text


class Chatty:
    """An environment that never ends an episode and answers every turn with a long observation."""

    max_turns = 4

    def train_examples(self, n, rng):
        return [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(n)]

    def eval_examples(self):
        return self.train_examples(2, None)

    def start(self, example):
        return self

    def step(self, text):
        return Step(observation=" and now something rather long to read ", reward=0.0)

    def demonstration(self, example):
        return ["1"]


def test_every_episode_overflowing_its_budget_stops_naming_the_budget(char):
    s = build_stage(env=Chatty(), env_name="chatty", backend=Echo(char), tokenizer=char, seed=0,
                     config=RolloutConfig(prompts_per_step=2, group_size=2, max_episode_tokens=8))
    with pytest.raises(ConfigError, match=r"every episode of environment 'chatty' in this step ended by overflowing its token "
                                          r"budget.*rollout.max_episode_tokens = 8.*Raise rollout.max_episode_tokens") as e:
        s.sample(0)
    assert e.value.key == "rollout.max_episode_tokens"


def test_an_environment_that_always_fails_stops_naming_it(char):
    class Broken(Chatty):
        def step(self, text):
            raise KeyError("no such tool")

    s = build_stage(env=Broken(), env_name="broken", backend=Echo(char), tokenizer=char, seed=0,
                     config=RolloutConfig(prompts_per_step=2, group_size=2, reward_errors="skip"))
    with pytest.raises(EpisodeError, match=r"environment 'broken'.*no such tool.*Fix the environment"):
        s.sample(0)


# --------------------------------------------------------------------------- through `rllab run`

PLUGIN = textwrap.dedent(
    '''
    import attrs
    import rllab
    from rllab.rollout.environment import Step
    from rllab.types import Example


    @attrs.frozen
    class FlakyConfig:
        fail: int = rllab.knob(0, help="of every 4 reward calls, this many raise", ge=0, le=4)
        score: float = rllab.knob(0.0, help="the reward of the others")


    class Flaky:
        """Prompts i+1=; of every 4 reward calls the first `fail` raise, the others score `score`."""

        def __init__(self, config):
            self.config, self.calls = config, 0

        def train_examples(self, n, rng):
            return [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(n)]

        def eval_examples(self):
            return self.train_examples(4, None)

        def reward(self, example, completion):
            self.calls += 1
            if (self.calls - 1) % 4 < self.config.fail:
                raise RuntimeError("grader offline")
            return self.config.score

        def demonstration(self, example):
            return example.answer


    class Chatty:
        max_turns = 4

        def __init__(self, config=None):
            pass

        def train_examples(self, n, rng):
            return [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(n)]

        def eval_examples(self):
            return self.train_examples(2, None)

        def start(self, example):
            return self

        def step(self, text):
            return Step(observation=" and now something rather long to read ", reward=0.0)

        def demonstration(self, example):
            return ["1"]


    def flaky(*, config):
        return Flaky(config)


    @rllab.hookimpl
    def register_tasks(register):
        register("flaky", flaky, config=FlakyConfig, reward_components=())


    @rllab.hookimpl
    def register_environments(register):
        register("chatty", Chatty)
    '''
)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugins") / "flaky.py"
    path.write_text(PLUGIN)
    return path


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def run(plugin, tmp_path, *settings):
    from rllab.cli import main

    args = ["run", *overrides(TINY), "model.warm_start.steps=0", "train.eval_size=4", *settings,
            "--plugin", str(plugin), "--run-dir", str(tmp_path / "run"), "-q"]
    return main(args)


@pytest.mark.parametrize("policy", ["skip", "zero"])
def test_rllab_run_with_a_reward_that_always_fails_exits_nonzero_naming_the_cause(plugin, tmp_path, capsys, policy):
    assert run(plugin, tmp_path, "task=flaky", "task.fail=4", f"rollout.reward_errors={policy}", "train.steps=3") == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "every one of this step's 16 samples failed" in err and "task 'flaky'" in err and "grader offline" in err
    assert not (tmp_path / "run" / "final.json").exists()


def test_rllab_run_where_most_samples_fail_goes_on_and_says_each_thing_once(plugin, tmp_path):
    # a process of its own: what the user's terminal shows, Python's warning display included
    r = subprocess.run([sys.executable, "-m", "rllab.cli", "run", *overrides(TINY), "model.warm_start.steps=0", "train.eval_size=4",
                        "task=flaky", "task.fail=3", "rollout.reward_errors=zero", "train.steps=6", "--plugin", str(plugin),
                        "--run-dir", str(tmp_path / "run"), "-q"], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    err = " ".join(r.stderr.split())
    assert err.count("75% of the samples failed their reward on task 'flaky'") == 1  # the most-failed step, once
    assert err.count("every rollout of the first") == 1 and err.count("scored 0 reward in every group") == 0
    assert "failed their reward (rollout.reward_errors = 'zero'" in err  # the no-learning warning's cause
    assert "warm start" not in err and "NoLearningSignalWarning" not in err  # not blamed, not Python's warning format


def test_rllab_run_where_every_episode_overflows_exits_nonzero_naming_the_budget(plugin, tmp_path, capsys):
    assert run(plugin, tmp_path, "env=chatty", "rollout.max_episode_tokens=8", "train.steps=2") == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "overflowing its token budget" in err and "rollout.max_episode_tokens = 8" in err and "environment 'chatty'" in err


def test_the_header_and_final_json_say_what_accuracy_counts(plugin, tmp_path, capsys):
    from rllab.cli import main

    args = ["run", *overrides(TINY), "model.warm_start.steps=0", "train.eval_size=4", "task=flaky", "train.steps=1",
            "--plugin", str(plugin), "--run-dir", str(tmp_path / "run")]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "task 'flaky'; accuracy counts an answer solved when reward ≥ 1" in out
    assert json.loads((tmp_path / "run" / "final.json").read_text(encoding="utf-8"))["solved_when"] == "reward ≥ 1"


def test_a_zero_reward_run_whose_completions_are_cut_names_the_token_cap_once(plugin, tmp_path, capsys):
    assert run(plugin, tmp_path, "task=addition", "rollout.max_new_tokens=1", "train.steps=5") == 0
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("scored 0") == 1 and "nothing to learn from" in err
    assert "of the completions were cut at their token cap before they ended (rollout.max_new_tokens = 1" in err
    assert "the warm start leaves the model no reward" not in err


def test_rllab_run_where_half_the_samples_fail_goes_on_and_skip_dropping_every_group_is_said(plugin, tmp_path, capsys):
    # 2 of every 4 reward calls raise: every group of 4 has a failure, and skip drops each whole group
    assert run(plugin, tmp_path, "task=flaky", "task.fail=2", "task.score=1.0", "rollout.reward_errors=skip",
               "train.steps=5") == 0
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("drops a failed sample's whole group, so the step trained on nothing") == 1
    assert err.count("no step of the first 5 steps kept a sample to train on") == 1 and "50% of the samples failed" in err
    assert run(plugin, tmp_path, "task=flaky", "task.fail=2", "rollout.reward_errors=zero", "train.steps=2", "--overwrite") == 0


def test_the_warm_starts_probe_stops_on_a_reward_that_always_fails_and_counts_an_occasional_one_unsolved():
    from rllab.models.supervised import greedy_accuracy
    from rllab.models.tiny import TinyModelConfig, build_tiny_model

    model, char = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64))
    examples = Task().train_examples(4, None)
    with pytest.raises(RewardError, match=r"failed on every one of the 4 examples the warm start measured.*grader offline"):
        greedy_accuracy(model, char, Task(always_fails), examples, 2)
    calls = []

    def first_fails(ex, text):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("flaky grader")
        return 1.0

    assert greedy_accuracy(model, char, Task(first_fails), examples, 2) == 0.75
    class Broken(Chatty):
        def step(self, text):
            raise KeyError("no such tool")

    with pytest.raises(EpisodeError, match=r"every one of the 4 greedy episodes the warm start measured its accuracy on failed.*"
                                           r"no such tool"):
        greedy_accuracy(model, char, Broken(), examples, 2)


def test_overflow_advice_names_the_context_when_no_episode_budget_is_set():
    """Episodes overflow the model's context when rollout.max_episode_tokens is unset: the advice
    names the context, not "raise max_episode_tokens (now None)"."""
    import rllab_suite

    base = {"steps": 2, "error_frac": 0.0, "overflow_frac": 1.2, "policy": "raise", "stopped": 2.0,
            "kind": "environment", "max_new_tokens": 16}
    unset = rllab_suite._cause({**base, "budget": None})
    assert "model.tiny.max_position_embeddings" in unset and "None" not in unset
    assert "raise rollout.max_episode_tokens (now 40)" in rllab_suite._cause({**base, "budget": 40})
