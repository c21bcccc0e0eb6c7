"""Chat-format prompts: the message checks, rendering with a chat template, stop tokens, and the
paths that turn prompts into ids (rollout stage, warm start, jsonl task, hash split)."""

import json
from types import SimpleNamespace

import pytest

from rllab.rollout.chat import PromptRenderer, check_messages, end_of_turn_ids, is_messages, prompt_key, prompt_text
from rllab.errors import PromptError
from rllab.settings import RolloutConfig
from rllab.rollout.stage import build_stage
from rllab.models.tiny import encode_demonstrations
from rllab.models.tokenizer import CHAT_TEMPLATE, build_chat_tokenizer, build_tokenizer
from rllab.types import Completion, Example, SamplingParams

USER = ({"role": "user", "content": "What is 3+4?"},)


@pytest.fixture(scope="module")
def chat_tok():
    return build_chat_tokenizer()


@pytest.fixture(scope="module")
def char_tok():
    return build_tokenizer()


# --------------------------------------------------------------------------- the message type


@pytest.mark.parametrize(
    "bad, says",
    [
        ([], "empty"),
        ({"role": "user", "content": "x"}, "a string or a list of chat messages"),
        ([{"role": "bot", "content": "x"}], "message 0 has role 'bot'"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": 3}], "message 1 (assistant) has content of type int"),
        ([{"role": "user"}], "content of type NoneType"),
        (["hello"], "message 0 is a str"),
        (7, "got int"),
    ],
)
def test_malformed_messages_are_refused_naming_the_message(bad, says):
    with pytest.raises(PromptError) as e:
        check_messages(bad, where="task 't' row 3")
    assert says in str(e.value) and "task 't' row 3" in str(e.value)
    if isinstance(bad, list) and bad:
        with pytest.raises(ValueError, match="Example.prompt"):
            Example(prompt=bad, answer="7")


def test_example_keeps_strings_and_stores_messages_as_a_tuple_of_dicts():
    assert Example(prompt="3+4=", answer="7").prompt == "3+4="
    src = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+4?", "name": "u"}]
    ex = Example(prompt=src, answer="7")
    assert ex.prompt == tuple(src) and isinstance(ex.prompt, tuple)
    assert is_messages(ex.prompt) and not is_messages("3+4=")
    src[0]["content"] = "changed"  # the example holds its own copies
    assert ex.prompt[0]["content"] == "Be brief."
    assert ex.prompt[1]["name"] == "u"  # extra keys reach the template


def test_prompt_key_and_text():
    assert prompt_key("3+4=") == "3+4=" and prompt_text("3+4=") == "3+4="
    a = ({"role": "user", "content": "x"},)
    b = ({"content": "x", "role": "user"},)
    assert prompt_key(a) == prompt_key(b) != prompt_key(({"role": "user", "content": "y"},))
    assert prompt_text(({"role": "system", "content": "s"}, {"role": "user", "content": "u"})) == "system: s | user: u"


# --------------------------------------------------------------------------- rendering


def test_string_prompts_encode_exactly_as_before(char_tok):
    r = PromptRenderer(char_tok)
    for p in ["3+4=", "reverse abc:", "", "make 10 from 2 5:"]:
        assert r.encode(p) == list(char_tok(p).input_ids)
    assert r.stop_ids == (char_tok.eos_token_id,)
    assert r.response_ids("7", prompt="3+4=") == list(char_tok("7", add_special_tokens=False).input_ids) + [char_tok.eos_token_id]
    ids = list(char_tok("12", add_special_tokens=False).input_ids)
    assert r.decode(ids + [char_tok.eos_token_id] + ids) == "12"


def test_messages_without_a_chat_template_are_refused_naming_task_and_model(char_tok):
    r = PromptRenderer(char_tok, task_name="mytask", model_name="model '/m/base'")
    with pytest.raises(PromptError, match=r"task 'mytask'.*chat messages.*model '/m/base' has no chat template"):
        r.encode(USER)
    with pytest.raises(PromptError, match=r"rollout.system_prompt.*model '/m/base' has no chat template.*task 'mytask'"):
        PromptRenderer(char_tok, system_prompt="Be brief.", task_name="mytask", model_name="model '/m/base'")


def test_chat_tokenizer_has_the_special_tokens_and_the_template(chat_tok):
    assert chat_tok.chat_template == CHAT_TEMPLATE
    for tok in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert len(chat_tok(tok, add_special_tokens=False).input_ids) == 1
    assert chat_tok.eos_token == "<|endoftext|>" and chat_tok.pad_token_id == chat_tok.eos_token_id
    text = "What is 12+34? ünïcode ∑"
    assert chat_tok.decode(chat_tok(text).input_ids) == text
    assert build_chat_tokenizer().get_vocab() == chat_tok.get_vocab()  # deterministic


def test_the_chat_tokenizer_reloads_from_a_model_directory_unchanged(chat_tok, tmp_path):
    """AutoTokenizer gives a Qwen2 directory a Qwen2Tokenizer: the reloaded one encodes the same ids."""
    from transformers import AutoTokenizer, Qwen2Config

    chat_tok.save_pretrained(tmp_path)
    Qwen2Config().save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    for text in ["What is 25+60?", "sort dcba:", "Hello, World!\n  x", "ünïcode ∑"]:
        assert again(text).input_ids == chat_tok(text).input_ids, text
    msgs = ({"role": "system", "content": "Be brief."},) + USER
    assert PromptRenderer(again).encode(msgs) == PromptRenderer(chat_tok).encode(msgs)
    assert PromptRenderer(again).stop_ids == PromptRenderer(chat_tok).stop_ids


def test_messages_render_with_the_template_and_a_generation_prompt(chat_tok):
    r = PromptRenderer(chat_tok)
    ids = r.encode(USER)
    assert ids == chat_tok.apply_chat_template(list(USER), add_generation_prompt=True, tokenize=True, return_dict=False)
    assert chat_tok.decode(ids) == "<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n"
    im_end = chat_tok.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn_ids(chat_tok) == (im_end,)
    assert r.stop_ids == (chat_tok.eos_token_id, im_end)
    seven = list(chat_tok("7", add_special_tokens=False).input_ids)
    assert r.response_ids("7", prompt=USER) == seven + [im_end]
    assert r.response_ids("7", prompt="3+4=") == seven + [chat_tok.eos_token_id]  # a raw prompt ends with EOS
    assert r.decode(seven + [im_end] + seven) == "7"
    assert r.encode("3+4=") == list(chat_tok("3+4=").input_ids)  # no system prompt: strings stay raw


def test_system_prompt_is_prepended_only_when_missing(chat_tok):
    r = PromptRenderer(chat_tok, system_prompt="Be brief.")
    head = "<|im_start|>system\nBe brief.<|im_end|>\n"
    assert chat_tok.decode(r.encode(USER)).startswith(head + "<|im_start|>user\n")
    own = ({"role": "system", "content": "Mine."},) + USER
    assert chat_tok.decode(r.encode(own)).startswith("<|im_start|>system\nMine.<|im_end|>\n<|im_start|>user")
    assert chat_tok.decode(r.encode("3+4=")) == head + "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    im_end = chat_tok.convert_tokens_to_ids("<|im_end|>")
    assert r.response_ids("7", prompt="3+4=")[-1] == im_end  # rendered with the template: ends its turn


# --------------------------------------------------------------------------- the paths that encode prompts


class _Recorder:
    """A backend that records the prompt ids and answers '7' then the stop token."""

    def __init__(self, answer_ids):
        self.answer_ids = answer_ids
        self.seen = []

    def generate(self, prompts, params: SamplingParams):
        self.seen.append(([list(p) for p in prompts], params))
        return [
            Completion(prompt_ids=tuple(p), token_ids=tuple(self.answer_ids), log_probs=(0.0,) * len(self.answer_ids),
                       finish_reason="stop", prompt_index=i)
            for i, p in enumerate(prompts) for _ in range(params.n)
        ]

    def last_metrics(self):
        return {}


class _ChatTask:
    def __init__(self):
        self.ex = [Example(prompt=[{"role": "user", "content": f"What is {i}+4?"}], answer=str(i + 4)) for i in range(4)]

    def train_examples(self, n, rng):
        return [self.ex[i % 4] for i in range(n)]

    def eval_examples(self):
        return list(self.ex)

    def reward(self, example, completion):
        return float(completion.strip() == example.answer)

    def demonstration(self, example):
        return example.answer


def _config(**kw):
    base = dict(prompts_per_step=2, group_size=2, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=-1,
                dynamic_sampling=False, overlong_buffer=0, overlong_penalty=1.0, reward_errors="raise", system_prompt=None)
    return RolloutConfig(**{**base, **kw})


def test_rollout_stage_trains_on_the_rendered_ids_and_stops_at_end_of_turn(chat_tok):
    im_end = chat_tok.convert_tokens_to_ids("<|im_end|>")
    backend = _Recorder(list(chat_tok("4", add_special_tokens=False).input_ids) + [im_end])
    stage = build_stage(task=_ChatTask(), task_name="chat", backend=backend, tokenizer=chat_tok,
                         config=_config(system_prompt="Be brief."), seed=0)
    scored = stage.sample(0)
    prompts, params = backend.seen[0]
    assert params.stop_token_ids == (chat_tok.eos_token_id, im_end)
    want = PromptRenderer(chat_tok, system_prompt="Be brief.").encode(_ChatTask().ex[0].prompt)
    assert prompts[0] == want and chat_tok.decode(want).startswith("<|im_start|>system\nBe brief.")
    assert [e.reward for e in scored.episodes] == [1.0, 1.0, 0.0, 0.0]  # '4' answers 0+4, not 1+4; im_end cut off
    batch = stage.to_batch(scored)
    row = batch.input_ids[0][batch.attention_mask[0]].tolist()
    assert row == want + backend.answer_ids  # token-in/token-out: exactly the rendered ids


def test_rollout_stage_with_a_string_task_keeps_eos_only(char_tok):
    task = SimpleNamespace(train_examples=lambda n, g: [Example(prompt="3+4=", answer="7")] * n,
                           reward=lambda e, c: float(c == e.answer))
    backend = _Recorder(list(char_tok("7", add_special_tokens=False).input_ids) + [char_tok.eos_token_id])
    stage = build_stage(task=task, task_name="t", backend=backend, tokenizer=char_tok, config=_config(), seed=0)
    assert [e.reward for e in stage.sample(0).episodes] == [1.0] * 4
    prompts, params = backend.seen[0]
    assert prompts[0] == list(char_tok("3+4=").input_ids) and params.stop_token_ids == (char_tok.eos_token_id,)


def test_demonstrations_end_with_the_end_of_turn_and_string_ones_are_unchanged(chat_tok, char_tok):
    ids, mask, loss = encode_demonstrations(char_tok, ["3+4="], ["7"])
    want = list(char_tok("3+4=").input_ids) + list(char_tok("7", add_special_tokens=False).input_ids) + [char_tok.eos_token_id]
    assert ids[0].tolist() == want and loss[0].tolist() == [False] * 4 + [True, True]
    ids, mask, loss = encode_demonstrations(chat_tok, [USER], ["7"])
    im_end = chat_tok.convert_tokens_to_ids("<|im_end|>")
    p = PromptRenderer(chat_tok).encode(USER)
    seven = list(chat_tok("7", add_special_tokens=False).input_ids)
    assert ids[0].tolist() == p + seven + [im_end]
    assert loss[0].sum().item() == len(seven) + 1 and loss[0, -1].item()


def test_jsonl_task_reads_messages_and_names_the_line_of_bad_ones(lab, tmp_path):
    path = tmp_path / "chat.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"What is {i}+1?"}], "answer": str(i + 1)} for i in range(40)]
    rows.append({"prompt": "2+2=", "answer": "4"})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = lab.get("task", "jsonl", path=str(path), eval_fraction=0.2)()
    everything = task.train + task.eval
    assert len(everything) == 41 and 0 < len(task.eval) < 41
    msgs = [e for e in everything if not isinstance(e.prompt, str)]
    assert len(msgs) == 40 and msgs[0].prompt[0]["role"] == "user"
    again = lab.get("task", "jsonl", path=str(path), eval_fraction=0.2)()
    assert [prompt_key(e.prompt) for e in again.eval] == [prompt_key(e.prompt) for e in task.eval]  # hash split is stable
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"prompt": [{"role": "robot", "content": "x"}], "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: prompt: message 0 has role 'robot'"):
        lab.get("task", "jsonl", path=str(bad))()
    bad.write_text(json.dumps({"prompt": {"role": "user", "content": "x"}, "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: prompt must be a string or a list of chat messages, got dict"):
        lab.get("task", "jsonl", path=str(bad))()


def test_eval_split_hashes_messages_by_content():
    from rllab_tasks.split import in_eval_split

    a = ({"role": "user", "content": "x"},)
    same = [{"content": "x", "role": "user"}]
    picks = [in_eval_split(({"role": "user", "content": f"q{i}"},), seed=0, eval_fraction=0.5) for i in range(200)]
    assert 50 < sum(picks) < 150
    assert in_eval_split(a, seed=0, eval_fraction=0.5) == in_eval_split(same, seed=0, eval_fraction=0.5)
