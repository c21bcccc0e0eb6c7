"""Writing a model as a Hugging Face model directory that transformers loads with nothing from rllab.

:func:`write_model_dir` writes the weights (safetensors), ``config.json``, the generation config
and the tokenizer, and checks the tokenizer by reloading it through ``AutoTokenizer``
(:func:`check_tokenizer`). The tiny model's character tokenizer has no class of its own that
``AutoTokenizer`` picks for a Qwen2 directory (it would load Qwen2's byte-level BPE, which drops
spaces), so it is written as that BPE with no merges and every character a byte-level token of
its own (:func:`hf_tokenizer`): the same ids for every character the tiny tokenizer knows
(a character outside them, which it encodes as ``<unk>``, has no token there).
Used by :mod:`rllab.training.export` (``rllab export``) and by a finished full fine-tune
(``RUN_DIR/model``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from rllab.errors import RllabError

CONFIG_NAME = "rllab_config.toml"
"""The run's config, written beside an exported model (``rllab eval DIR`` reads its task from it)."""
MODEL_DIR = "model"
"""``RUN_DIR/model``: a finished full fine-tune's final policy."""
PROBE = "What is 12 + 345? Answer: 357.\nReverse 'abc' -> cba; sort [3, 1, 2] = [1, 2, 3]!"
"""Text every exported tokenizer must encode as the run's does."""


def _byte_level() -> dict[int, str]:
    """The byte → character table of byte-level BPE (GPT-2's): printable bytes stand for
    themselves, the others for characters from U+0100 on (space → ``Ġ``, newline → ``Ċ``)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def hf_tokenizer(tokenizer: Any, model_type: str) -> Any:
    """A tokenizer that ``AutoTokenizer`` reloads from a ``model_type`` directory encoding as
    ``tokenizer`` does: ``tokenizer`` itself, or — for the tiny model's character tokenizer, which
    ``AutoTokenizer`` would load as Qwen2's BPE — that BPE with each character a token of its own
    (byte-level names, the same ids; no merges) and ``<bos>`` prepended as before."""
    import json

    generic = type(tokenizer).__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = json.loads(backend.to_str())["model"] if backend is not None else {}
    if not (generic and model_type == "qwen2" and model.get("type") == "WordLevel"):
        return tokenizer
    from transformers import Qwen2Tokenizer

    special = set(tokenizer.all_special_tokens)
    table = _byte_level()
    vocab = {tok if tok in special else "".join(table[b] for b in tok.encode("utf-8")): i for tok, i in model["vocab"].items()}
    return Qwen2Tokenizer(
        vocab=vocab, merges=[], bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token, pad_token=tokenizer.pad_token,
        unk_token=tokenizer.unk_token, padding_side=tokenizer.padding_side, add_bos_token=tokenizer.bos_token is not None,
    )


def check_tokenizer(out: Path, tokenizer: Any, texts: list[str] = ()) -> None:
    """Refuse (:class:`RllabError`) a written directory whose tokenizer, reloaded by ``AutoTokenizer``,
    encodes :data:`PROBE` (and ``texts``) differently from ``tokenizer``."""
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(out)
    for text in [PROBE, *texts]:
        want, got = tokenizer(text).input_ids, reloaded(text).input_ids
        if list(want) != list(got):
            raise RllabError(f"the tokenizer written to {out} encodes {text!r} as {list(got)[:12]}… where the run's gives "
                             f"{list(want)[:12]}… ({type(reloaded).__name__} from AutoTokenizer); the export is not usable as it is")


def write_model_dir(model: torch.nn.Module, tokenizer: Any, out: Path, *, state_dict: Mapping[str, torch.Tensor] | None = None,
                    config_text: str | None = None, check_texts: list[str] = ()) -> Path:
    """Write ``model`` (``state_dict``: its full weights, for a sharded one) and ``tokenizer`` as a
    Hugging Face model directory ``out`` (safetensors, config, generation config, tokenizer;
    ``config_text``: the run's config, as :data:`CONFIG_NAME`). Written to a temporary sibling and
    renamed into place; an existing ``out`` is replaced."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    from rllab.models.forward import transformers_progress_bars_off

    try:
        with transformers_progress_bars_off():  # rllab shows its own progress
            model.save_pretrained(tmp, **({"state_dict": dict(state_dict)} if state_dict is not None else {}))
        hf_tokenizer(tokenizer, model.config.model_type).save_pretrained(tmp)
        if config_text is not None:
            (tmp / CONFIG_NAME).write_text(config_text, encoding="utf-8")
        check_tokenizer(tmp, tokenizer, list(check_texts))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
