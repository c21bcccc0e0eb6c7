"""What a local Hugging Face model directory (``model.path``) must hold, checked before it loads.

rllab reads the model *and its tokenizer* from ``model.path`` (it has no separate tokenizer
setting). A directory missing either would load into something that fails much later (a
tokenizer built from ``config.json`` alone encodes every prompt to nothing), so
:func:`check_model_dir` refuses it first, naming the directory, what is missing and the fix.
No torch or transformers import: this is file-system inspection only.
"""

from __future__ import annotations

from pathlib import Path

from rllab.errors import ConfigError

VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")
"""Files of which a saved tokenizer holds at least one (besides ``tokenizer_config.json``)."""

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
"""Files of which a saved model holds at least one (sharded weights have the index)."""

SAVE_BOTH = (
    "Save the model and its tokenizer together: model.save_pretrained(DIR) and "
    "AutoTokenizer.from_pretrained(BASE_DIR).save_pretrained(DIR)"
)


def _listing(path: Path, limit: int = 8) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    shown = ", ".join(names[:limit]) + (f", … ({len(names)} entries)" if len(names) > limit else "")
    return shown or "nothing"


def check_model_dir(raw: str | Path, *, setting: str = "model.path") -> Path:
    """``raw`` as a path, refused (:class:`~rllab.errors.ConfigError` naming ``setting``) unless it
    is a directory holding ``config.json``, weights and a tokenizer.

    Each refusal names the directory and what it lacks: a path that does not exist, a file (the
    directory that holds it is meant), an empty directory, no ``config.json`` (a peft adapter
    directory is recognised), no weights, no tokenizer files.
    """
    path = Path(raw).expanduser()
    where = f"{setting} {str(raw)!r}"
    if not path.exists():
        hint = ""
        if not path.is_absolute() and len(path.parts) == 2 and not str(raw).startswith("."):
            hint = (
                f" rllab loads local directories only; a hub model is downloaded first "
                f"(huggingface-cli download {raw} --local-dir DIR) and model.path names DIR."
            )
        resolved = "" if path.is_absolute() else f" (resolved to {path.resolve()})"
        raise ConfigError(f"{where} does not exist{resolved}.{hint} "
                          "Give a local Hugging Face model directory, or leave model.path unset for the tiny model.", key="path")
    if not path.is_dir():
        raise ConfigError(f"{where} is a file, not a directory: model.path names the model's directory "
                          f"(here perhaps {str(path.parent)!r}), which holds config.json, the weights and the tokenizer.", key="path")
    if not any(path.iterdir()):
        raise ConfigError(f"{where} is an empty directory. {SAVE_BOTH}, or point model.path at the directory that has them.", key="path")
    files = {p.name for p in path.iterdir()}
    if "config.json" not in files:
        if "adapter_config.json" in files:
            raise ConfigError(
                f"{where} holds a LoRA adapter (adapter_config.json), not a model: merge it into its base model first "
                "(PeftModel.from_pretrained(base, DIR).merge_and_unload().save_pretrained(OUT), and save the base's "
                "tokenizer into OUT too), then set model.path to OUT.", key="path")
        raise ConfigError(f"{where} is not a Hugging Face model directory: it has no config.json (it holds "
                          f"{_listing(path)}). {SAVE_BOTH}.", key="path")
    if not (files & set(WEIGHT_FILES) or any(n.endswith(".safetensors") for n in files)):
        raise ConfigError(f"{where} has a config.json but no weights (none of {', '.join(WEIGHT_FILES)}; it holds "
                          f"{_listing(path)}). {SAVE_BOTH}.", key="path")
    if not files & {"tokenizer_config.json", *VOCABULARY_FILES}:
        raise ConfigError(
            f"{where} has a model but no tokenizer: none of tokenizer_config.json, {', '.join(VOCABULARY_FILES)} is "
            f"there (it holds {_listing(path)}). rllab reads the tokenizer from model.path (there is no separate "
            f"tokenizer setting): save the base model's tokenizer next to the weights, "
            f"AutoTokenizer.from_pretrained(BASE_DIR).save_pretrained({str(raw)!r}).", key="path")
    return path
