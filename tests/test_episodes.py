"""The episode loop (rllab.rollout.episodes) and what the kernel types carry for episodes.

Unit tests run the loop against a scripted fake backend (turns given as texts or ids, calls
recorded) on the tiny model's real tokenizers; the last tests run real backends (hf, and sglang
through the stand-in) and a short `rllab run env=...`.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import attrs
import pytest
import torch

import rllab
from rllab.rollout.chat import PromptRenderer, _ids
from rllab.config import load_config
from rllab.rollout.demonstrations import demonstration_episodes
from rllab.rollout.environment import Step
from rllab.rollout.episodes import EpisodeLimits, EpisodeRunner
from rllab.errors import ConfigError, DuplicateComponentError, EpisodeError, PromptError
from rllab.settings import RolloutConfig
from rllab.models.tokenizer import build_chat_tokenizer, build_tokenizer
from rllab.types import Completion, Example, RolloutBatch, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
RETRY_ENV = ROOT / "examples" / "retry_env.py"


@pytest.fixture(scope="module")
def char():
    tok = build_tokenizer()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


@pytest.fixture(scope="module")
def chat():
    tok = build_chat_tokenizer()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


class Scripted:
    """A fake backend: each call answers prompt i with ``turns[call][i]`` (ids), log-prob −(k+1)/10
    for its k-th token; records every call's prompts and params."""

    def __init__(self, turns):
        self.turns = turns
        self.calls = []

    def generate(self, prompts, params):
        self.calls.append(([list(p) for p in prompts], params))
        answers = self.turns[len(self.calls) - 1]
        out = []
        for i, p in enumerate(prompts):
            for j in range(params.n):
                ids = tuple(answers[i * params.n + j])[: params.max_new_tokens]
                stop = bool(ids) and ids[-1] in params.stop_token_ids
                out.append(Completion(prompt_ids=tuple(p), token_ids=ids, log_probs=tuple(-(k + 1) / 10 for k in range(len(ids))),
                                      finish_reason="stop" if stop else "length", prompt_index=i))
        return out

    def last_metrics(self):
        return {"sglang/requests": 1.0}


class Turns:
    """An episode that answers each turn with ``obs`` and rewards ``rewards[turn]``; done after ``done_at`` turns."""

    def __init__(self, rewards=(0.25, 0.5, 1.0), done_at=3, obs="ok:", role="user"):
        self.rewards, self.done_at, self.obs, self.role = rewards, done_at, obs, role
        self.seen = []

    def step(self, text):
        self.seen.append(text)
        t = len(self.seen)
        return Step(observation=self.obs, reward=self.rewards[t - 1], done=t >= self.done_at, role=self.role,
                    metrics={"calls": 1.0})


class Env:
    def __init__(self, max_turns=3, **kw):
        self.max_turns = max_turns
        self.kw = kw
        self.episodes = []

    def train_examples(self, n, rng):
        return [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(n)]

    def eval_examples(self):
        return self.train_examples(4, None)

    def start(self, example):
        ep = Turns(**self.kw)
        self.episodes.append(ep)
        return ep

    def demonstration(self, example):
        return ["1", "2", "3"]


def ids_of(tok, text):
    return list(tok(text, add_special_tokens=False).input_ids)


def play(env, backend, tok, examples, *, n=1, on_error="raise", **limits):
    lim = EpisodeLimits(**{"max_turns": 3, "max_new_tokens": 8, **limits})
    r = EpisodeRunner(env, name="fake", backend=backend, renderer=PromptRenderer(tok), limits=lim, on_error=on_error)
    params = SamplingParams(n=n, max_new_tokens=lim.max_new_tokens, stop_token_ids=r.renderer.stop_ids, seed=5)
    return r.play(examples, params), r


# --------------------------------------------------------------------------- the loop


