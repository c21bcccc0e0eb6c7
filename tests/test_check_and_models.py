"""Name lookups across every kind (``rllab check``, ``rllab plugins show``), the contract suite on
async environments, and ``model.path`` directories refused before they load."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

import rllab
from rllab.cli import main
from rllab.errors import ConfigError, UnknownComponentError
from rllab.models.modeldir import check_model_dir

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def flat(text: str) -> str:
    """Rich's output with its line breaks undone (messages are matched as one line)."""
    return " ".join(text.split())


# --------------------------------------------------------------------------- names of every kind


@pytest.mark.parametrize("command", [("check",), ("plugins", "show")])
def test_a_typo_is_matched_against_every_kind_with_the_kind_named(capsys, command):
    """``grop`` is close to the advantage estimator ``grpo``: not to any policy loss, which is the
    only kind the check used to search."""
    code, _, err = run(capsys, *command, "grop")
    err = flat(err)
    assert code == 1
    assert "unknown component 'grop'" in err and "Did you mean 'grpo' (an advantage_estimator)" in err
    assert "unknown policy_loss" not in err
    assert "--plugin FILE.py" in err and "install its package" in err


@pytest.mark.parametrize("command", [("check",), ("plugins", "show")])
def test_a_name_from_a_plugin_not_loaded_says_the_plugin_may_be_missing(capsys, command):
    code, _, err = run(capsys, *command, "retry_addition")
    err = flat(err)
    assert code == 1 and "'retry_addition'" in err
    assert "Did you mean 'addition' (a task)" in err and "plugin may not be loaded" in err
    code, out, _ = run(capsys, *command, "retry_addition", "--plugin", ROOT / "examples" / "retry_env.py")
    assert code == 0 and "retry_addition" in out


@pytest.mark.parametrize("command", [("check",), ("plugins", "show")])
def test_a_name_of_another_kind_than_kind_says_which_it_is(capsys, command):
    code, _, err = run(capsys, *command, "ppo_clip", "--kind", "advantage_estimator")
    err = flat(err)
    assert code == 1
    assert "unknown advantage_estimator 'ppo_clip'" in err
    assert "'ppo_clip' is registered as a policy_loss, not as an advantage_estimator" in err


def test_with_kind_a_closer_name_of_another_kind_is_offered_too(capsys):
    """``--kind policy_loss grop``: the policy loss ``dro`` is close, the advantage estimator
    ``grpo`` closer (a name put in the wrong section); a less close one is not offered."""
    code, _, err = run(capsys, "plugins", "show", "grop", "--kind", "policy_loss")
    assert code == 1 and "Did you mean 'dro'? Or, of another kind, 'grpo' (an advantage_estimator)?" in flat(err)
    code, _, err = run(capsys, "check", "token-maen", "--kind", "loss_aggregation")
    assert code == 1 and "Did you mean 'token-mean'?" in flat(err) and "another kind" not in err


def test_a_name_in_other_case_or_an_empty_name(capsys):
    code, _, err = run(capsys, "check", "GRPO")
    assert code == 1 and "Did you mean 'grpo' (an advantage_estimator)" in flat(err)
    code, _, err = run(capsys, "plugins", "show", "PPO_Clip", "--kind", "policy_loss")
    assert code == 1 and "Did you mean 'ppo_clip'?" in flat(err)
    code, _, err = run(capsys, "check", "")
    assert code == 1 and "the component name is empty" in flat(err)


@pytest.mark.parametrize("argv", [("shwo", "grpo"), ("grpo",)])
def test_a_mistyped_or_missing_show_suggests_the_name_given(capsys, argv):
    """``rllab plugins shwo grpo`` used to suggest ``rllab plugins show shwo``."""
    code, _, err = run(capsys, "plugins", *argv)
    assert code == 2 and "did you mean 'rllab plugins show grpo'?" in flat(err)


