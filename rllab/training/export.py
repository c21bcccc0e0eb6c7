"""A run's policy as a Hugging Face model directory: ``rllab export`` and ``RUN_DIR/model``.

:func:`export_run` reads a run directory's checkpoint (``checkpoints/step_N/state.pt``), puts its
policy weights into the run's base model (``model.path``, or the tiny model's cached directory,
:func:`base_model_dir`), merges LoRA adapters when the run trained them, and writes
(:func:`write_model_dir`)::

    OUT/config.json  model.safetensors  generation_config.json   the model (float32, as trained)
    OUT/tokenizer.json  tokenizer_config.json  [chat_template.jinja] the tokenizer
    OUT/rllab_config.toml                                         the run's config (its task, for rllab eval)

``AutoModelForCausalLM.from_pretrained(OUT)`` and ``AutoTokenizer.from_pretrained(OUT)`` load it
with nothing from rllab (the tiny model's character tokenizer is written in a form
``AutoTokenizer`` reloads as itself, and every export checks that it does:
:mod:`rllab.models.hfdir`).

A full fine-tune that finishes also writes ``RUN_DIR/model`` this way
(:meth:`rllab.training.parts.FullPolicy.save_final`); a LoRA run writes ``RUN_DIR/adapter``, which
``rllab export`` merges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rllab.errors import ConfigError, RllabError
from rllab.models.hfdir import CONFIG_NAME, MODEL_DIR, write_model_dir  # noqa: F401  (re-exported)


# --------------------------------------------------------------------------- the run's model


def base_model_dir(cfg: Any, source: Any, *, progress: bool = False) -> Path:
    """The model directory a run starts from: ``model.path`` (checked), or the tiny model warm-started
    on ``source`` (the run's task or environment, built), from the cache or built now."""
    from rllab.models.modeldir import check_model_dir

    mc = cfg.model
    if mc.path:
        return check_model_dir(mc.path)  # config.json, weights and tokenizer files, or a ConfigError saying which
    from rllab.models import tiny as tinymodel

    return tinymodel.get_or_build(
        tinymodel.TinyModelConfig(**mc.tiny),
        source,
        cfg.component(cfg.source).to_dict(),
        tinymodel.WarmStartConfig(**mc.warm_start),
        progress=progress,
        system_prompt=cfg.rollout.system_prompt, rollout=cfg.rollout, tiny_given=tuple(mc.tiny), warm_given=tuple(mc.warm_start),
    )


def build_source(cfg: Any, lab: Any) -> Any:
    """The run's task or environment (``cfg.source``), built with its knobs."""
    from rllab.rollout import rewards
    from rllab.rollout.single_turn import kind_of
    from rllab.training import parts

    with rewards.resolving_with(lab):  # reward functions named in the task's knobs: this run's plugins
        try:
            source = parts.component(cfg, lab, cfg.source)()
            who = f"{kind_of(source).name} {cfg.components[cfg.source].name!r}"
            check_protocol_signatures(source, who=who)
            names = getattr(source, "reward_components", None) or ()
            if names:  # reward_weights of another length, or not numbers: said now, not at the first reward after the warm start
                from rllab.rollout.scoring import component_weights

                component_weights(source, tuple(names), who=who)
            return source
        except RllabError:
            raise
        except (ValueError, OSError) as e:  # a task refusing its knobs or data (a missing file, a bad row)
            raise ConfigError(str(e)) from e
        except ImportError as e:  # a task or environment whose optional package is missing says which extra installs it
            if "pip install" not in str(e):
                raise
            raise ConfigError(str(e)) from e


PROTOCOL_CALLS = {
    "train_examples": ("train_examples(n, rng)", 2),
    "eval_examples": ("eval_examples()", 0),
    "demonstration": ("demonstration(example)", 1),
    "start": ("start(example)", 1),
    "reward": ("reward(example, completion)", 2),
    "solved": ("solved(example, reward)", 2),
}
"""The methods the kernel calls on a task or environment, as it calls them (positional arguments;
``reward`` on a task only: an environment's rewards come from its steps)."""


def check_protocol_signatures(source: Any, *, who: str) -> None:
    """Refuse, at load, a task's or environment's method that cannot take the arguments the kernel
    passes it (e.g. ``def train_examples(self)``), naming the method and how it is called; a
    method the object lacks, or whose signature Python cannot read, is left to the calls (an
    environment, whose steps reward themselves, has no ``reward``)."""
    import inspect

    for name, (call, nargs) in PROTOCOL_CALLS.items():
        method = getattr(source, name, None)
        if method is None or not callable(method):
            continue
        try:
            sig = inspect.signature(method)
        except (TypeError, ValueError):
            continue
        try:
            sig.bind(*([None] * nargs))
        except TypeError as e:
            raise ConfigError(
                f"{who}: {type(source).__name__}.{name}{sig} cannot be called as {call}, which is how the run calls it "
                f"({e}); see docs/environments.md"
            ) from None


def inside_run_hint(path: Path) -> str:
    """``": give the run directory D"`` when ``path`` is a file of run directory D (its
    config.toml, a log), else ``""``: for messages of commands that take a run directory."""
    path = Path(path)
    if path.is_file() and (path.parent / "config.toml").is_file():
        return f"; {path} is a file of the run directory {path.parent}: give the directory"
    return ""


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.toml").is_file() and (Path(path) / "checkpoints").is_dir()


def run_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """The checkpoint of ``run_dir`` after ``step`` steps (None: the newest), or an error listing those kept."""
    from rllab.parallel import checkpoint

    run_dir = Path(run_dir)
    if not (run_dir / "config.toml").is_file():
        raise RllabError(f"{run_dir} is not a run directory (no config.toml){inside_run_hint(run_dir)}")
    root = run_dir / checkpoint.CHECKPOINTS
    kept = sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / "state.pt").is_file()) if root.is_dir() else []
    if step is None:
        found = checkpoint.latest(run_dir)
        if found is None:
            raise RllabError(f"{run_dir} has no checkpoint (checkpoints/step_N/state.pt): the run stopped before writing one")
        return found
    path = root / f"step_{step:06d}"
    if not (path / "state.pt").is_file():
        have = ", ".join(map(str, kept)) or "none"
        raise RllabError(f"{run_dir} has no checkpoint after step {step} (kept: {have}; a run keeps its newest two)")
    return path