def test_ids_are_the_concatenation_and_each_turn_is_one_generate_call(char):
    eos = char.eos_token_id
    t = lambda s: ids_of(char, s) + [eos]  # noqa: E731
    # 2 examples × G = 2; turn 1 answers 4 episodes, later turns every live one
    backend = Scripted([[t("a"), t("bb"), t("c"), t("d")], [t("e"), t("f"), t("g"), t("h")], [t("i"), t("j"), t("k"), t("l")]])
    env = Env()
    examples = env.train_examples(2, None)
    results, _ = play(env, backend, char, examples, n=2)
    assert [len(c[0]) for c in backend.calls] == [2, 4, 4]  # n = G prompts, then every live episode
    assert [c[1].n for c in backend.calls] == [2, 1, 1]
    assert backend.calls[0][1].seed == 5 and len({c[1].seed for c in backend.calls}) == 3  # a seed per turn
    obs = ids_of(char, "ok:")
    r = results[1]  # example 0, second sample: "bb", "f", "j"
    expected = t("bb") + obs + t("f") + obs + t("j")
    assert list(r.completion.token_ids) == expected
    assert list(r.completion.prompt_ids) == list(char("0+1=").input_ids)
    assert list(r.completion.model_mask) == [True] * 3 + [False] * 3 + [True] * 2 + [False] * 3 + [True] * 2
    # each later call's prompt is the episode's full ids so far
    assert backend.calls[1][0][1] == list(char("0+1=").input_ids) + t("bb") + obs
    assert backend.calls[2][0][1] == list(char("0+1=").input_ids) + t("bb") + obs + t("f") + obs
    # log-probs of model tokens as sampled, 0 on observations
    lp = [-0.1, -0.2, -0.3] + [0.0] * 3 + [-0.1, -0.2] + [0.0] * 3 + [-0.1, -0.2]
    assert list(r.completion.log_probs) == pytest.approx(lp)
    # each turn's reward on its last model token (its stop token)
    assert list(r.token_rewards) == [0, 0, 0.25, 0, 0, 0, 0, 0.5, 0, 0, 0, 0, 1.0]
    assert r.reward == 1.75 and r.turns == 3 and r.finish_reason == "stop" and r.texts == ("bb", "f", "j")
    assert r.metrics == {"calls": 3.0} and r.observation_tokens == 6
    assert env.episodes[1].seen == ["bb", "f", "j"]


def test_a_turn_is_decoded_up_to_its_first_stop_token(char):
    eos = char.eos_token_id
    backend = Scripted([[ids_of(char, "12") + [eos] + ids_of(char, "9")]])
    env = Env(max_turns=1, done_at=1)
    results, _ = play(env, backend, char, env.train_examples(1, None), max_turns=1)
    assert env.episodes[0].seen == ["12"]


def test_sampled_ids_are_kept_where_decode_then_encode_would_change_them(chat):
    """Token-in/token-out: the chat tokenizer merges "What" into one token; a model that sampled
    it letter by letter keeps those ids. Re-tokenising the decoded transcript would give other ids."""
    letters = [i for c in "What" for i in ids_of(chat, c)]
    assert ids_of(chat, "What") != letters and chat.decode(letters) == "What"  # decode → encode is not the identity
    end = chat.convert_tokens_to_ids("<|im_end|>")
    backend = Scripted([[letters + [end]], [letters + [end]]])
    env = Env(max_turns=2, done_at=2)
    ex = Example(prompt=({"role": "user", "content": "0+1="},), answer="1")
    results, _ = play(env, backend, chat, [ex], max_turns=2)
    c = results[0].completion
    model = [t for t, m in zip(c.token_ids, c.model_mask) if m]
    assert model == (letters + [end]) * 2 and env.episodes[0].seen == ["What", "What"]
    ids = list(c.prompt_ids) + list(c.token_ids)
    retokenised = list(chat(chat.decode(ids), add_special_tokens=False).input_ids)
    assert retokenised != ids  # what re-tokenising the transcript would have trained on


