"""Chat-format prompts: the message type, its checks, and rendering with a tokenizer's template.

A task's :class:`rllab.types.Example` gives its ``prompt`` either as a plain string (tokenized
as it is, ``<bos>`` and all, exactly as before) or as **chat messages**: a tuple of mappings
``{"role": str, "content": str}`` with roles ``system``, ``user``, ``assistant`` or ``tool``
(a list is accepted and stored as a tuple of plain dicts)::

    Example(prompt=({"role": "user", "content": "What is 2+3?"},), answer="5")

:class:`PromptRenderer` turns either form into the token ids the policy sees and is trained on
(token-in/token-out: the ids are never decoded and re-encoded):

- **messages** are rendered with the tokenizer's own chat template,
  ``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``; a system
  prompt (``rollout.system_prompt``) is prepended when the messages have no system message.
  A tokenizer without a chat template refuses messages with an error naming the task and model.
- **a string** is tokenized as it is (``tokenizer(prompt).input_ids``), unless a system prompt
  is set: then the string becomes the user message after that system prompt and is rendered
  with the template (a tokenizer without a template refuses the system prompt).

**Stop tokens.** A chat model ends its turn with a token of its own (``<|im_end|>`` for Qwen,
``<|eot_id|>`` for Llama 3), which is often not its ``eos_token``. :func:`end_of_turn_ids`
finds it by rendering a one-exchange probe conversation and taking the first special token
after the assistant's text; the renderer's :attr:`~PromptRenderer.stop_ids` are EOS followed by
those, and both sampling (``SamplingParams.stop_token_ids``) and decoding stop at any of them.
A tokenizer without a template stops at EOS only, as before.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from rllab.errors import PromptError
from rllab.types import (  # noqa: F401  (re-exported: where they were)
    ROLES,
    Messages,
    check_messages,
    check_prompt,
    is_messages,
)

def prompt_key(prompt: str | Messages) -> str:
    """A string identifying a prompt: the string itself, or the messages as canonical JSON
    (what hash splits and de-duplication use)."""
    if isinstance(prompt, str):
        return prompt
    return json.dumps([dict(m) for m in prompt], sort_keys=True, ensure_ascii=False)


def prompt_text(prompt: str | Messages) -> str:
    """A readable one-line form of a prompt for messages and logs: the string, or
    ``role: content`` lines joined by `` | ``."""
    if isinstance(prompt, str):
        return prompt
    return " | ".join(f"{m['role']}: {m['content']}" for m in prompt)


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` has a chat template of its own."""
    return bool(getattr(tokenizer, "chat_template", None))


def _ids(out: Any) -> list[int]:
    """Token ids from ``apply_chat_template(tokenize=True)`` (a list, or a mapping with ``input_ids``)."""
    if isinstance(out, Mapping):
        out = out["input_ids"]
    return [int(t) for t in out]


def end_of_turn_ids(tokenizer: Any) -> tuple[int, ...]:
    """The special token(s) the chat template puts after an assistant turn (``<|im_end|>``...).

    Renders ``user: "x"``, ``assistant: "rllab-probe"`` with the template (as text) and takes the
    first special token after the assistant's content; () when the tokenizer has no template or
    the template writes no special token there.
    """
    if not has_chat_template(tokenizer):
        return ()
    marker = "rllab-probe"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}], tokenize=False
    )
    at = text.rfind(marker)
    if at < 0:
        return ()
    special = set(int(i) for i in tokenizer.all_special_ids) | set(
        int(i) for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(tok, "special", False)
    )
    for t in tokenizer(text[at + len(marker) :], add_special_tokens=False).input_ids:
        if int(t) in special:
            return (int(t),)
    return ()


class PromptRenderer:
    """Prompt → token ids for one tokenizer (see the module docstring).

    :param tokenizer: a Hugging Face tokenizer.
    :param system_prompt: prepended as a system message to chat prompts without one, and turns a
        string prompt into ``[system, user]`` messages; None: no system prompt.
    :param task_name: the task, for error messages.
    :param model_name: the model (its path or "the tiny model"), for error messages.
    """

    def __init__(self, tokenizer: Any, *, system_prompt: str | None = None, task_name: str = "?", model_name: str = "?"):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.task_name = task_name
        self.model_name = model_name
        self.chat = has_chat_template(tokenizer)
        if system_prompt is not None and not self.chat:
            raise PromptError(
                f"rollout.system_prompt is set but the tokenizer of {model_name} has no chat template to render it "
                f"with (task {task_name!r}); unset rollout.system_prompt or use a model with a chat template"
            )
        self.end_of_turn = end_of_turn_ids(tokenizer)
        eos = tokenizer.eos_token_id
        stops = ([] if eos is None else [int(eos)]) + [t for t in self.end_of_turn if t != eos]
        self.stop_ids: tuple[int, ...] = tuple(stops)
        """EOS, then the template's end-of-turn tokens: where sampling and decoding stop."""

    def messages(self, prompt: str | Messages, *, where: str = "") -> Messages | None:
        """The messages a prompt is rendered from (None: a string tokenized as it is)."""
        if isinstance(prompt, str):
            if self.system_prompt is None:
                return None
            return ({"role": "system", "content": self.system_prompt}, {"role": "user", "content": prompt})
        where = where or f"task {self.task_name!r}: prompt {prompt_text(prompt)!r}"
        msgs = check_messages(prompt, where=where)
        if not self.chat:
            raise PromptError(
                f"{where} is given as chat messages but the tokenizer of {self.model_name} has no chat template; "
                f"use a model with one (e.g. model.tiny = {{tokenizer = \"chat\"}} for the tiny model) or give the prompt as a string"
            )
        if self.system_prompt is not None and msgs[0]["role"] != "system":
            msgs = ({"role": "system", "content": self.system_prompt}, *msgs)
        return msgs

    def encode(self, prompt: str | Messages, *, where: str = "") -> list[int]:
        """The token ids of a prompt, ready for generation (the template's generation prompt included)."""
        msgs = self.messages(prompt, where=where)
        if msgs is None:
            return list(self.tokenizer(prompt).input_ids)
        return _ids(
            self.tokenizer.apply_chat_template([dict(m) for m in msgs], add_generation_prompt=True, tokenize=True)
        )

    def response_ids(self, text: str, *, prompt: str | Messages | None = None) -> list[int]:
        """Token ids of a response text to ``prompt``, ending as a sampled one would: with the
        template's end-of-turn token when the prompt is rendered with the chat template, else EOS."""
        templated = prompt is not None and self.end_of_turn and (not isinstance(prompt, str) or self.system_prompt is not None)
        end = self.end_of_turn[0] if templated else self.tokenizer.eos_token_id
        return list(self.tokenizer(text, add_special_tokens=False).input_ids) + [end]

    def cut(self, ids: Sequence[int]) -> list[int]:
        """``ids`` up to (not including) the first stop token."""
        ids = list(ids)
        stops = set(self.stop_ids)
        for i, t in enumerate(ids):
            if t in stops:
                return ids[:i]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of response ids up to the first stop token (special tokens dropped)."""
        return self.tokenizer.decode(self.cut(ids), skip_special_tokens=True)