def run_config(run_dir: Path, *, lab: Any, overrides: list[str] = (), step: int | None = None) -> Any:
    """The run's config (``RUN_DIR/config.toml`` with ``overrides``), with the ``[[schedule]]``
    entries that had taken effect by ``step`` applied (the config in force when it was evaluated)."""
    from rllab.config import apply_schedule, load_config

    cfg = load_config(Path(run_dir) / "config.toml", list(overrides), lab=lab)
    for entry in cfg.schedule:
        if step is not None and entry.step < step:
            cfg = apply_schedule(cfg, entry, lab=lab)
    return cfg


def load_run_policy(run_dir: Path, *, step: int | None = None, lab: Any = None, progress: bool = False) -> tuple[Any, Any, Any, int, Any]:
    """``(model, tokenizer, cfg, step, source)``: the policy of ``run_dir``'s checkpoint after ``step``
    steps (None: the newest) as a plain transformers model on the CPU in float32 — LoRA adapters
    merged into their base weights — with the run's tokenizer, config and task (or environment)."""
    from transformers import AutoModelForCausalLM

    from rllab.lab import Lab
    from rllab.models.forward import load_tokenizer, transformers_progress_bars_off
    from rllab.parallel import checkpoint
    from rllab.training import parts

    lab = lab or Lab()
    path = run_checkpoint(Path(run_dir), step)
    state = checkpoint.load(path)
    if "sharded" in state:
        raise RllabError(f"checkpoint {path} was written by model.strategy = 'fsdp2' (sharded): export its run's final model "
                         f"from {Path(run_dir) / MODEL_DIR}, or resume the run under torchrun to its end, which writes it")
    at = int(state["step"])
    cfg = run_config(Path(run_dir), lab=lab, step=at)
    source = build_source(cfg, lab)
    model_dir = base_model_dir(cfg, source, progress=progress)
    if cfg.model.lora:  # the adapters are the run's; the base they merge into must be the one they trained on
        _check_start(Path(run_dir), model_dir)
    with transformers_progress_bars_off():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    handle = parts.policy_handle(model, cfg.model)  # LoRA: the adapters attached, then their weights loaded
    handle.load_state_dict(state["policy"])
    policy = handle.sampler_module()  # LoRA: a plain model with the adapters merged
    tokenizer = load_tokenizer(model_dir)
    return policy.eval(), tokenizer, cfg, at, source


def _check_start(run_dir: Path, model_dir: Path) -> None:
    """Refuse a base model whose content differs from the start the run recorded (``provenance.json``)."""
    import json

    from rllab.records import provenance

    record = run_dir / provenance.PROVENANCE_FILE
    try:
        recorded = ((json.loads(record.read_text(encoding="utf-8")).get("hashes") or {}).get("start") or {}).get("sha256")
    except (OSError, ValueError):
        return  # a run from before runs recorded their start: nothing to compare with
    if recorded and provenance.model_sha256(model_dir) != recorded:
        raise RllabError(
            f"{run_dir} trained LoRA adapters on a base model of sha256 {recorded[:12]}…, and {model_dir} (its base now) is "
            f"{provenance.model_sha256(model_dir)[:12]}…: a warm start rebuilt on another machine, or a changed model.path. "
            f"Merged into it the adapters would make another model; export where the original base is (rllab provenance "
            f"{run_dir} --export-start DIR copies it, and model.path=DIR with model.sha256 pins it)")


def export_run(run_dir: Path, out: Path, *, step: int | None = None, lab: Any = None, overwrite: bool = False,
               progress: bool = False) -> tuple[Path, int]:
    """Export ``run_dir``'s policy after ``step`` steps (None: its newest checkpoint) to ``out``;
    ``(out, step)``. An ``out`` that exists and is not empty is refused unless ``overwrite``."""
    out, run = Path(out), Path(run_dir).resolve()
    if out.resolve() == run or out.resolve() == run / "checkpoints" or run / "checkpoints" in out.resolve().parents:
        raise RllabError(f"--out {out} would replace part of the run itself: choose a new directory (e.g. {Path(run_dir) / 'export'})")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise RllabError(f"--out {out} exists and is not empty: choose another directory, or add --overwrite to replace it")
    model, tokenizer, cfg, at, source = load_run_policy(Path(run_dir), step=step, lab=lab, progress=progress)
    text = f"# the config of run {run} (exported after step {at})\n" + (Path(run_dir) / "config.toml").read_text(encoding="utf-8")
    write_model_dir(model, tokenizer, out, config_text=text, check_texts=_prompt_texts(source))
    return out, at


def _prompt_texts(source: Any, n: int = 8) -> list[str]:
    """A few of the task's held-out prompts that are plain text (to check the written tokenizer on)."""
    if source is None:
        return []
    try:
        examples = list(source.eval_examples())[:n] if hasattr(source, "eval_examples") else []
    except Exception:  # noqa: BLE001 — an environment may need more to list them; the probe text still applies
        return []
    return [e.prompt for e in examples if isinstance(getattr(e, "prompt", None), str)]