def test_a_chat_observation_is_the_templates_own_suffix(chat):
    end = chat.convert_tokens_to_ids("<|im_end|>")
    turn = lambda s: ids_of(chat, s) + [end]  # noqa: E731
    backend = Scripted([[turn("7")], [turn("8")]])
    env = Env(max_turns=2, done_at=2, obs="wrong", role="tool")
    msgs = ({"role": "user", "content": "3+4="},)
    results, _ = play(env, backend, chat, [Example(prompt=msgs, answer="7")], max_turns=2)
    c = results[0].completion
    full = _ids(chat.apply_chat_template(
        [*msgs, {"role": "assistant", "content": "7"}, {"role": "tool", "content": "wrong"}, {"role": "assistant", "content": "8"}],
        tokenize=True))
    # the template writes "<|im_end|>\n" after a message: the rollout stopped at <|im_end|>
    assert list(c.prompt_ids) + list(c.token_ids) + ids_of(chat, "\n") == full
    obs = [not m for m in c.model_mask]
    assert chat.decode([t for t, o in zip(c.token_ids, obs) if o]) == "\n<|im_start|>tool\nwrong<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_rewrites_history_is_refused(chat):
    tok = build_chat_tokenizer()
    tok.chat_template = (  # drops earlier assistant turns, as thinking templates drop old reasoning
        "{%- for message in messages %}{%- if message['role'] != 'assistant' or loop.last %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    end = tok.convert_tokens_to_ids("<|im_end|>")
    backend = Scripted([[ids_of(tok, "7") + [end]]])
    with pytest.raises(PromptError, match=r"environment 'fake': the chat template of .* rewrites earlier turns .* prompts as strings"):
        play(Env(max_turns=2), backend, tok, [Example(prompt=({"role": "user", "content": "3+4="},), answer="7")], max_turns=2)


def test_turn_limit_ends_with_its_reward_and_reason(char):
    eos = char.eos_token_id
    t = ids_of(char, "x") + [eos]
    backend = Scripted([[t], [t]])
    env = Env(max_turns=9, rewards=(0.25, 0.5, 1.0), done_at=3)
    results, _ = play(env, backend, char, env.train_examples(1, None), max_turns=2, turn_limit_reward=-1.0)
    r = results[0]
    assert r.finish_reason == "max_turns" and r.turns == 2
    assert r.reward == pytest.approx(0.25 + 0.5 - 1.0)
    assert list(r.token_rewards)[-1] == pytest.approx(0.5 - 1.0)  # on the last model token
    assert len(backend.calls) == 2


def test_the_token_budget_caps_turns_and_an_overflowing_observation_ends_the_episode(char):
    eos = char.eos_token_id
    # budget 10: turn 1 samples ≤ min(8, 10) = 8 → 3 tokens; obs 3 → 6 used; turn 2 cap min(8, 4) = 4,
    # the backend is asked for max over the live episodes and the answer is cut to 4 ("length")
    backend = Scripted([[ids_of(char, "ab") + [eos]], [ids_of(char, "cdefg") + [eos]]])
    env = Env(max_turns=5, done_at=5)
    results, _ = play(env, backend, char, env.train_examples(1, None), max_turns=5, max_episode_tokens=10, overflow_reward=-2.0)
    r = results[0]
    assert backend.calls[1][1].max_new_tokens == 4
    assert list(r.completion.token_ids) == ids_of(char, "ab") + [eos] + ids_of(char, "ok:") + ids_of(char, "cdef")
    assert r.finish_reason == "overflow"  # the next observation (3 tokens) does not fit the 0 left
    assert r.reward == pytest.approx(0.25 + 0.5 - 2.0)
    assert len(r.completion.token_ids) <= 10


def test_an_observation_never_truncates_silently(char):
    eos = char.eos_token_id
    backend = Scripted([[ids_of(char, "a") + [eos]]])
    env = Env(max_turns=5, done_at=5, obs="a much longer observation")
    results, _ = play(env, backend, char, env.train_examples(1, None), max_turns=5, max_episode_tokens=12)
    r = results[0]
    assert r.finish_reason == "overflow" and list(r.completion.token_ids) == ids_of(char, "a") + [eos]
    assert not any(m is False for m in r.completion.model_mask)


def test_async_steps_are_awaited_together(char):
    eos = char.eos_token_id

    class Slow:
        def __init__(self):
            self.t = 0

        async def step(self, text):
            await asyncio.sleep(0.3)
            self.t += 1
            return Step(reward=float(self.t), done=True)

    class SlowEnv(Env):
        def start(self, example):
            return Slow()

    env = SlowEnv(max_turns=1)
    backend = Scripted([[ids_of(char, "a") + [eos]] * 8])
    t0 = time.perf_counter()
    results, _ = play(env, backend, char, env.train_examples(8, None), max_turns=1)
    assert time.perf_counter() - t0 < 1.2  # 8 × 0.3 s in sequence would be 2.4 s
    assert [r.reward for r in results] == [1.0] * 8


@pytest.mark.parametrize("bad,match", [
    (lambda text: 1 / 0, r"ZeroDivisionError"),
    (lambda text: "not a step", r"step returned str 'not a step', not an rllab.rollout.environment.Step"),
    (lambda text: Step(reward=float("nan")), r"Step.reward must be finite"),
    (lambda text: Step(observation=3), r"Step.observation must be a string or None"),
])
def test_a_failing_environment_is_named_with_the_example_and_turn(char, bad, match):
    eos = char.eos_token_id

    class Bad:
        def step(self, text):
            return bad(text)

    class BadEnv(Env):
        def start(self, example):
            return Bad()

    backend = Scripted([[ids_of(char, "5") + [eos]]])
    with pytest.raises(EpisodeError, match=r"environment 'fake' failed on example '0\+1=' at turn 1 \(model turn '5'\): .*" + match):
        play(BadEnv(), backend, char, BadEnv().train_examples(1, None))


def test_reward_errors_skip_and_zero_for_episodes(char):
    from rllab.rollout.stage import build_stage

    eos = char.eos_token_id

    class Flaky:
        def __init__(self, example):
            self.example = example

        def step(self, text):
            if self.example.answer == "1":
                raise RuntimeError("tool down")
            return Step(reward=1.0, done=True)

    class FlakyEnv(Env):
        def start(self, example):
            return Flaky(example)

    t = ids_of(char, "5") + [eos]
    for policy, kept in (("skip", [False, False, True, True]), ("zero", [True] * 4)):
        backend = Scripted([[t] * 4])
        stage = build_stage(env=FlakyEnv(max_turns=1), env_name="flaky", backend=backend, tokenizer=char, seed=0,
                             config=RolloutConfig(prompts_per_step=2, group_size=2, reward_errors=policy))
        scored = stage.sample(0)
        assert scored.keep.tolist() == kept
        assert [e.reward for e in scored.episodes] == [0.0, 0.0, 1.0, 1.0]
        assert scored.metrics["rollout/reward_errors"] == 2.0
        assert [e.finish_reason for e in scored.episodes] == ["abort", "abort", "stop", "stop"]
        assert "tool down" in scored.episodes[0].error


def test_an_environment_without_a_bound_on_its_turns_is_refused(char):
    from rllab.rollout.stage import build_stage

    with pytest.raises(ConfigError, match=r"environment 'loose' has max_turns = None: an episode needs a bound"):
        build_stage(env=Env(max_turns=None), env_name="loose", backend=Scripted([]), tokenizer=char, seed=0, config=RolloutConfig())
    stage = build_stage(env=Env(max_turns=None), env_name="loose", backend=Scripted([]), tokenizer=char, seed=0,
                         config=RolloutConfig(max_turns=4))
    assert stage.limits.max_turns == 4


# --------------------------------------------------------------------------- the kernel types


def test_token_rewards_sit_on_the_last_model_token_with_holes():
    mask = torch.tensor([[True, True, False, False, True, False], [True, False, False, False, False, False], [False] * 6])
    b = RolloutBatch(
        input_ids=torch.zeros(3, 8, dtype=torch.long), attention_mask=torch.ones(3, 8, dtype=torch.bool), response_mask=mask,
        rollout_log_prob=torch.zeros(3, 6), index=torch.tensor([0, 0, 1]), rewards=torch.tensor([2.0, 3.0, 4.0]),
    )
    expected = torch.zeros(3, 6)
    expected[0, 4], expected[1, 0] = 2.0, 3.0  # not at lengths − 1 (= 2, an observation token); no model token: none
    assert torch.equal(b.token_rewards, expected)
    placed = torch.rand(3, 6)
    assert b.__class__(**{**attrs.asdict(b, recurse=False), "turn_rewards": placed}).token_rewards is placed


def test_from_completions_with_episodes_and_select():
    c1 = Completion(prompt_ids=(5, 6), token_ids=(1, 2, 3, 4), log_probs=(-1.0, 0.0, 0.0, -2.0), finish_reason="stop",
                    model_mask=(True, False, False, True), prompt_index=0)
    c2 = Completion(prompt_ids=(7,), token_ids=(9,), log_probs=(-0.5,), finish_reason="length", prompt_index=1)
    b = RolloutBatch.from_completions([c1, c2], [1.5, 0.0], pad_token_id=0, turn_rewards=[[0.5, 0, 0, 1.0], [0.0]], turns=[2, 1])
    assert b.response_mask.tolist() == [[True, False, False, True], [True, False, False, False]]
    assert b.attention_mask.tolist() == [[True] * 6, [False, True, True, False, False, False]]
    assert b.input_ids.tolist() == [[5, 6, 1, 2, 3, 4], [0, 7, 9, 0, 0, 0]]
    assert b.rollout_log_prob.tolist() == [[-1.0, 0.0, 0.0, -2.0], [-0.5, 0.0, 0.0, 0.0]]
    assert b.token_rewards.tolist() == [[0.5, 0, 0, 1.0], [0, 0, 0, 0]]
    assert b.turns.tolist() == [2, 1]
    s = b.select(torch.tensor([1]))
    assert s.turns.tolist() == [1] and s.turn_rewards.shape == (1, 4)
    with pytest.raises(ValueError, match="model_mask"):
        Completion(prompt_ids=(), token_ids=(1,), log_probs=(0.0,), finish_reason="stop", model_mask=(True, False))


# --------------------------------------------------------------------------- demonstrations (warm start)


def test_demonstrations_are_played_against_the_environment(char):
    from rllab.rollout.demonstrations import encode_episodes

    env = Env(max_turns=3, done_at=3, obs="no")
    examples = env.train_examples(2, None)
    eps = demonstration_episodes(env, examples, PromptRenderer(char), name="fake")
    eos = char.eos_token_id
    want = ids_of(char, "1") + [eos] + ids_of(char, "no") + ids_of(char, "2") + [eos] + ids_of(char, "no") + ids_of(char, "3") + [eos]
    assert [list(e.completion.token_ids) for e in eps] == [want, want]
    assert env.episodes[0].seen == ["1", "2", "3"]
    ids, att, loss = encode_episodes(char, env, examples, renderer=PromptRenderer(char))
    P = len(char("0+1=").input_ids)
    row = ids[0, : P + len(want)].tolist()
    assert row == list(char("0+1=").input_ids) + want
    targets = [row[j + 1] for j in range(len(row) - 1) if loss[0, j]]
    assert targets == [t for t, m in zip(want, eps[0].completion.model_mask) if m]  # model tokens only
    with pytest.raises(rllab.RllabError, match=r"demonstration of example '0\+1=' has 3 model turn\(s\), but its episode did not end"):
        demonstration_episodes(Env(max_turns=5, done_at=4), examples, PromptRenderer(char), name="fake")


# --------------------------------------------------------------------------- config and registry


def env_plugin(name="tiny_env", register_task=False):
    class P:
        @staticmethod
        @rllab.hookimpl
        def register_environments(register):
            register(name, lambda *, config: Env(max_turns=2))

    if register_task:
        @rllab.hookimpl
        def register_tasks(register):
            register(name, lambda *, config: None)

        P.register_tasks = staticmethod(register_tasks)
    P.__name__ = f"plugin_{name}"
    return P


def test_env_selects_an_environment_and_excludes_task():
    lab = rllab.Lab([env_plugin()])
    assert "tiny_env" in lab.names("environment")
    cfg = load_config(None, ["env=tiny_env"], lab=lab)
    assert cfg.source == "env" and "task" not in cfg.components and cfg.to_dict()["env"] == {"name": "tiny_env"}
    assert load_config(None, [], lab=lab).source == "task"
    with pytest.raises(ConfigError, match=r"both task 'addition' and env 'tiny_env' are set"):
        load_config(None, ["env=tiny_env", "task=addition"], lab=lab)
    with pytest.raises(ConfigError, match=r"\[env\] is set, but algorithm 'dpo' does not use it"):
        load_config(None, ["env=tiny_env", "algorithm=dpo"], lab=lab)


def test_a_task_and_an_environment_of_one_name_are_refused_at_load():
    class Other:
        @staticmethod
        @rllab.hookimpl
        def register_tasks(register):
            register("clash", lambda *, config: None)

    with pytest.raises(DuplicateComponentError, match=r"'clash' is registered both as a task \(plugin 'Other'\) and as an environment \(plugin 'plugin_clash'\)"):
        rllab.Lab([Other, env_plugin("clash")])
    lab = rllab.Lab([Other, env_plugin("clash")], strict=False)
    assert any("'clash' is registered both" in p for p in lab.problems)


# --------------------------------------------------------------------------- real backends


@pytest.fixture(scope="module")
def tiny():
    from rllab.models.tiny import TinyModelConfig, build_tiny_model

    model, tok = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, seed=3))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def test_a_single_turn_batch_is_the_one_main_produced(tiny):
    """A task's rollout through the episode loop equals, bit for bit, generate → score → from_completions."""
    from rllab.rollout.stage import build_stage

    model, tok = tiny
    lab = rllab.Lab()
    task = lab.get("task", "addition")()
    cfg = RolloutConfig(prompts_per_step=3, group_size=4, max_new_tokens=4, overlong_buffer=2)

    def stage():
        backend = lab.get("rollout_backend", "hf", num_threads=1)()
        backend.update_weights(model)
        return build_stage(task=task, task_name="addition", backend=backend, tokenizer=tok, config=cfg, seed=11)

    s = stage()
    batch = s.to_batch(s.sample(2))
    ref = stage()  # main's path: one generate, score, shape, pad
    from rllab.algorithm import seed_for

    examples = task.train_examples(3, torch.Generator().manual_seed(seed_for(11, 2, 0)))
    comps = ref.generate(examples, ref.sampling_params(2, n=4))
    rewards, keep, _ = ref.score(examples, comps)
    scores = torch.tensor(rewards, dtype=torch.float32) + ref.overlong_penalty(comps)
    expected = RolloutBatch.from_completions(comps, scores, pad_token_id=tok.pad_token_id, turns=[1] * len(comps))
    for f in attrs.fields(RolloutBatch):
        a, b = getattr(batch, f.name), getattr(expected, f.name)
        assert (torch.equal(a, b) and a.dtype == b.dtype) if isinstance(a, torch.Tensor) else a == b, f.name
    assert batch.turn_rewards is None and batch.turns.tolist() == [1] * 12
    assert torch.equal(batch.token_rewards, expected.token_rewards)