def test_resolve_lists_close_names_of_several_kinds():
    """The library call behind both commands: close names of every kind, aliases included."""
    mod = type(rllab)("two_kinds")

    @rllab.hookimpl
    def register_policy_losses(register):
        register("toy_clip", lambda **kw: None, summary="a toy loss")

    @rllab.hookimpl
    def register_tasks(register):
        register("toy_clips", lambda **kw: None, summary="a toy task", aliases=("toy_clap",))

    mod.register_policy_losses, mod.register_tasks = register_policy_losses, register_tasks
    lab = rllab.Lab([mod], entry_points=False)
    assert [s.kind for s in lab.resolve("toy_clap")] == ["task"]
    with pytest.raises(UnknownComponentError) as e:
        lab.resolve("toy_clipp")
    msg = str(e.value)
    assert "'toy_clip' (a policy_loss)" in msg and "'toy_clips' (a task)" in msg
    with pytest.raises(UnknownComponentError, match="'toy_clips' is registered as a task, not as a policy_loss"):
        lab.resolve("toy_clips", "policy_loss")


# --------------------------------------------------------------------------- async environments


ASYNC_ENV = '''
import asyncio
import attrs
import torch
import rllab
from rllab.rollout.environment import Step
from rllab.types import Example


class Episode:
    def __init__(self, answer):
        self.answer, self.turn = answer, 0

    async def step(self, text):
        await asyncio.sleep(0)  # a tool that waits
        self.turn += 1
        if text.strip() == self.answer:
            return Step(reward=1.0, done=True)
        return Step(observation=" no, ", reward=0.0)


class AsyncAddition:
    max_turns = 2

    def __init__(self, config=None):
        pass

    def _ex(self, a, b):
        return Example(prompt=f"{a}+{b}=", answer=str(a + b))

    def train_examples(self, n, rng):
        return [self._ex(*torch.randint(0, 10, (2,), generator=rng).tolist()) for _ in range(n)]

    def eval_examples(self):
        return [self._ex(a, 1) for a in range(4)]

    START

    def demonstration(self, example):
        return ["x", example.answer]


@rllab.hookimpl
def register_environments(register):
    register("NAME", AsyncAddition)
'''


def _async_env(tmp_path: Path, name: str, start: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(ASYNC_ENV.replace("NAME", name).replace("    START", textwrap.indent(start, "    ")))
    return path


def test_the_contract_suite_awaits_an_async_step(capsys, tmp_path):
    """Every check used to fail with "the contract checks call step synchronously"; the episode
    loop awaits async steps, so the suite does too (the demonstration's wrong first turn gets an
    observation, so the recorded steps are checked against the episode's ids)."""
    path = _async_env(tmp_path, "async_addition", "def start(self, example):\n    return Episode(example.answer)\n")
    code, out, err = run(capsys, "check", "async_addition", "--plugin", path)
    assert code == 0, out + err
    assert "all checks passed" in out and "synchronously" not in out
    assert "never awaited" not in err


def test_an_async_start_is_refused_saying_only_step_may_be_async(capsys, tmp_path):
    path = _async_env(tmp_path, "async_start", "async def start(self, example):\n    return Episode(example.answer)\n")
    code, out, err = run(capsys, "check", "async_start", "--plugin", path)
    out = flat(out)
    assert code == 1 and "start(example) returned an awaitable" in out and "only an episode's step may be async def" in out
    assert "never awaited" not in err


@pytest.mark.parametrize("errors", ["raise", "skip"])
def test_a_run_on_an_async_start_stops_at_once_naming_it(capsys, tmp_path, errors):
    """Not an AttributeError on a coroutine deep in the loop, and not one failed episode per sample
    under ``skip``: every episode would fail alike, so the run stops naming the contract."""
    path = _async_env(tmp_path, "async_start_run", "async def start(self, example):\n    return Episode(example.answer)\n")
    code, out, err = run(capsys, "run", "--plugin", str(path), "env=async_start_run", "rollout.max_turns=2",
                         "model.warm_start.steps=0", f"rollout.reward_errors={errors}", "--steps", "1",
                         "--run-dir", str(tmp_path / "run"))
    text = flat(out + err)
    assert code == 1, text
    assert "start(example) returned an awaitable" in text and "'async_start_run'" in text, text
    assert "never awaited" not in err and "AttributeError" not in text


# --------------------------------------------------------------------------- model.path


def _tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg)


