"""The stand-in SGLang server's prompt log-probs (``return_logprob`` with ``logprob_start_len >= 0``),
computed as SGLang 0.5.23 computes them: ``log_softmax(z)`` of the served model before any
temperature, one ``[logprob, token_id, null]`` entry per position from ``logprob_start_len`` on,
the first one ``[null, token_id, null]``."""

from __future__ import annotations


def input_token_logprobs(model, ids: list[int], start: int) -> list[list]:
    """``meta_info.input_token_logprobs`` of ``ids`` scored from position ``start``."""
    import torch

    if not 0 <= start < len(ids):
        raise ValueError(f"logprob_start_len {start} is out of range for {len(ids)} input tokens")
    with torch.no_grad():
        x = torch.tensor([ids], device=next(model.parameters()).device)
        lp = torch.log_softmax(model(x).logits[0].float(), -1)  # row j: the next token after position j
    out: list[list] = [[None, int(ids[start]), None]]
    for pos in range(start + 1, len(ids)):
        out.append([float(lp[pos - 1, ids[pos]]), int(ids[pos]), None])
    return out