def test_a_two_turn_episode_through_the_hf_backend(tiny):
    from rllab.rollout.stage import build_stage

    model, tok = tiny
    backend = rllab.Lab().get("rollout_backend", "hf", num_threads=1)()
    backend.update_weights(model)
    env = Env(max_turns=2, rewards=(0.25, 1.0), done_at=2)
    stage = build_stage(env=env, env_name="fake", backend=backend, tokenizer=tok, seed=0,
                         config=RolloutConfig(prompts_per_step=2, group_size=3, max_new_tokens=3))
    scored = stage.sample(0)
    batch = stage.to_batch(scored)
    assert batch.turns.tolist() == [2] * 6
    assert scored.metrics["env/turns"] == 2.0 and scored.metrics["env/calls"] == 12.0
    assert scored.metrics["rollout/accuracy"] == 1.0 and scored.metrics["rollout/reward"] == 1.25  # total ≥ 1: solved
    env.solved = lambda example, total: total > 2
    assert stage.sample(1).metrics["rollout/accuracy"] == 0.0
    assert scored.metrics["env/observation_tokens"] == len(ids_of(tok, "ok:"))
    assert torch.equal(batch.token_rewards.sum(-1), batch.rewards)
    # the rewards sit on model tokens, and observation tokens are holes
    assert bool((batch.token_rewards != 0).le(batch.response_mask).all())
    assert bool((~batch.response_mask & batch.attention_mask[:, -batch.response_length:]).any())
    assert stage.evaluate(4)["eval/turns"] == 2.0


