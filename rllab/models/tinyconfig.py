"""The tiny model's knobs (``[model] tiny``: :class:`TinyModelConfig`) and its supervised warm
start's (``[model] warm_start``: :class:`WarmStartConfig`), for :mod:`rllab.models.tiny`, which
builds and warm-starts the model, and for the load-time checks of a config
(:func:`rllab.checks.config.check_model_settings`), which need no torch."""

from __future__ import annotations

import attrs

from rllab.lab import knob
from rllab.models.tokenizer import TOKENIZERS


@attrs.frozen
class TinyModelConfig:
    """Shape of the tiny Qwen2 model (defaults: ~0.5M parameters)."""

    hidden_size: int = knob(128, help="width of the residual stream", ge=8)
    num_layers: int = knob(2, help="transformer blocks", ge=1)
    num_heads: int = knob(4, help="attention heads (hidden_size must be divisible by it)", ge=1)
    num_kv_heads: int = knob(2, help="key/value heads (grouped-query attention)", ge=1)
    intermediate_size: int = knob(512, help="width of the SwiGLU MLP", ge=1)
    max_position_embeddings: int = knob(256, help="longest prompt + response", ge=8)
    rope_theta: float = knob(10000.0, help="RoPE base", gt=0.0)
    tie_word_embeddings: bool = knob(True, help="share the input embedding and the LM head")
    seed: int = knob(0, help="seeds the random initialisation")
    tokenizer: str = knob(
        "char",
        help="char: one token per character, no chat template; chat: a byte-level BPE with <|im_start|>/<|im_end|> "
        "and a Qwen2-style chat template (for chat-message prompts)",
        choices=tuple(TOKENIZERS),
    )

    def __attrs_post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size = {self.hidden_size} is not divisible by num_heads = {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads = {self.num_heads} is not divisible by num_kv_heads = {self.num_kv_heads}")


@attrs.frozen
class WarmStartConfig:
    """Supervised warm start on a task's demonstrations.

    Training stops early once greedy accuracy on a fixed probe of *training* prompts reaches
    ``target_accuracy``: the point is a policy that is right some of the time, not a solved
    task, and stopping on a measured accuracy lands there whatever the task's difficulty
    (and however the loss curve's sudden drop falls on a given machine).
    """

    steps: int = knob(600, help="most optimizer steps (0 skips the warm start)", ge=0)
    batch_size: int = knob(64, help="demonstrations per step", ge=1)
    lr: float = knob(1.5e-3, help="AdamW learning rate (constant after a linear warm-up)", gt=0.0)
    betas: tuple[float, float] = knob(
        (0.9, 0.95), help="AdamW betas (with β2 = 0.95 addition is learnt several times faster than with 0.999)"
    )
    weight_decay: float = knob(0.1, help="AdamW weight decay", ge=0.0)
    warmup_steps: int = knob(20, help="linear learning-rate warm-up steps", ge=0)
    grad_clip: float = knob(1.0, help="clip the gradient norm to this (0 disables)", ge=0.0)
    target_accuracy: float | None = knob(
        0.25,
        help="stop once greedy accuracy on the probe reaches this (None: run every step)",
        gt=0.0,
        le=1.0,
        optional=True,
    )
    check_every: int = knob(10, help="steps between probe checks", ge=1)
    probe_size: int = knob(256, help="training prompts in the probe", ge=1)
    seed: int = knob(0, help="seeds the demonstration draw and the probe")
    eval_max_new_tokens: int = knob(16, help="greedy decode length when measuring accuracy", ge=1)
    eval_limit: int = knob(200, help="held-out examples scored after the warm start", ge=0)
    num_threads: int | None = knob(
        1,
        help="torch CPU threads while warm-starting (None: leave as is); one by default, because when "
        "other processes share the cores a multi-threaded step of a model this small can be 10× slower",
        ge=1,
        optional=True,
    )
