"""Transformers adapters: build and place models, policy / reference / critic forwards.

The log-prob and entropy arithmetic lives in :mod:`rllab.kernels.chunked`; this module feeds it.

Model-side helpers follow verl's alignment conventions: ``input_ids`` ``(B, L)`` holds left-padded
prompts followed by right-padded responses, the response occupies the last ``T`` columns, and the
quantity for response token ``j`` is read at position ``L − T − 1 + j`` (the state *before* the
token is emitted), for log-probs and critic values alike. Position ids come from the attention
mask, so the amount of left padding never shifts rotary positions.

Shapes: ``B`` rows, ``L`` prompt + response columns, ``T`` response columns, ``N`` flattened
tokens, ``V`` vocabulary, ``D`` hidden size.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from typing import Any

import torch
from torch import nn

from rllab.models.hfcompat import cache_argument, output_cache, with_cache
from rllab.kernels.chunked import CHUNK_ELEMENTS, HIDDEN_CHUNK_TOKENS, logprobs_from_hidden, logprobs_from_logits

__all__ = [
    "CHUNK_ELEMENTS",
    "HIDDEN_CHUNK_TOKENS",
    "CriticModel",
    "ValueHead",
    "grouped_response_logprobs",
    "logprobs_from_hidden",
    "logprobs_from_logits",
    "position_ids_from_mask",
    "response_logprobs",
    "supports_hidden_path",
]

HIDDEN_PATH_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "olmo2", "smollm3"}
)
"""``config.model_type`` values whose causal-LM head is exactly ``lm_head(last_hidden_state)``
(no logit scaling or soft-capping), so :func:`response_logprobs` may project chunk by chunk."""


# --------------------------------------------------------------------------- transformers models


TOKENIZER_PROBE = "1+1=2"
"""Text every usable tokenizer encodes to at least one token (checked when one loads)."""


def is_sharded(model: Any) -> bool:
    """Whether ``model`` is an FSDP2 module (its parameters are DTensor shards)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed support
        return False
    return isinstance(model, FSDPModule)


def load_tokenizer(model_dir) -> "object":
    """The tokenizer saved in a Hugging Face model directory, encoding as it did when saved; one
    that encodes :data:`TOKENIZER_PROBE` to nothing (no vocabulary) is refused with a
    :class:`~rllab.errors.ConfigError` naming the directory.

    ``AutoTokenizer`` picks the tokenizer class from the model's type when the directory's
    ``tokenizer_config.json`` names the generic ``TokenizersBackend`` (transformers 5), and a
    model-specific class re-applies its own normaliser and pre-tokeniser: the tiny model's
    character tokenizer then drops every space and newline. A generic tokenizer is therefore
    loaded as the ``tokenizer.json`` it saved (``PreTrainedTokenizerFast``); any other through
    ``AutoTokenizer``.
    """
    import json
    from pathlib import Path

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(model_dir) / "tokenizer_config.json"
    tokenizer = None
    if config.is_file() and (Path(model_dir) / "tokenizer.json").is_file():
        if json.loads(config.read_text()).get("tokenizer_class") == "TokenizersBackend":
            tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not list(tokenizer(TOKENIZER_PROBE, add_special_tokens=False).input_ids):
        from rllab.errors import ConfigError

        raise ConfigError(
            f"the tokenizer in {str(model_dir)!r} encodes {TOKENIZER_PROBE!r} to no tokens: its vocabulary is missing "
            f"(the directory holds {', '.join(sorted(p.name for p in Path(model_dir).iterdir()))}). Save the base "
            f"model's tokenizer there: AutoTokenizer.from_pretrained(BASE_DIR).save_pretrained(DIR).",
            key="path",
        )
    return tokenizer