def test_a_two_turn_episode_through_the_sglang_backend(tiny, tmp_path):
    from rllab.rollout.stage import build_stage
    from tests.sglang_standin import StandIn

    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with StandIn(tmp_path, lifetime_s=120) as server:
        backend = rllab.Lab().get("rollout_backend", "sglang", urls=server.url, backoff_s=0.01)()
        try:
            env = Env(max_turns=2, rewards=(0.25, 1.0), done_at=2)
            stage = build_stage(env=env, env_name="fake", backend=backend, tokenizer=tok, seed=0,
                                 config=RolloutConfig(prompts_per_step=2, group_size=2, max_new_tokens=3))
            scored = stage.sample(0)
        finally:
            backend.close()
        turn2 = [b for p, b in server.requests if p == "/generate"][1]
    batch = stage.to_batch(scored)
    assert batch.turns.tolist() == [2] * 4 and all(e.finish_reason in ("stop", "length") for e in scored.episodes)
    e = scored.episodes[0]
    n_first = e.completion.model_mask.index(False)
    sent = turn2["input_ids"] if isinstance(turn2["input_ids"][0], list) else [turn2["input_ids"]]
    assert list(e.completion.prompt_ids) + list(e.completion.token_ids[: n_first + len(ids_of(tok, "ok:"))]) in sent