def test_a_model_saved_without_its_tokenizer_is_refused_before_training(capsys, tmp_path):
    """What the README's LoRA merge snippet used to write: weights and config, no tokenizer. The run
    ended in "hf backend: prompt 0 is empty" after the model loaded; now it stops first."""
    merged = tmp_path / "merged"
    _tiny_model().save_pretrained(merged)
    code, _, err = run(capsys, "run", f"model.path={merged}", "--steps", "2", "--run-dir", tmp_path / "run")
    err = flat(err)
    assert code == 1, err
    assert f"model.path '{merged}' has a model but no tokenizer" in err
    assert "tokenizer.json" in err and "save_pretrained" in err and "prompt 0 is empty" not in err
    assert not (tmp_path / "run").exists()  # nothing ran: no run directory


def test_readme_merge_snippet_saves_the_tokenizer():
    text = (ROOT / "README.md").read_text()
    snippet = text[text.index("merge_and_unload()") :].split("```")[0]
    assert "AutoTokenizer.from_pretrained(BASE_DIR).save_pretrained(\"merged\")" in snippet


def _write(tmp_path: Path, case: str) -> Path:
    d = tmp_path / "m"
    if case == "missing":
        return d
    if case == "file":
        d.mkdir()
        (d / "config.json").write_text("{}")
        return d / "config.json"
    d.mkdir()
    if case == "empty":
        return d
    if case == "no config.json":
        (d / "model.safetensors").write_bytes(b"")
    elif case == "adapter":
        (d / "adapter_config.json").write_text("{}")
        (d / "adapter_model.safetensors").write_bytes(b"")
    elif case == "no weights":
        (d / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
        (d / "tokenizer.json").write_text("{}")
    return d


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "does not exist"),
        ("file", "is a file, not a directory: model.path names the model's directory (here perhaps"),
        ("empty", "is an empty directory"),
        ("no config.json", "has no config.json (it holds model.safetensors)"),
        ("adapter", "holds a LoRA adapter (adapter_config.json), not a model: merge it"),
        ("no weights", "has a config.json but no weights"),
    ],
)
def test_each_unusable_model_directory_is_refused_naming_what_is_missing(tmp_path, case, expected):
    path = _write(tmp_path, case)
    with pytest.raises(ConfigError) as e:
        check_model_dir(str(path))
    assert f"model.path {str(path)!r}" in str(e.value) and expected in str(e.value)
    assert e.value.key == "path"


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_model_path_is_refused_not_read_as_the_tiny_model(value):
    """``model.path=`` used to train the tiny model, as if the setting were left out."""
    from rllab.config import load_config

    with pytest.raises(ConfigError, match=r"path = '\s*' is empty: give a model directory, or leave path out"):
        load_config(None, [f"model.path={json.dumps(value)}"])


def test_a_hub_name_is_told_to_download_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"does not exist \(resolved to .*\)\. rllab loads local directories only.*huggingface-cli download Qwen/Qwen2.5-0.5B"):
        check_model_dir("Qwen/Qwen2.5-0.5B")


def test_a_tokenizer_without_a_vocabulary_is_refused_when_it_loads(tmp_path):
    """tokenizer_config.json alone passes the file check, but the tokenizer built from it encodes
    every prompt to nothing: refused when it loads, naming the directory."""
    from rllab.models.forward import load_tokenizer
    from rllab.models.tiny import TinyModelConfig, build_tiny_model

    model, tok = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert check_model_dir(tmp_path) == tmp_path and load_tokenizer(tmp_path)("1+1=").input_ids
    (tmp_path / "tokenizer.json").unlink()
    check_model_dir(tmp_path)
    with pytest.raises(ConfigError, match=r"encodes '1\+1=2' to no tokens: its vocabulary is missing"):
        load_tokenizer(tmp_path)