def enable_checkpointing(model: nn.Module) -> None:
    """Gradient (activation) checkpointing on a transformers model, its KV cache off."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable  # named so from transformers 5.x
    enable()
    model.config.use_cache = False


@contextlib.contextmanager
def transformers_progress_bars_off():
    """transformers' own progress bars (loading or writing weights) off for the duration, as they
    were after: rllab shows its own progress, and the rest of the process keeps transformers'
    setting."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) int64 position ids counting real tokens only: ``clamp(cumsum(mask) − 1, min=0)``.

    A left-padded row therefore starts at position 0 on its first real token, exactly as the
    unpadded sequence would; padding positions get 0 (they are masked out anyway).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _check_sequences(where: str, input_ids, attention_mask, response_length) -> int:
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.dtype != torch.long:
        raise ValueError(
            f"{where}: input_ids must be a (B, L) int64 tensor, got "
            f"{tuple(getattr(input_ids, 'shape', ()))} {getattr(input_ids, 'dtype', type(input_ids).__name__)}"
        )
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"{where}: attention_mask has shape {tuple(getattr(attention_mask, 'shape', ()))} but input_ids has "
            f"shape {tuple(input_ids.shape)}"
        )
    if attention_mask.is_floating_point():
        raise TypeError(f"{where}: attention_mask must be bool or integer, got {attention_mask.dtype}")
    L = input_ids.shape[1]
    if isinstance(response_length, bool) or not isinstance(response_length, int) or not 1 <= response_length < L:
        raise ValueError(
            f"{where}: response_length must be an int in [1, L − 1] = [1, {L - 1}] (at least one prompt column "
            f"precedes the response), got {response_length!r}"
        )
    return response_length


def supports_hidden_path(model: nn.Module) -> bool:
    """True when :func:`response_logprobs` can project hidden states chunk by chunk for ``model``.

    That needs a plain ``nn.Linear`` output head applied directly to the decoder's last hidden
    state, which holds for the model types in ``HIDDEN_PATH_MODEL_TYPES`` (Llama, Qwen2/3, Mistral,
    ...). Other models fall back to their own forward and full logits.
    """
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in HIDDEN_PATH_MODEL_TYPES:
        return False
    if is_sharded(model):  # FSDP2 holds a shard of the head outside the model's own forward
        return False
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return isinstance(head, nn.Linear) and hasattr(model, "get_decoder")


def _backbone_hidden(backbone: nn.Module, input_ids, attention_mask, T: int) -> torch.Tensor:
    """(B, T, D) last hidden states at the positions that predict the last T tokens."""
    L = input_ids.shape[1]
    out = backbone(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    return out.last_hidden_state[:, L - T - 1 : L - 1]


def response_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    *,
    with_entropy: bool = False,
    chunk_size: int | None = None,
    temperature: float = 1.0,
):
    """(B, T) log-probs (and entropy) of the response tokens under a transformers causal LM.

    ``input_ids`` holds left-padded prompts then right-padded responses; the response is the last
    ``T = response_length`` columns. Token ``input_ids[:, L − T + j]`` is scored with the
    distribution the model predicts at position ``L − T − 1 + j``. Position ids come from the
    attention mask (:func:`position_ids_from_mask`), so extra left padding changes nothing.

    For model types in ``HIDDEN_PATH_MODEL_TYPES`` the decoder runs alone and the LM head is
    applied chunk by chunk through :func:`logprobs_from_hidden` (no ``(B, L, V)`` logits); other
    models run their full forward (keeping only the last ``T + 1`` positions' logits when the
    model accepts ``logits_to_keep``) and go through :func:`logprobs_from_logits`.

    ``temperature`` divides the logits before the softmax, matching what the rollout sampled from,
    so that ``old_log_prob`` and ``rollout_log_prob`` describe the same distribution. Values at
    padding positions of the response are computed but meaningless; mask them.

    :param input_ids: ``(B, L)`` int64.
    :param attention_mask: ``(B, L)`` bool (or 0/1 integers), True on real tokens.
    :param response_length: T, with ``1 ≤ T < L``.
    :returns: ``log_prob`` ``(B, T)`` float32 [, ``entropy`` ``(B, T)`` float32].
    """
    where = "response_logprobs"
    T = _check_sequences(where, input_ids, attention_mask, response_length)
    labels = input_ids[:, -T:]
    if supports_hidden_path(model):
        head = model.get_output_embeddings()
        hidden = _backbone_hidden(model.get_decoder(), input_ids, attention_mask, T)
        return logprobs_from_hidden(
            hidden,
            head.weight,
            labels,
            bias=head.bias,
            chunk_size=chunk_size,
            with_entropy=with_entropy,
            temperature=temperature,
        )
    kwargs = {}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = T + 1
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        **kwargs,
    )
    logits = out.logits[:, -T - 1 : -1]
    return logprobs_from_logits(
        logits, labels, chunk_size=chunk_size, with_entropy=with_entropy, temperature=temperature
    )