def test_rllab_run_env_trains_a_few_steps(tmp_path, model_cache):
    from rllab.cli import main

    run = tmp_path / "run"
    rc = main(["run", "--plugin", str(RETRY_ENV), "env=retry_addition", "env.tries=2", "--steps", "3", "-q", "--run-dir", str(run),
               "rollout.prompts_per_step=4", "rollout.group_size=4", "train.eval_size=8"])
    assert rc == 0
    import json

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward" in r]
    assert len(steps) == 3 and all(1.0 <= r["env/turns"] <= 2.0 for r in steps)
    assert any(r["rollout/reward"] > 0 for r in steps) and any(r["env/wrong"] > 0 for r in steps)
    assert any("eval/turns" in r for r in rows)


def test_episode_limits_are_refused_for_a_task():
    with pytest.raises(ConfigError, match=r"\[rollout\] max_turns limits an environment's episodes, but this run samples task 'addition'"):
        load_config(None, ["rollout.max_turns=3"])


def test_overlong_shaping_counts_model_tokens_only(char):
    from rllab.rollout.stage import build_stage

    stage = build_stage(env=Env(), env_name="fake", backend=Scripted([]), tokenizer=char, seed=0,
                         config=RolloutConfig(max_new_tokens=4, overlong_buffer=2, overlong_penalty=1.0))
    c = Completion(prompt_ids=(1,), token_ids=(5, 6, 7, 8, 9, 10), log_probs=(0.0,) * 6, finish_reason="stop",
                   model_mask=(True, False, False, False, True, True))
    # 3 model tokens: 1 past the expected 4 − 2 → −1/2 (6 tokens would give −2)
    assert stage.overlong_penalty([c]).tolist() == [-0.5]


