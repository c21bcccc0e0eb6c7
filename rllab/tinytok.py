"""The tiny model's tokenizers, built locally with the ``tokenizers`` library (nothing from a hub).

- :func:`build_tokenizer` (``model.tiny.tokenizer = "char"``, the default) — one token per
  character, ``<bos>`` prepended; no chat template, so prompts are plain strings.
- :func:`build_chat_tokenizer` (``model.tiny.tokenizer = "chat"``) — a byte-level BPE trained
  on :data:`CHAT_CORPUS` (a fixed text, so the vocabulary is the same on every machine), with
  Qwen2's special tokens ``<|endoftext|>`` (EOS and padding), ``<|im_start|>``, ``<|im_end|>``
  (end of turn) and a Qwen2-style Jinja chat template (:data:`CHAT_TEMPLATE`). It makes the
  chat-prompt path (:mod:`rllab.chat`) run end to end on a CPU as with a real instruct model.
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
"""Most tokens of the chat tokenizer (256 byte tokens, 3 special tokens, then learnt merges)."""
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
    """A byte-level BPE ``PreTrainedTokenizerFast`` with a Qwen2-style chat template.

    Ids: ``<|endoftext|>`` 0 (EOS and padding), ``<|im_start|>`` 1, ``<|im_end|>`` 2, then the
    256 byte tokens and the merges learnt from :data:`CHAT_CORPUS` (deterministic: the same
    vocabulary on every machine). No ``<bos>`` is added, as with Qwen2. Any text encodes (byte
    fallback), and ``decode`` gives the text back.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CHAT_VOCAB_SIZE,
        special_tokens=list(CHAT_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    core.train_from_iterator(CHAT_CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=ENDOFTEXT, pad_token=ENDOFTEXT, padding_side="left",
        additional_special_tokens=[IM_START, IM_END],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


TOKENIZERS = {"char": build_tokenizer, "chat": build_chat_tokenizer}
"""The tiny model's tokenizers by the name ``model.tiny.tokenizer`` takes."""