def _distinct_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, P: int):
    """The distinct prompts among the first ``P`` columns: ``(first, inverse)``.

    Two rows share a prompt when their masks agree and their ids agree wherever the mask is set
    (the pad ids themselves do not matter). ``first`` ``(U,)`` is the first row holding each
    distinct prompt and ``inverse`` ``(B,)`` maps every row to its distinct prompt.
    """
    key = input_ids[:, :P].masked_fill(~attention_mask[:, :P].bool(), -1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    U, B = int(inverse.max()) + 1, inverse.shape[0]
    rows = torch.arange(B, device=input_ids.device)
    first = torch.full((U,), B, dtype=torch.long, device=input_ids.device)
    first.scatter_reduce_(0, inverse, rows, reduce="amin")
    return first, inverse


def _grouped_backbone_hidden(backbone: nn.Module, input_ids, attention_mask, T: int, first, inverse):
    """(B, T, D) hidden states as in :func:`_backbone_hidden`, each distinct prompt encoded once.

    The decoder runs on the ``U`` distinct prompts (rows ``first``) with a fresh full-attention
    ``DynamicCache``; each layer's keys and values are then gathered to the ``B`` rows with
    ``inverse`` (an index, so backward sums every row's gradient into its shared prompt), and the
    decoder runs on the response columns ``P .. L − 2`` only (the last column is never an input
    of a scored position) against that cache, with the full attention mask and the same
    mask-derived position ids as the one-pass forward. Response token 0 is scored from the
    prompt's last hidden state, tokens 1 .. T − 1 from the response pass.
    """
    from transformers import DynamicCache

    L = input_ids.shape[1]
    P = L - T
    mask = attention_mask.long()
    position_ids = position_ids_from_mask(attention_mask)
    cache = DynamicCache()
    name = cache_argument(backbone)
    out = backbone(
        input_ids=input_ids[first, :P],
        attention_mask=mask[first, :P],
        position_ids=position_ids[first, :P],
        **with_cache(name, cache),
    )
    last = out.last_hidden_state[:, -1][inverse].unsqueeze(1)  # (B, 1, D)
    if T == 1:
        return last
    cache = output_cache(out, name)
    cache.batch_select_indices(inverse)
    out = backbone(
        input_ids=input_ids[:, P : L - 1],
        attention_mask=mask[:, : L - 1],
        position_ids=position_ids[:, P : L - 1],
        **with_cache(name, cache),
    )
    return torch.cat([last, out.last_hidden_state], dim=1)


def grouped_response_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    *,
    with_entropy: bool = False,
    chunk_size: int | None = None,
    temperature: float = 1.0,
):
    """:func:`response_logprobs` that encodes each distinct prompt once (GRPO-style groups).

    When a prompt is sampled G times, its G rows share the prompt columns ``input_ids[:, :L − T]``
    and their mask. Here the decoder runs on the ``U`` distinct prompts, their key/value cache is
    indexed out to the ``B`` rows, and only the response columns go through the decoder a second
    time, so the prompt's share of the work drops by a factor ``B / U``. Values and gradients
    (every parameter, shared prompt computation included) equal :func:`response_logprobs` up to
    float rounding.

    Falls back to :func:`response_logprobs` when no prompt repeats (``U == B``), for models
    without the hidden-state path (:func:`supports_hidden_path`), and for a model training with
    gradient checkpointing (its recomputation does not mix with a key/value cache).

    Arguments and results are those of :func:`response_logprobs`.
    """
    where = "grouped_response_logprobs"
    T = _check_sequences(where, input_ids, attention_mask, response_length)
    kwargs = dict(with_entropy=with_entropy, chunk_size=chunk_size, temperature=temperature)
    flag = "is_activation_checkpointing"  # "is_gradient_checkpointing" before transformers 5.x renamed it
    if not hasattr(type(model), flag):
        flag = "is_gradient_checkpointing"
    checkpointing = bool(getattr(model, flag, False)) and model.training
    if input_ids.shape[0] < 2 or checkpointing or not supports_hidden_path(model):
        return response_logprobs(model, input_ids, attention_mask, T, **kwargs)
    first, inverse = _distinct_prompts(input_ids, attention_mask, input_ids.shape[1] - T)
    if first.shape[0] == input_ids.shape[0]:
        return response_logprobs(model, input_ids, attention_mask, T, **kwargs)
    head = model.get_output_embeddings()
    hidden = _grouped_backbone_hidden(model.get_decoder(), input_ids, attention_mask, T, first, inverse)
    return logprobs_from_hidden(hidden, head.weight, input_ids[:, -T:], bias=head.bias, **kwargs)