# --------------------------------------------------------------------------- the contract suite


def test_the_contract_suite_checks_environments():
    import random

    from rllab.testing import run_contract

    good = rllab.Lab([env_plugin("three_turns")])
    results = run_contract(good, "environment", "three_turns", {})
    assert [r.passed for r in results] == [True] * len(results) and len(results) == 5, [r.message for r in results]

    class Moody(Env):
        def start(self, example):
            return Turns(rewards=(random.random(), 0.5, 1.0), done_at=3)

    class P:
        @staticmethod
        @rllab.hookimpl
        def register_environments(register):
            register("moody", lambda *, config: Moody(max_turns=3))

    failed = {r.check: r.message for r in run_contract(rllab.Lab([P]), "environment", "moody", {}) if not r.passed}
    assert list(failed) == ["deterministic examples and episodes given a seed"]


def test_record_and_replay_keep_an_episodes_batch(tmp_path, model_cache):
    from rllab_suite.replay import load_record, record, replay_configs

    lab = rllab.Lab([str(RETRY_ENV)])
    overrides = ["env=retry_addition", "env.tries=2", "rollout.prompts_per_step=2", "rollout.group_size=2"]
    record(None, steps=1, out=tmp_path / "rec.pt", overrides=overrides, lab=lab)
    data = load_record(tmp_path / "rec.pt")
    batch = data["batches"][0]["batch"]
    several = bool((batch["turns"] > 1).any())  # a row of several turns: every row's rewards placed per turn
    assert (batch["turn_rewards"] is not None) == several
    assert not several or batch["turn_rewards"].shape == batch["response_mask"].shape
    cfg = load_config(None, overrides, lab=lab).to_dict()
    (result,) = replay_configs(data, [("same", cfg)], lab=lab)
    assert math.isfinite(result.metrics["loss/policy"])


def test_start_failures_bad_metrics_and_a_silent_chat_step_are_environment_errors(char, chat):
    eos = char.eos_token_id

    class NoStart(Env):
        def start(self, example):
            raise KeyError("no board")

    with pytest.raises(EpisodeError, match=r"environment 'fake' failed on example '0\+1=' when starting its episode: KeyError"):
        play(NoStart(), Scripted([]), char, NoStart().train_examples(1, None))

    class Words(Env):
        def start(self, example):
            return type("E", (), {"step": lambda self, text: Step(reward=1.0, done=True, metrics={"calls": "many"})})()

    with pytest.raises(EpisodeError, match=r"at turn 1 \(model turn '5'\): TypeError: Step.metrics\['calls'\] = 'many' is a str, not a number"):
        play(Words(), Scripted([[ids_of(char, "5") + [eos]]]), char, Words().train_examples(1, None))

    class Silent(Env):
        def start(self, example):
            return type("E", (), {"step": lambda self, text: Step(reward=0.0)})()

    end = chat.convert_tokens_to_ids("<|im_end|>")
    ex = Example(prompt=({"role": "user", "content": "3+4="},), answer="7")
    with pytest.raises(EpisodeError, match=r"neither ended the episode nor gave an observation"):
        play(Silent(), Scripted([[ids_of(chat, "7") + [end]]]), chat, [ex])
    (r,), _ = play(Silent(), Scripted([[ids_of(chat, "7") + [end]]]), chat, [ex], on_error="zero")
    assert r.finish_reason == "abort" and r.reward == 0.0


def test_a_dropped_completion_drops_its_episode_and_counters_add_over_turns(char):
    eos = char.eos_token_id
    t = ids_of(char, "x") + [eos]

    class Dropping(Scripted):
        def generate(self, prompts, params):
            out = super().generate(prompts, params)
            return out[1:] if len(self.calls) == 2 else out  # the second turn loses episode 0's sample (stale)

        def last_metrics(self):
            return {"sglang/requests": 1.0, "rollout/stale_total": float(len(self.calls))}

    backend = Dropping([[t, t, t], [t, t, t]])
    env = Env(max_turns=2, done_at=2)
    results, r = play(env, backend, char, env.train_examples(3, None), max_turns=2)
    assert [e.completion.prompt_index for e in results] == [1, 2] and all(e.turns == 2 for e in results)
    assert r.backend_metrics == {"sglang/requests": 2.0, "rollout/stale_total": 2.0}
    class Twice(Scripted):
        def generate(self, prompts, params):
            return super().generate(prompts, params) * 2

    with pytest.raises(rllab.RllabError, match="more completions for prompt 0 than were asked"):
        play(env, Twice([[t]]), char, env.train_examples(1, None))


