"""Calling a transformers model with a KV cache through the API the installed version has, and
calling peft without the deprecation it triggers in transformers.

transformers 5.24 renamed the cache argument and output of its models from ``past_key_values``
to ``cache`` (the old name still works there, with a ``FutureWarning`` on every call, and is
announced as removed in 5.40). rllab passes and reads the cache through these helpers, which use
``cache`` where the model takes it and ``past_key_values`` only where it does not (an older
transformers, or a model whose ``forward`` names only the old argument).

peft's ``PeftModel`` reads ``model.is_gradient_checkpointing``, which transformers 5.x renamed
``is_activation_checkpointing`` (the old name warns with a ``FutureWarning``): rllab cannot change
peft's call, so :func:`peft_deprecations_quiet` silences that one warning around it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import warnings
from typing import Any


@functools.lru_cache(maxsize=1)
def _installed_uses_cache() -> bool:
    """Whether the installed transformers' model outputs carry the cache as ``cache``."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}


def cache_argument(model: Any) -> str:
    """The name of ``model.forward``'s KV-cache argument: ``"cache"`` or ``"past_key_values"``.

    Read from the forward's signature when it names one of them; otherwise (a ``**kwargs``
    wrapper) from the installed transformers version.
    """
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    return "cache" if _installed_uses_cache() else "past_key_values"


def with_cache(name: str, cache: Any) -> dict:
    """The keyword arguments that pass ``cache`` (and ``use_cache=True``) under ``name``."""
    return {name: cache, "use_cache": True}


def output_cache(out: Any, name: str) -> Any:
    """The KV cache a forward returned, read under the same ``name`` it was passed as."""
    return getattr(out, name)


PEFT_CHECKPOINTING_WARNING = r"`is_gradient_checkpointing` is deprecated"
"""The start of the ``FutureWarning`` transformers 5.x gives when peft reads the old attribute name."""


@contextlib.contextmanager
def peft_deprecations_quiet():
    """Around a call into peft (``get_peft_model``): transformers' ``FutureWarning`` about
    ``is_gradient_checkpointing``, which peft reads, is not shown. Only that category and message;
    every other warning shows as the process's filters say."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PEFT_CHECKPOINTING_WARNING, category=FutureWarning)
        yield

