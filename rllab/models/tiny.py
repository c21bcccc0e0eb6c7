"""A tiny causal LM built locally, so rllab trains on a laptop CPU with nothing from a hub.

Three steps, each usable alone:

1. :func:`build_tokenizer` — a character-level tokenizer made with the ``tokenizers`` library
   (digits, letters, space, punctuation, newline, plus ``<pad> <bos> <eos> <unk>``), wrapped
   as a ``transformers`` fast tokenizer that prepends ``<bos>`` to every encoded text; or, with
   ``tokenizer = "chat"``, :func:`build_chat_tokenizer`, a small BPE with a Qwen2-style chat
   template for chat-message prompts (:mod:`rllab.models.tokenizer`).
2. :func:`build_tiny_model` — a randomly initialised Qwen2 (``Qwen2Config`` +
   ``Qwen2ForCausalLM``) of about half a million parameters with that vocabulary.
3. :func:`warm_start` — supervised fine-tuning on a task's demonstrations (loss on the
   completion tokens and ``<eos>`` only), so that RL starts from a policy that is sometimes
   right: on the default addition task, held-out greedy accuracy lands in the 10–40% range
   (the demonstration encoding, loss and greedy evaluation it uses are :mod:`rllab.models.supervised`'s).

:func:`get_or_build` chains them and caches the result as an ordinary Hugging Face model
directory (``config.json``, ``model.safetensors``, tokenizer files) under
``$RLLAB_CACHE`` (default ``~/.cache/rllab/models``), keyed by a hash of the three configs;
a second call returns the cached path at once. Anything downstream only sees that path, so an
existing local HF model directory works the same way::

    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any, Collection, Mapping

import attrs
import torch

from rllab.records import provenance
from rllab.rollout.chat import PromptRenderer
from rllab.rollout.single_turn import kind_of
from rllab.members import member
from rllab.models.supervised import (  # noqa: F401  (re-exported: the warm start's building blocks)
    ProbeScores, demonstration_loss, encode_demonstrations, evaluate_greedy, greedy_accuracy, greedy_answers,
    greedy_completions, is_environment, solved_rates,
)
from rllab.models.tinyconfig import TinyModelConfig, WarmStartConfig  # noqa: F401  (re-exported: the model's and warm start's knobs)
from rllab.models.progress import warm_start_progress  # noqa: F401  (re-exported)
from rllab.models.tokenizer import (  # noqa: F401  (the tokenizers' names, re-exported)
    BOS, CHARACTERS, EOS, PAD, SPECIAL_TOKENS, TOKENIZERS, UNK, build_chat_tokenizer, build_tokenizer,
)
from rllab.models.warmstart import (  # noqa: F401  (re-exported: the warm start, step 3)
    PROBES_AHEAD, TrainAhead, count_parameters, scored_anywhere, torch_threads, warm_start,
)

CACHE_ENV = "RLLAB_CACHE"
FORMAT_VERSION = 1
"""Bumped when the files or the training recipe change, so old cache entries are not reused."""
METRICS_FILE = "rllab_warm_start.json"


# --------------------------------------------------------------------------- model


def build_tiny_model(config: TinyModelConfig = TinyModelConfig()):
    """A freshly initialised tiny Qwen2 causal LM and its tokenizer (``config.tokenizer``: the
    character tokenizer, or the chat tokenizer of :mod:`rllab.models.tokenizer`, whose model also ends
    generation at ``<|im_end|>``).

    :returns: ``(model, tokenizer)``; the model is float32, in eval mode, on the CPU.
    """
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = TOKENIZERS[config.tokenizer]()
    renderer = PromptRenderer(tokenizer)
    hf_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with _fork_rng(config.seed):
        model = Qwen2ForCausalLM(hf_config)
    stops = list(renderer.stop_ids)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=stops[0] if len(stops) == 1 else stops,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.eval(), tokenizer


class _fork_rng:
    """Seed torch's global generator inside a block and restore its state afterwards."""

    def __init__(self, seed: int):
        self.seed = seed

    def __enter__(self):
        self.state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc):
        torch.random.set_rng_state(self.state)


