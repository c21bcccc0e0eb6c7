"""``opd``'s teacher served by SGLang (``algorithm.teacher = "http://HOST:PORT"``): the teacher's log-probs of the
student's sampled tokens, read from the server's prompt log-probs
(the ``prompt_logprobs(sequences, first)`` member of the ``sglang`` rollout backend, built by name through
the registry, as any rollout backend that scores prompts can be).

Each row of the batch is sent as its real tokens — the prompt (left padding dropped) followed by
the response up to its last real token — and scored from the response's first token. The answer
fills a ``(B, T)`` tensor aligned with ``response_mask`` (0 on padding). One client per URL and
process, kept between steps (its connections stay alive)."""

from __future__ import annotations

import torch

import rllab

_CLIENTS: dict[str, object] = {}


class TeacherError(rllab.RllabError):
    """The teacher server could not score the student's samples (down, refused, or not SGLang)."""


def _client(url: str, backend: str = "sglang"):
    """The rollout backend ``backend`` pointed at ``url``, built once per process through the registry."""
    if url not in _CLIENTS:
        client = rllab.Lab().get("rollout_backend", backend, urls=url)()
        if not callable(getattr(client, "prompt_logprobs", None)):
            raise rllab.ConfigError(
                f"algorithm 'opd': teacher = {url!r} needs a rollout backend that returns prompt log-probs "
                f"(a prompt_logprobs member); rollout_backend {backend!r} has none",
                key="algorithm.teacher",
            )
        _CLIENTS[url] = client
    return _CLIENTS[url]


def rows_to_score(batch) -> tuple[list[list[int]], list[int], list[int]]:
    """``(sequences, first, lengths)``: each row's prompt + response tokens, the position of its
    first response token, and how many response columns it fills."""
    T = batch.response_mask.shape[1]
    ids, attn = batch.input_ids.cpu(), batch.attention_mask.cpu()
    seqs, first, lengths = [], [], []
    for b in range(ids.shape[0]):
        prompt = ids[b, :-T][attn[b, :-T]].tolist()
        real = attn[b, -T:].nonzero()
        n = int(real[-1]) + 1 if len(real) else 0
        seqs.append(prompt + ids[b, -T:][:n].tolist())
        first.append(len(prompt))
        lengths.append(n)
    return seqs, first, lengths


def check_temperature(url: str, temperature: float) -> None:
    """A served teacher scores at temperature 1: refuse another rollout temperature (when the run is built)."""
    if temperature != 1.0:
        raise rllab.ConfigError(
            f"algorithm 'opd': teacher = {url!r} (a server) needs rollout.temperature = 1 (it is {temperature:g}): SGLang's "
            f"prompt log-probs are log_softmax(z), before temperature; set rollout.temperature = 1 or use a local model directory",
            key="rollout.temperature",
        )


def server_logprobs(url: str, ctx, batch) -> torch.Tensor:
    """``(B, T)`` float32 log-probs of the teacher at ``url`` for the batch's response tokens."""
    check_temperature(url, ctx.config.rollout.temperature)  # a schedule entry may have changed it
    seqs, first, lengths = rows_to_score(batch)
    keep = [i for i, n in enumerate(lengths) if n > 0]
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
    if keep:
        try:
            scores = _client(url).prompt_logprobs([seqs[i] for i in keep], [first[i] for i in keep])
        except rllab.RllabError as e:
            raise TeacherError(
                f"algorithm 'opd': the teacher at {url!r} (algorithm.teacher) could not score the student's samples "
                f"(is an SGLang server serving the teacher there?): {str(e).replace('backend.urls', 'algorithm.teacher')}"
            ) from None
        for i, lps in zip(keep, scores):
            out[i, : lengths[i]] = torch.tensor(lps, dtype=torch.float32)
    return out.to(batch.response_mask.device)