def test_environment_settings_are_checked_at_load():
    class Unbounded(Env):
        max_turns = 0

    class P:
        @staticmethod
        @rllab.hookimpl
        def register_environments(register):
            register("unbounded", Unbounded)

    lab = rllab.Lab([P])
    with pytest.raises(ConfigError, match=r"environment 'unbounded' \(plugin P\) declares max_turns = 0"):
        load_config(None, ["env=unbounded"], lab=lab)
    assert load_config(None, ["env=unbounded", "rollout.max_turns=2"], lab=lab).rollout.max_turns == 2
    with pytest.raises(ConfigError, match=r"overflow_reward = nan must be a finite number"):
        load_config(None, ["env=unbounded", "rollout.max_turns=2", "rollout.overflow_reward=nan"], lab=lab)


def test_the_warm_start_cache_keeps_environments_apart(tmp_path):
    from rllab.models.tiny import TinyModelConfig, WarmStartConfig, get_or_build

    small = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)
    warm = WarmStartConfig(steps=0, eval_limit=0)
    task = rllab.Lab().get("task", "addition")()
    as_task = get_or_build(small, task, {"name": "same"}, warm, cache_dir=tmp_path, progress=False)
    as_env = get_or_build(small, Env(), {"name": "same"}, warm, cache_dir=tmp_path, progress=False)
    other = get_or_build(small, Env(), {"name": "same", "tries": 3}, warm, cache_dir=tmp_path, progress=False)
    assert len({as_task, as_env, other}) == 3
    import json

    assert json.loads((as_env / "rllab_warm_start.json").read_text())["task_config"] == {"name": "same", "kind": "environment"}


def test_the_models_context_bounds_an_environments_episodes(char):
    from rllab.rollout.episode_stats import episode_metrics
    from rllab.rollout.stage import build_stage

    eos = char.eos_token_id
    t = ids_of(char, "abc") + [eos]
    backend = Scripted([[t, t], [t, t]])
    env = Env(max_turns=5, done_at=5)
    # prompt "0+1=" is 5 ids with <bos>: a context of 15 leaves 10 response tokens: 4 + obs 3 + 3 (cut) — then the next obs overflows
    stage = build_stage(env=env, env_name="fake", backend=backend, tokenizer=char, seed=0, context_tokens=15,
                         config=RolloutConfig(prompts_per_step=1, group_size=2, max_new_tokens=8, overflow_reward=-1.0))
    episodes = stage.play(env.train_examples(1, None), stage.sampling_params(0, n=2))
    for e in episodes:
        assert len(e.completion.prompt_ids) + len(e.completion.token_ids) <= 15 and e.finish_reason == "overflow"
    assert episode_metrics(episodes)["env/context_overflows"] == 2.0 and [e.reward for e in episodes] == [0.25 + 0.5 - 1.0] * 2
    # a step whose every episode overflowed has nothing to learn from: it stops, naming the budget
    stage.backend = Scripted([[t, t], [t, t]])
    with pytest.raises(ConfigError, match="overflowing its token budget.*the model's context of 15 tokens"):
        stage.sample(0)


def test_a_prompt_as_long_as_the_context_is_refused_naming_the_example():
    """A prompt that leaves the model no room for a turn is an error naming the environment, the
    example and the lengths, not a turn sampled past the model's context."""
    from rllab.rollout.stage import build_stage

    char = build_tokenizer()
    stage = build_stage(env=Env(max_turns=2), env_name="fake", backend=Scripted([]), tokenizer=char, seed=0,
                         context_tokens=5, config=RolloutConfig(prompts_per_step=1, group_size=2, max_new_tokens=8))
    with pytest.raises(PromptError, match=r"environment 'fake'.*'0\+1=' is 5 tokens.*context of 5"):
        stage.sample(0)


def test_the_documented_example_environment_passes_the_contract_suite(tmp_path):
    """docs/environments.md's complete example, written out as a plugin file, loads and passes `rllab check`."""
    import re

    from rllab.testing import run_contract

    doc = (ROOT / "docs" / "environments.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "register_environments" in b and "class RetryAddition" in b)
    path = tmp_path / "documented_env.py"
    path.write_text(code)
    results = run_contract(rllab.Lab([str(path)]), "environment", "retry_addition", {"tries": 3})
    assert all(r.passed for r in results) and len(results) == 5, [(r.check, r.message) for r in results]