# --------------------------------------------------------------------------- cache


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$RLLAB_CACHE``, else ``~/.cache/rllab/models``."""
    if cache_dir is not None:
        root = Path(cache_dir).expanduser()
    else:
        env = os.environ.get(CACHE_ENV)
        root = Path(env).expanduser() if env else Path.home() / ".cache" / "rllab" / "models"
    if root.exists() and not root.is_dir():  # said before the warm start, not when its model is saved
        from rllab.errors import ConfigError

        said = f"${CACHE_ENV} = {str(root)!r}" if cache_dir is None and os.environ.get(CACHE_ENV) else f"the model cache {str(root)!r}"
        raise ConfigError(f"{said} is a file, not a directory: point ${CACHE_ENV} at a directory for the cached tiny models")
    return root


def cache_key(
    model_config: TinyModelConfig, task_config: Mapping[str, Any], warm_config: WarmStartConfig,
    system_prompt: str | None = None,
) -> str:
    """A 16-hex-digit hash of the three configs, the system prompt the demonstrations were
    rendered with (when set) and :data:`FORMAT_VERSION`."""
    data = {
        "format": FORMAT_VERSION,
        "model": _model_key(model_config),
        "task": dict(task_config),
        "warm_start": attrs.asdict(warm_config),
    }
    if system_prompt is not None:
        data["system_prompt"] = system_prompt
    blob = json.dumps(
        data,
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _model_key(model_config: TinyModelConfig) -> dict:
    """The model config as hashed: the default character tokenizer is left out, so the models
    cached before the ``tokenizer`` knob existed keep their keys."""
    out = attrs.asdict(model_config)
    if out["tokenizer"] == "char":
        del out["tokenizer"]
    return out


def _declared_defaults(task, member_name: str, config, given: Collection[str] | None, what: str):
    """``config`` with the task's declared defaults (``member_name``, a dict of knobs of the
    config's class) applied to the knobs the config did not set (``given``: the knobs it set;
    None: those at their default values); an unknown knob is refused."""
    wanted = dict(member(task, "task", member_name))
    fields = {f.name: f for f in attrs.fields(type(config))}
    unknown = sorted(set(wanted) - set(fields))
    if unknown:
        raise ValueError(f"task {getattr(task, 'name', task)!r}: {member_name} names unknown {what} knobs {unknown}")
    changes = {k: v for k, v in wanted.items() if (k not in given if given is not None else getattr(config, k) == fields[k].default)}
    return attrs.evolve(config, **changes) if changes else config


def task_warm_start(task, warm_config: WarmStartConfig, given: Collection[str] | None = None) -> WarmStartConfig:
    """Apply a task's own warm-start defaults (``task.warm_start_defaults``, a dict of
    :class:`WarmStartConfig` knobs) to the knobs the config did not set (``given``: the knobs it
    set; None: those at their default values).

    A task whose warm start overshoots (sort reaches 35% by the first probe, leaving RL little
    to learn) asks for a lower target probed more often; a knob set in the config still wins.
    """
    return _declared_defaults(task, "warm_start_defaults", warm_config, given, "warm-start")


def task_tiny_model(task, model_config: TinyModelConfig, given: Collection[str] | None = None) -> TinyModelConfig:
    """Apply a task's or environment's own tiny-model defaults (``tiny_model_defaults``, a dict of
    :class:`TinyModelConfig` knobs) to the knobs the config did not set (``given``: the knobs it
    set; None: those at their default values).

    A game whose opening prompt is 517 characters asks for ``max_position_embeddings = 1024``, so
    the tiny model it is trained with has room for it; a knob set in the config still wins.
    """
    return _declared_defaults(task, "tiny_model_defaults", model_config, given, "tiny-model")


def get_or_build(
    model_config: TinyModelConfig,
    task,
    task_config: Mapping[str, Any],
    warm_config: WarmStartConfig,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    system_prompt: str | None = None,
    rollout: Any = None,
    tiny_given: Collection[str] | None = None,
    warm_given: Collection[str] | None = None,
) -> Path:
    """The directory of a warm-started tiny model, built and saved on the first call.

    :param task: the task whose demonstrations the model is trained on, or an environment (its
        demonstration episodes, :mod:`rllab.rollout.demonstrations`; the key then marks it as one). Its
        ``warm_start_defaults`` and ``tiny_model_defaults`` apply to the knobs left at their
        defaults (:func:`task_warm_start`, :func:`task_tiny_model`).
    :param task_config: what identifies ``task`` in the cache key — its name and knobs, e.g.
        ``{"name": "addition", "digits": 2, "eval_fraction": 0.1, ...}``; a knob that names an
        existing file (a data set) counts by the file's sha256, not its path
        (:func:`rllab.records.provenance.content_keyed`).
    :param cache_dir: overrides :func:`cache_root`.
    :param system_prompt: the run's ``rollout.system_prompt``, so the demonstrations are rendered
        as the rollouts will be (part of the cache key when set).
    :param rollout: the run's ``[rollout]`` config: the warm start's prompts are checked against the
        model's context as the run's will be (:mod:`rllab.rollout.prompt_limits`), before it trains;
        ``rollout.max_prompt_tokens`` drops the longer ones here too (part of the cache key when set).
    :param tiny_given: the ``model.tiny`` knobs the config set (the task's ``tiny_model_defaults``
        apply to the others); None: to those at their default values. ``warm_given``: the same for
        ``model.warm_start`` and ``warm_start_defaults``.
    :returns: a normal Hugging Face model directory, also holding ``rllab_warm_start.json``
        (the configs and the warm-start metrics).

    The model is written to a temporary sibling directory and renamed into place, so
    concurrent builders never see a half-written model; the first rename wins.
    """
    warm_config = task_warm_start(task, warm_config, warm_given)
    model_config = task_tiny_model(task, model_config, tiny_given)
    # a data file named by a knob enters the key by its contents, not its path: an edited file is a new start
    task_config = provenance.content_keyed(task_config, provenance.data_hashes(provenance.config_files(task_config)))
    kind = kind_of(task)  # an environment's demonstrations are episodes: never the key of a task's model
    task_config = {**task_config, **kind.cache_marks}
    root = cache_root(cache_dir)
    cap = getattr(rollout, "max_prompt_tokens", None)
    key = cache_key(model_config, {**task_config, **({"max_prompt_tokens": cap} if cap is not None else {})}, warm_config,
                    system_prompt)
    final = root / f"tiny-qwen2-{key}"
    if (final / METRICS_FILE).is_file():
        return final
    if cap is not None:  # the warm start built without the cap is this one when the cap drops none of the prompts it read
        uncapped = root / f"tiny-qwen2-{cache_key(model_config, task_config, warm_config, system_prompt)}"
        longest = _cache_record(uncapped).get("longest_prompt")
        if longest is not None and longest <= cap:
            return uncapped
    model, tokenizer = build_tiny_model(model_config)
    measured = None
    if kind.one_response:  # a task's prompt is all the context its warm start reads: the longest, recorded (the cap above)
        task = measured = _LongestPrompt(task, PromptRenderer(tokenizer, system_prompt=system_prompt, task_name=str(task_config.get("name", "?")),
                                                              model_name="the tiny model"))
    limits = None
    if rollout is not None:  # a prompt that cannot fit is refused before the warm start trains (or evaluates); longer ones dropped
        from rllab.rollout.prompt_limits import PromptLimits

        limits = PromptLimits(task, tokenizer=tokenizer, rollout=rollout, context_tokens=model_config.max_position_embeddings,
                              name=str(task_config.get("name", "?")), model_name="the tiny model", announce=False).check(rollout)
    renderer = PromptRenderer(
        tokenizer, system_prompt=system_prompt, task_name=str(task_config.get("name", "?")), model_name="the tiny model"
    )
    held_out: list = []  # a reward service: the held-out evaluation's scores (and the last probe's), not waited for
    metrics = warm_start(model, tokenizer, task, warm_config, progress=progress, renderer=renderer, prompt_limits=limits,
                         held_out=held_out)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {
            "format": FORMAT_VERSION,
            "model_config": attrs.asdict(model_config),
            "task_config": dict(task_config),
            "warm_start_config": attrs.asdict(warm_config),
            **({} if system_prompt is None else {"system_prompt": system_prompt}),
            **({"longest_prompt": measured.longest} if measured is not None else {}),
            "metrics": metrics,
        }
        (tmp / METRICS_FILE).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / METRICS_FILE).is_file():
                raise
            held_out = []  # another builder's model is the one cached: its record is its own
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _record_later(final, record, held_out)
    return final


def _record_later(model_dir: Path, record: dict, scores: list) -> list[threading.Thread]:
    """Wait for each of the warm start's scores left out of ``record`` (``score()`` gives metrics,
    ``{"warm/eval_accuracy": ...}`` of its held-out answers or ``{"warm/probe_accuracy": ...}`` of
    its last probe) in a thread of its own while the run goes on, then add them to ``model_dir``'s
    record, replacing the file at once (the model's hash leaves the record out), one thread at a
    time. The process waits for them before it exits. A scoring that fails leaves the record
    without it: the run's own evaluation asks the same answers and meets the failure under
    ``rollout.reward_errors``."""
    lock = threading.Lock()
    current = {**record, "metrics": dict(record["metrics"])}

    def run(score) -> None:
        try:
            more = score()
        except Exception:
            return
        with lock:
            current["metrics"].update(more)
            tmp = model_dir / f".{METRICS_FILE}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                tmp.write_text(json.dumps(current, indent=2, sort_keys=True, default=str) + "\n")
                os.replace(tmp, model_dir / METRICS_FILE)
            except OSError:
                tmp.unlink(missing_ok=True)

    threads = []
    for score in scores:
        context = contextvars.copy_context()  # the run's lab, for reward names resolved while scoring
        thread = threading.Thread(target=context.run, args=(run, score), name="rllab-warm-start-eval")  # not a daemon: it finishes
        thread.start()
        threads.append(thread)
    return threads


class _LongestPrompt:
    """A task that notes the longest prompt (in tokens, as the rollouts encode it) of every example
    it hands out; every other attribute is the task's."""

    def __init__(self, task: Any, renderer: PromptRenderer):
        self._task, self._renderer, self._seen, self.longest = task, renderer, set(), 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._task, name)

    def _note(self, examples: list) -> list:
        from rllab.rollout.chat import prompt_key

        for e in examples:
            key = prompt_key(e.prompt)
            if key not in self._seen:  # each distinct prompt encoded once
                self._seen.add(key)
                self.longest = max(self.longest, len(self._renderer.encode(e.prompt)))
        return examples

    def train_examples(self, n: int, rng: Any) -> list:
        return self._note(list(self._task.train_examples(n, rng)))

    def eval_examples(self) -> list:
        return self._note(list(self._task.eval_examples()))


def _cache_record(model_dir: Path) -> dict:
    """The ``rllab_warm_start.json`` of a cached model ({} when there is none)."""
    try:
        return json.loads((model_dir / METRICS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def warm_start_metrics(model_dir: str | os.PathLike) -> dict:
    """The metrics recorded when ``model_dir`` was built by :func:`get_or_build` ({} otherwise)."""
    path = Path(model_dir) / METRICS_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text()).get("metrics", {})
