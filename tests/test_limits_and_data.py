"""Prompts against the model's context (rllab.rollout.prompt_limits, rollout.max_prompt_tokens), a task's
tiny-model defaults, and the messages for bad data files, reward references, required knobs and
malformed environment steps: each names the setting, file or value and says what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import rllab
from rllab.config import validate
from rllab.rollout.environment import Step
from rllab.rollout.episodes import EpisodeLimits, EpisodeRunner
from rllab.errors import ConfigError, EpisodeError, PromptError
from rllab.rollout.chat import PromptRenderer
from rllab.rollout.prompt_limits import PromptLimits
from rllab.settings import RolloutConfig
from rllab.models.tiny import TinyModelConfig, WarmStartConfig, task_tiny_model, task_warm_start
from rllab.models.tokenizer import build_tokenizer
from rllab.types import Completion, Example

_LAB = rllab.Lab()


@pytest.fixture(scope="module")
def char():
    tok = build_tokenizer()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(n=40, long_every=4, long=300):
    """Sums; every ``long_every``-th prompt is padded to more than ``long`` characters."""
    return [{"prompt": ("x" * long if i % long_every == 0 else "") + f"{i}+1=", "answer": str(i + 1)} for i in range(n)]


def _dataset(path, **knobs):
    pytest.importorskip("datasets")
    return _LAB.get("task", "dataset", path=str(path), **knobs)()


def _limits(source, tok, context=256, **rollout):
    cfg = RolloutConfig(**rollout)
    return PromptLimits(source, tokenizer=tok, rollout=cfg, context_tokens=context, name="dataset"), cfg


# ---------------------------------------------------------------- prompts against the context


def test_a_prompt_longer_than_the_context_is_refused_at_load_naming_row_length_and_fix(tmp_path, char):
    task = _dataset(_jsonl(tmp_path / "long.jsonl", _rows()))
    limits, cfg = _limits(task, char)
    with pytest.raises(PromptError, match=r"task 'dataset': the prompt of long.jsonl row \d+ \(prompt 'xxx.*is 30\d tokens, and the "
                       r"model has a context of 256: nothing is left for the response. Fix: set rollout.max_prompt_tokens"):
        limits.check(cfg)


def test_a_task_prompt_plus_max_new_tokens_past_the_context_is_refused(tmp_path, char):
    task = _dataset(_jsonl(tmp_path / "mid.jsonl", _rows(long=200)))  # 200-odd tokens: fits, but not with 64 more
    limits, cfg = _limits(task, char, max_new_tokens=64)
    with pytest.raises(PromptError, match=r"is 20\d tokens; with rollout.max_new_tokens = 64 a response would run to 2\d\d tokens, "
                       r"past the context of the model \(256\).*lower rollout.max_new_tokens to 5\d or less"):
        limits.check(cfg)
    free = PromptLimits(task, tokenizer=char, rollout=cfg, context_tokens=None, name="d").check(cfg)  # no context: nothing
    assert free.limit is None and free.held_out() == task.eval_examples()
    assert free.draw(3, torch.Generator().manual_seed(0)) == task.train_examples(3, torch.Generator().manual_seed(0))


class _Game:
    """An environment whose prompts are ``n`` characters: its episodes cap each turn to the context."""

    max_turns = 2

    def __init__(self, n):
        self.prompt = "g" * n

    def train_examples(self, n, rng):
        return [Example(prompt=self.prompt, answer="") for _ in range(n)]

    def eval_examples(self):
        return [Example(prompt=self.prompt, answer="")]

    def start(self, example):
        return None

    def demonstration(self, example):
        return ["x"]


def test_an_environment_needs_only_its_prompt_to_fit(char):
    limits, cfg = _limits(_Game(240), char, max_new_tokens=64)  # 241 + 64 > 256: the episode loop caps the turn
    assert limits.check(cfg).held_out()[0].prompt == "g" * 240
    limits, cfg = _limits(_Game(300), char)
    with pytest.raises(PromptError, match=r"environment 'dataset': the prompt of training draw 0 .* is 301 tokens"):
        limits.check(cfg)


def test_max_prompt_tokens_drops_longer_rows_from_train_and_eval_and_counts_them(tmp_path, char, capsys):
    task = _dataset(_jsonl(tmp_path / "long.jsonl", _rows()), eval_fraction=0.25)
    limits, cfg = _limits(task, char, max_prompt_tokens=100)
    limits.check(cfg)
    long_train = sum(len(e.prompt) > 100 for e in task.train)
    long_eval = sum(len(e.prompt) > 100 for e in task.eval)
    assert long_train and long_eval
    assert limits.summary() == {
        "prompts/checked_train": 30, "prompts/checked_eval": 10, "prompts/dropped_train": long_train,
        "prompts/dropped_eval": long_eval, "prompts/longest_kept": 6,
    }
    assert f"drops {long_train} of 30 training prompts and {long_eval} of 10 held-out" in capsys.readouterr().err
    drawn = limits.draw(64, torch.Generator().manual_seed(0))
    assert len(drawn) == 64 and all(len(e.prompt) < 100 for e in drawn)
    assert [e.prompt for e in limits.held_out()] == [e.prompt for e in task.eval if len(e.prompt) < 100]
    # the stage's draw is the filtered one, and so are its held-out examples; the task itself is unchanged
    from rllab.rollout.stage import build_stage

    stage = build_stage(task=task, task_name="dataset", backend=None, tokenizer=char, seed=0, config=cfg, prompt_limits=limits)
    assert stage.draw(0, 64, torch.Generator().manual_seed(0)) == drawn and stage.held_out() == limits.held_out()
    assert stage.env is task and len(task.eval_examples()) == len(task.eval)


@pytest.mark.parametrize(
    "rollout, message",
    [
        ({"max_prompt_tokens": 256}, r"rollout.max_prompt_tokens = 256 leaves no room for the response: the model's context is 256 "
         r"tokens and rollout.max_new_tokens = 8; set rollout.max_prompt_tokens ≤ 248"),
        ({"max_prompt_tokens": 3}, r"rollout.max_prompt_tokens = 3 drops every one of the 30 training prompts .*the shortest is 5 tokens"),
        ({"max_new_tokens": 256}, r"rollout.max_new_tokens = 256 is the model's whole context \(256 tokens\) or more"),
    ],
)
def test_a_max_prompt_tokens_or_max_new_tokens_that_leaves_nothing_is_refused(tmp_path, char, rollout, message):
    task = _dataset(_jsonl(tmp_path / "long.jsonl", _rows()), eval_fraction=0.25)
    limits, cfg = _limits(task, char, **rollout)
    with pytest.raises(ConfigError, match=message) as e:
        limits.check(cfg)
    assert e.value.key == next(iter(rollout))


class _Generated:
    """A task whose instances are generated (no ``train`` list): one draw in 8 is too long."""

    name = "generated"

    def train_examples(self, n, rng):
        k = torch.randint(0, 8, (n,), generator=rng).tolist()
        return [Example(prompt=("y" * 300 if j == 0 else "") + "1+1=", answer="2") for j in k]

    def eval_examples(self):
        return [Example(prompt="2+2=", answer="4")]

    def reward(self, example, completion):
        return 1.0

    def demonstration(self, example):
        return example.answer


def test_a_generated_task_is_probed_at_load_and_checked_as_it_draws(char):
    limits, cfg = _limits(_Generated(), char)
    with pytest.raises(PromptError, match=r"training draw \d+ \(prompt 'yyy"):
        limits.check(cfg)  # the probe of draws finds one
    limits, cfg = _limits(_Generated(), char, max_prompt_tokens=50)
    limits.check(cfg)
    assert all(len(e.prompt) < 50 for e in limits.draw(32, torch.Generator().manual_seed(1)))


@pytest.mark.filterwarnings("ignore:.*scored 0")  # two steps of an untrained model
def test_a_run_refuses_a_too_long_data_set_before_training_and_records_the_drops(tmp_path, model_cache):
    from rllab.training.trainer import run_experiment

    path = _jsonl(tmp_path / "long.jsonl", _rows())
    data = {"task": {"name": "dataset", "path": str(path)}, "train": {"steps": 1, "eval_size": 4, "checkpoint_every": 0},
            "model": {"tiny": {"hidden_size": 64, "intermediate_size": 128}, "warm_start": {"steps": 2, "eval_limit": 0}},
            "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4}}
    with pytest.raises(PromptError, match=r"long.jsonl row \d+ .* is 30\d tokens, and the tiny model has a context of 256"):
        run_experiment(validate(data), run_dir=tmp_path / "refused", progress=False)
    data["rollout"]["max_prompt_tokens"] = 64
    final = run_experiment(validate(data), run_dir=tmp_path / "dropped", progress=False)
    assert final["prompts/dropped_train"] + final["prompts/dropped_eval"] == 10
    assert json.loads((tmp_path / "dropped" / "final.json").read_text())["prompts/dropped_eval"] == final["prompts/dropped_eval"]


def test_a_task_can_give_the_tiny_model_the_context_it_needs():
    class Long:
        tiny_model_defaults = {"max_position_embeddings": 1024}

    assert task_tiny_model(Long(), TinyModelConfig()).max_position_embeddings == 1024
    assert task_tiny_model(Long(), TinyModelConfig(max_position_embeddings=512)).max_position_embeddings == 512  # the config wins
    assert task_tiny_model(Long(), TinyModelConfig(), given=("max_position_embeddings",)).max_position_embeddings == 256  # even at 256
    Long.warm_start_defaults = {"steps": 60}
    assert task_warm_start(Long(), WarmStartConfig()).steps == 60
    assert task_warm_start(Long(), WarmStartConfig(), given=("steps",)).steps == 600  # model.warm_start.steps=600 set: kept
    Long.tiny_model_defaults = {"max_positions": 1}
    with pytest.raises(ValueError, match=r"tiny_model_defaults names unknown tiny-model knobs \['max_positions'\]"):
        task_tiny_model(Long(), TinyModelConfig())


def test_textarena_games_ask_for_a_context_that_holds_their_prompt():
    pytest.importorskip("textarena")
    env = _LAB.get("environment", "textarena", game="GuessTheNumber-v0")()
    assert env.tiny_model_defaults == {"max_position_embeddings": 1024}
    assert len(env.example(0).prompt) + 1 < 1024
    assert env.warm_start_defaults["batch_size"] <= 16  # its warm start takes minutes, not an hour


# ---------------------------------------------------------------- data files


@pytest.mark.parametrize(
    "name, content, knobs, message",
    [
        ("empty.jsonl", "", {}, r"empty.jsonl is empty \(0 bytes\); a data set needs at least two rows"),
        ("blank.jsonl", "\n  \n\n", {}, r"blank.jsonl holds only blank lines; a data set needs at least two rows"),
        ("empty.json", "", {}, r"empty.json is empty \(0 bytes\)"),
        ("list.json", "[]", {}, r"list.json has no rows; a data set needs at least two rows"),
        ("header.csv", "prompt,answer\n", {}, r"header.csv has no rows"),
        ("rows.txt", "1+1=\n", {}, r"unknown file type '.txt'; use one of .jsonl, .json, .parquet, .csv .*extension"),
        ("one.jsonl", json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n", {},
         r"one.jsonl has no evaluation rows \(1 training, 0 evaluation\); a data set needs at least two rows .*task.eval_path"),
        ("marked.jsonl", "".join(json.dumps({"prompt": f"{i}", "answer": "1", "split": "test"}) + "\n" for i in range(3)), {},
         r"has no training rows \(0 training, 3 evaluation\); its 'split' column marks the rows; mark some train"),
        ("q.jsonl", "".join(json.dumps({"question": f"{i}+1=", "answer": "1"}) + "\n" for i in range(3)), {},
         r"q.jsonl row 1: missing column 'prompt' \(columns: question, answer\); name the column with task.prompt_column "
         r"\(task.prompt_column=question\?\)"),
        ("q2.jsonl", "".join(json.dumps({"question": f"{i}+1=", "solution": "1"}) + "\n" for i in range(3)),
         {"prompt_column": "question", "answer_column": "answr"},
         r"missing column 'answr' \(columns: question, solution\); name the column with task.answer_column \(task.answer_column=solution\?\)"),
        ("bad.jsonl", "hello\n", {}, r"cannot read .*bad.jsonl as .jsonl: .*JSON parse error"),
        ("holes.csv", "prompt,answer\n1+1=,2\n,3\n2+2=,4\n", {},
         r"holes.csv row 2: missing column 'prompt' in this row \(null or absent\); give every row a prompt"),
    ],
)
def test_bad_data_files_are_refused_naming_the_file_and_the_fix(tmp_path, name, content, knobs, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=message):
        _dataset(tmp_path / name, **knobs)


def test_a_directory_that_is_not_a_saved_data_set_is_refused_naming_its_files(tmp_path):
    (tmp_path / "data").mkdir()
    _jsonl(tmp_path / "data" / "train.jsonl", _rows(4))
    with pytest.raises(ValueError, match=r"data is a directory but not one written by Dataset.save_to_disk .*the data files in it: "
                       r"train.jsonl \(give one as the path\)"):
        _dataset(tmp_path / "data")
    with pytest.raises(ValueError, match=r"task 'jsonl': path .*data is a directory; give a JSONL file"):
        _LAB.get("task", "jsonl", path=str(tmp_path / "data"))()
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match=r"task 'jsonl': .*blank.jsonl has no rows \(it is empty or holds only blank lines\)"):
        _LAB.get("task", "jsonl", path=str(tmp_path / "blank.jsonl"))()


def test_a_missing_required_knob_names_it_and_how_to_set_it():
    with pytest.raises(ConfigError, match=r"\[task\]: task 'dataset' \(plugin rllab_tasks\) needs knob 'path' \(a .jsonl/.json.*\), "
                       r"which has no default; set it \(on the command line: task.path=...\)") as e:
        validate({"task": {"name": "dataset"}})
    assert e.value.key == "path"
    with pytest.raises(ConfigError, match=r"task 'jsonl' .* needs knob 'path'"):
        validate({"task": "jsonl"})


# ---------------------------------------------------------------- reward references


def test_a_reward_file_without_its_function_is_refused_naming_the_functions_in_it(tmp_path, monkeypatch):
    from rllab.rollout.rewards import load_reward_function

    path = tmp_path / "my_rewards.py"
    path.write_text("def accuracy(completions, **kw):\n    return [0.0] * len(completions)\n\ndef _helper():\n    pass\n")
    with pytest.raises(ConfigError, match=r"reward function '.*my_rewards.py' names a file but not the function in it: write "
                       r".*my_rewards.py:accuracy \(functions in it: accuracy\)"):
        load_reward_function(str(path))
    with pytest.raises(ConfigError, match=r"no such file .*nope.py; a file's reward function is named path/to/file.py:NAME"):
        load_reward_function(str(tmp_path / "nope.py"))
    with pytest.raises(ConfigError, match=r"unknown reward_function 'my_pkg.rewards'.*named module:function: my_pkg.rewards:NAME"):
        load_reward_function("my_pkg.rewards")
    assert load_reward_function(f"{path}:accuracy").name == "accuracy"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"unknown reward_function 'my_rewards'.*There is a file my_rewards.py here: name its "
                       r"function as my_rewards.py:NAME"):
        load_reward_function("my_rewards")


@pytest.mark.parametrize(
    "ref, message",
    [
        (":accuracy", r"the module or file before ':' is missing"),
        ("my_rewards.py:", r"the function after ':' is missing"),
        ("my_rewards.py:accuracy:x", r"more than one ':'"),
        ("my_rewards.py :accuracy", r"spaces around ':'; write it without them \(my_rewards.py:accuracy\)"),
        ("./:accuracy", r"is a directory; name a file and a function in it"),
        ("my_rewards.PY", r"names a file but not the function in it: write my_rewards.PY:accuracy"),
    ],
)
def test_a_malformed_reward_reference_says_how_to_write_it(tmp_path, monkeypatch, ref, message):
    from rllab.rollout.rewards import load_reward_function

    monkeypatch.chdir(tmp_path)
    body = "def accuracy(completions, **kw):\n    return [0.0] * len(completions)\n"
    (tmp_path / "my_rewards.py").write_text(body)
    (tmp_path / "my_rewards.PY").write_text(body)
    with pytest.raises(ConfigError, match=message):
        load_reward_function(ref)


# ---------------------------------------------------------------- environment steps


def test_a_step_with_a_bad_role_or_metric_says_which_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"Step.role = 'assistant' is not a role an observation can take; use one of 'user', 'tool'"):
        Step(observation="x", role="assistant")
    with pytest.raises(TypeError, match=r"Step.metrics\['tool_calls'\] = 'two' is a str, not a number"):
        Step(metrics={"tool_calls": "two"})
    with pytest.raises(ValueError, match=r"Step.metrics\['x'\] = nan must be finite"):
        Step(metrics={"x": float("nan")})
    assert Step(metrics={"a": 1, "b": 2.5, "c": torch.tensor(3.0)}).metrics["a"] == 1


class _Backend:
    def generate(self, prompts, params):
        return [Completion(prompt_ids=tuple(p), token_ids=(5, 2), log_probs=(-0.1, -0.1), finish_reason="stop", prompt_index=i)
                for i, p in enumerate(prompts) for _ in range(params.n)]

    def last_metrics(self):
        return {}


class _BadMetrics:
    class Ep:
        def step(self, text):
            return Step(reward=1.0, done=True, metrics={"moves": "three"})

    def start(self, example):
        return self.Ep()


def test_an_environment_whose_step_metric_is_not_a_number_is_named(char):
    renderer = PromptRenderer(char, task_name="counter", model_name="the tiny model")
    runner = EpisodeRunner(_BadMetrics(), name="counter", backend=_Backend(), renderer=renderer,
                           limits=EpisodeLimits(max_turns=1, max_new_tokens=4))
    params = rllab.types.SamplingParams(n=1, max_new_tokens=4, stop_token_ids=renderer.stop_ids)
    with pytest.raises(EpisodeError, match=r"environment 'counter' failed on example '1\+1=' at turn 1.*"
                       r"Step.metrics\['moves'\] = 'three' is a str, not a number"):
        runner.play([Example(prompt="1+1=", answer="2")], params)

