"""The tile sizes of :mod:`rllab.kernels.chunked` and the checks of its public functions' arguments."""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 25
"""Default chunk budget: ``chunk_size = max(1, CHUNK_ELEMENTS // V)`` tokens, so one float32 chunk
of logits is 128 MiB whatever the vocabulary (220 tokens for V = 151,936; 1,024 for V = 32,768)."""

HIDDEN_CHUNK_TOKENS = 8192
"""Default token rows per tile of :func:`logprobs_from_hidden` (the vocabulary tile then fills
``CHUNK_ELEMENTS``: 4,096 tokens × 8,192 vocabulary entries, for instance)."""

def _chunk_rows(chunk_size: int | None, V: int, where: str) -> int:
    if chunk_size is None:
        return max(1, CHUNK_ELEMENTS // max(V, 1))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{where}: chunk_size must be a positive int or None, got {chunk_size!r}")
    return chunk_size


def _hidden_tile(chunk_size, vocab_chunk_size, N: int, V: int, where: str) -> tuple[int, int]:
    """(tokens, vocabulary entries) per tile of the hidden-state path; see logprobs_from_hidden."""
    for name, value in (("chunk_size", chunk_size), ("vocab_chunk_size", vocab_chunk_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{where}: {name} must be a positive int or None, got {value!r}")
    if chunk_size is not None:
        rows = chunk_size
    elif vocab_chunk_size is not None:
        rows = max(1, CHUNK_ELEMENTS // vocab_chunk_size)
    else:
        rows = max(1, min(N, HIDDEN_CHUNK_TOKENS))
    cols = vocab_chunk_size if vocab_chunk_size is not None else max(1, CHUNK_ELEMENTS // rows)
    return rows, min(cols, V)


def _check_temperature(temperature: float, where: str) -> float:
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
        raise ValueError(f"{where}: temperature must be a number > 0, got {temperature!r}")
    return float(temperature)


def _check_labels(where: str, labels: torch.Tensor, expected: tuple[int, ...], what: str) -> None:
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"{where}: labels must be an integer tensor, got {type(labels).__name__}")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise TypeError(f"{where}: labels must be an integer tensor, got {labels.dtype}")
    if tuple(labels.shape) != expected:
        raise ValueError(f"{where}: labels has shape {tuple(labels.shape)} but {what} expects {expected}")
