"""A job with chat-message prompts, end to end on the locally built chat model (CPU)."""

from __future__ import annotations

import json
import math

import pytest

from rllab.config import load_config
from rllab.errors import PromptError
from rllab.training.trainer import Trainer

from .tiny import TINY, overrides


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "sums.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "answer": str(a + b)}
        for a in range(10) for b in range(10)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _cfg(path, *extra):
    return load_config(
        None,
        [*overrides(TINY), "task=jsonl", f"task.path={json.dumps(str(path))}", "task.reward=numeric",
         "train.steps=2", "model.warm_start.steps=30", "rollout.max_new_tokens=4", *extra],
    )


def test_a_chat_task_trains_on_the_chat_model(tmp_path, chat_file):
    cfg = _cfg(chat_file, 'model.tiny.tokenizer="chat"', 'rollout.system_prompt="Answer with the number."')
    tr = Trainer(cfg, run_dir=tmp_path, progress=False)
    try:
        im_end = tr.tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert tr.tokenizer.chat_template and tr.rollout.renderer.stop_ids == (tr.tokenizer.eos_token_id, im_end)
        assert im_end in tr.backend.eos_ids  # the model's own generation config ends turns too
        ex = tr.task.eval_examples()[0]
        text = tr.tokenizer.decode(tr.rollout.encode(ex.prompt))
        assert text.startswith("<|im_start|>system\nAnswer with the number.<|im_end|>\n<|im_start|>user\nWhat is ")
        assert text.endswith("<|im_start|>assistant\n")
        for _ in range(2):
            m = tr.train_step()
            assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m
            assert "rollout/reward" in m
        scored = tr.rollout.sample(5)
        for c in scored.completions:
            prompt = tr.rollout.encode(scored.examples[c.prompt_index].prompt)
            assert list(c.prompt_ids) == prompt  # token-in: the rendered ids are what is sampled from
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in tr.rollout.renderer.stop_ids
        assert "eval/accuracy" in tr.rollout.evaluate(8)
    finally:
        tr.close()


def test_chat_prompts_on_a_model_without_a_template_are_refused(tmp_path, chat_file):
    with pytest.raises(PromptError, match=r"task 'jsonl'.*chat messages.*the tiny model has no chat template.*tokenizer = \"chat\""):
        Trainer(_cfg(chat_file), run_dir=tmp_path, progress=False)


def test_offline_dpo_reads_chat_pairs_rendered_with_the_template(tmp_path, chat_file):
    """A pairs file whose prompts are messages: prompts rendered, responses end their turn."""
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"What is {a}+1?"}], "chosen": str(a + 1), "rejected": str(a)} for a in range(8)]
    pairs.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = _cfg(chat_file, 'model.tiny.tokenizer="chat"', 'rollout.system_prompt="Answer with the number."',
               "algorithm=dpo", f"algorithm.pairs_file={json.dumps(str(pairs))}", "algorithm.batch_size=4")
    tr = Trainer(cfg, run_dir=tmp_path / "run", progress=False)
    try:
        m = tr.train_step()
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m
        prompt, chosen, rejected = tr.algorithm._pairs[0]
        im_end = tr.tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert prompt == tr.rollout.encode(rows[0]["prompt"])
        assert tr.tokenizer.decode(prompt).endswith("What is 0+1?<|im_end|>\n<|im_start|>assistant\n")
        assert chosen[-1] == im_end and rejected[-1] == im_end
        assert tr.tokenizer.decode(chosen[:-1]) == "1"
    finally:
        tr.close()