class ValueHead(nn.Module):
    """Scalar value ``V(s) = w·h + b`` read off a hidden state, computed in float32.

    ``w ~ N(0, 1/(D + 1))`` and ``b = 0`` at initialisation (the scale used for reward and value
    heads in Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences"), so
    initial values are O(1) whatever ``D``.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1, dtype=torch.float32)
        nn.init.normal_(self.summary.weight, std=1.0 / math.sqrt(hidden_size + 1))
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) hidden states → (...) float32 values."""
        return self.summary(hidden.to(self.summary.weight.dtype)).squeeze(-1)


class CriticModel(nn.Module):
    """A critic: a causal-LM backbone (its decoder, without the LM head) plus a :class:`ValueHead`.

    Build it with :meth:`from_causal_lm` (a deep copy of an existing model's backbone, the usual
    "critic initialised from the policy") or :meth:`from_config` (fresh weights).

    ``values(...)[:, j]`` is the value of the state *before* response token ``j`` is emitted, read
    at position ``L − T − 1 + j`` — the same alignment as verl's critic and as
    :func:`response_logprobs`, so ``values[:, j]`` and ``log_prob[:, j]`` describe the same state.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = ValueHead(hidden_size)

    @classmethod
    def from_causal_lm(cls, model: nn.Module) -> "CriticModel":
        """A critic whose backbone is a deep copy of ``model``'s (the policy is left untouched)."""
        backbone = getattr(model, "base_model", None)
        if backbone is None or backbone is model:
            raise TypeError(
                f"CriticModel.from_causal_lm: expected a transformers causal LM with a base model, got {type(model).__name__}"
            )
        return cls(copy.deepcopy(backbone), model.config.hidden_size)

    @classmethod
    def from_config(cls, config) -> "CriticModel":
        """A critic with freshly initialised weights for a transformers ``config``."""
        from transformers import AutoModel

        return cls(AutoModel.from_config(config), config.hidden_size)

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
        """(B, T) float32 values aligned to the response tokens (see the class docstring).

        :param input_ids: ``(B, L)`` int64, left-padded prompts then right-padded responses.
        :param attention_mask: ``(B, L)`` bool (or 0/1 integers).
        :param response_length: T, with ``1 ≤ T < L``.
        """
        T = _check_sequences("CriticModel.values", input_ids, attention_mask, response_length)
        hidden = _backbone_hidden(self.backbone, input_ids, attention_mask, T)
        return self.value_head(hidden)

    forward = values


def response_log_softmax(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(B, T, V) float32 ``log_softmax(logits / temperature)`` at each response position: the whole
    distribution each response token was drawn from (its gather at the sampled tokens is
    :func:`response_logprobs`). Keeps the gradient when enabled. It holds (B, T, V) floats, so give
    it a micro-batch (on-policy distillation's exact KL over the teacher's top-k)."""
    T = _check_sequences("response_log_softmax", input_ids, attention_mask, response_length)
    L = input_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask.long(), position_ids=position_ids_from_mask(attention_mask),
                   use_cache=False).logits[:, L - T - 1 : L - 1]
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def response_log_sum_sq_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    *,
    temperature: float = 1.0,
    rows_per_chunk: int = 8,
) -> torch.Tensor:
    """(B, T) float32 ``log Σ_v π(v | prefix)²`` at each response position, without gradient.

    ``π = softmax(logits / temperature)``; ``log Σ π² = logsumexp(2z) − 2·logsumexp(z)`` with
    ``z = logits / temperature``. Used by WPO weighting and by the optimal-token baselines
    (``Σ π²`` of the rollout-time policy). Runs ``rows_per_chunk`` rows per forward, so at most
    that many rows of (T, V) logits exist at once. Padding positions hold 0.
    """
    T = _check_sequences("response_log_sum_sq_probs", input_ids, attention_mask, response_length)
    L = input_ids.shape[1]
    out = torch.zeros(input_ids.shape[0], T, dtype=torch.float32, device=input_ids.device)
    with torch.no_grad():
        for s in range(0, input_ids.shape[0], max(1, rows_per_chunk)):
            ids, attn = input_ids[s : s + rows_per_chunk], attention_mask[s : s + rows_per_chunk]
            logits = model(
                input_ids=ids, attention_mask=attn.long(), position_ids=position_ids_from_mask(attn), use_cache=False
            ).logits[:, L - T - 1 : L - 1].float() / temperature
            out[s : s + rows_per_chunk] = torch.logsumexp(2 * logits, dim=-1) - 2 * torch.logsumexp(logits, dim=-1)
    mask = attention_mask[:, L - T :].bool()
    return torch.where(mask, out, torch.zeros_like(out))
