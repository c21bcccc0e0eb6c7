"""The tiny model's tokenizers, built locally with the ``tokenizers`` library (nothing from a hub).

- :func:`build_tokenizer` (``model.tiny.tokenizer = "char"``, the default) — one token per
  character, ``<bos>`` prepended; no chat template, so prompts are plain strings.
- :func:`build_chat_tokenizer` (``model.tiny.tokenizer = "chat"``) — a byte-level BPE of
  Qwen2's kind trained on :data:`CHAT_CORPUS` (a fixed text, so the vocabulary is the same on
  every machine), with
  Qwen2's special tokens ``<|endoftext|>`` (EOS and padding), ``<|im_start|>``, ``<|im_end|>``
  (end of turn) and a Qwen2-style Jinja chat template (:data:`CHAT_TEMPLATE`). It makes the
  chat-prompt path (:mod:`rllab.rollout.chat`) run end to end on a CPU as with a real instruct model.
"""

from __future__ import annotations

import string

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARACTERS = string.digits + string.ascii_letters + " " + string.punctuation + "\n"
"""Every character the character tokenizer knows; anything else encodes as ``<unk>``."""

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
CHAT_VOCAB_SIZE = 400
"""At most this many tokens in the chat tokenizer (3 special tokens, 256 byte tokens, then the
merges learnt; the small corpus stops it at 350)."""
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen2's ChatML layout: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, then
``<|im_start|>assistant\\n`` as the generation prompt."""
CHAT_CORPUS = (
    ["system user assistant tool You are a helpful assistant. Answer with the number only."] * 4
    + ["What is the answer? Reverse the string, sort the letters, make the target from the numbers."] * 4
    + [f"What is {a}+{b}? {a}+{b}={a + b}" for a in range(0, 100, 3) for b in range(0, 100, 7)]
)
"""The fixed text the chat tokenizer's merges are learnt from."""


def build_tokenizer():
    """A character-level ``PreTrainedTokenizerFast``: one token per character, ``<bos>`` prepended.

    Ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3, then :data:`CHARACTERS` in order.
    ``tokenizer(text).input_ids`` starts with ``<bos>``; pass ``add_special_tokens=False`` for
    the bare characters. Decoding concatenates characters (no spaces inserted).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
    return tokenizer


def build_chat_tokenizer():
    """A byte-level BPE tokenizer of transformers' ``Qwen2Tokenizer`` class, with a chat template.

    Ids: ``<|endoftext|>`` 0 (EOS and padding), ``<|im_start|>`` 1, ``<|im_end|>`` 2, then the
    256 byte tokens and the merges learnt from :data:`CHAT_CORPUS` (deterministic: the same
    vocabulary on every machine). The merges are learnt with Qwen2's own normaliser and
    pre-tokeniser (NFC; its split regex, which keeps each digit a token of its own; byte level),
    and the vocabulary and merges then make a ``Qwen2Tokenizer`` — the class ``AutoTokenizer``
    gives a saved Qwen2 model directory — so the tokenizer reloaded from the model directory
    encodes exactly as this one. No ``<bos>`` is added, as with Qwen2.
    """
    import json

    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    core = Tokenizer(models.BPE(unk_token=None))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=CHAT_VOCAB_SIZE,
        special_tokens=list(CHAT_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    core.train_from_iterator(CHAT_CORPUS, trainer)
    learnt = json.loads(core.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=learnt["vocab"], merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learnt["merges"]],
        eos_token=ENDOFTEXT, pad_token=ENDOFTEXT, unk_token=None, padding_side="left",
        additional_special_tokens=[IM_START, IM_END],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


TOKENIZERS = {"char": build_tokenizer, "chat": build_chat_tokenizer}
"""The tiny model's tokenizers by the name ``model.tiny.tokenizer`` takes."""
