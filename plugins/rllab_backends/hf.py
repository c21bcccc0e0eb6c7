"""In-process rollouts with a transformers causal LM: a batched sampler with a KV cache.

``generate(prompts, params)`` samples ``params.n`` completions per prompt. For each chunk of at
most ``max_batch_size`` rows:

1. **prefill** — the distinct prompts, left-padded to length P, go through the model once with
   ``position_ids = cumsum(attention_mask) − 1`` (so padding does not shift positions); only
   the last position's logits are kept. The cache (``DynamicCache``, passed and read as
   ``cache`` — ``past_key_values`` before transformers 5.24, :mod:`rllab.models.hfcompat`) and those logits are then
   repeated ``n`` times, so a prompt is encoded once per group, not once per sample.
2. **decode** — one token per step for every row: ``logits → sample → append``, feeding the
   sampled token back with its position and the growing attention mask. A row is finished when
   it samples ``<eos>`` (any of the model's eos ids) or one of ``params.stop_token_ids``; the
   stop token is kept in ``token_ids`` and the finish reason is ``"stop"``. Rows that run out
   of ``max_new_tokens`` finish with ``"length"``. The loop ends as soon as every row is done.

Sampling, per row, from logits ``z`` (V,) in float32::

    temperature == 0:  token = argmax z                          (greedy; T is taken as 1)
    otherwise:         s = z / T
                       s = −inf outside the top-k of s             (top_k > 0; ties kept)
                       s = −inf outside the top-p nucleus of s     (smallest prefix of the sorted
                                                                    probabilities whose mass ≥ top_p)
                       token ~ softmax(s)                          (inverse CDF, one seeded
                                                                    uniform per row)

Log-prob conventions (the ``logprobs`` knob), the value reported for the sampled token:

- ``"temperature"`` (default): ``log_softmax(z / T)[token]`` — what SGLang returns by default
  (temperature applied, top-k / top-p *not* renormalised; greedy uses T = 1), and what a
  trainer computes as ``old_log_prob`` when it divides its logits by the rollout temperature
  (verl does). So importance ratios between rollout and trainer compare like with like.
- ``"raw"``: ``log_softmax(z)[token]`` — the model's own distribution, before any sampling
  transform (SGLang with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``, vLLM's ``raw_logprobs``).
- ``"processed"``: ``log_softmax(s)[token]`` after top-k / top-p filtering — the exact
  distribution the token was drawn from (vLLM's ``processed_logprobs``); 0 under greedy.

With ``top_k = -1`` and ``top_p = 1`` the default and ``"processed"`` agree.

Precision: the sampling copy is cast to ``dtype``. Against a float32 trainer, ``bfloat16`` (or
``float16``) makes the rollout policy differ from the trained one by rounding alone — a mismatch
you can dial on a CPU, which the trainer logs every step (``mismatch/abs_diff``, ``mismatch/k1``,
``mismatch/k3``) and the importance corrections act on. ``share_weights`` has no copy, so it
refuses a ``dtype`` of its own.

Weights: ``model_path`` loads a model directory at construction; otherwise the first
``update_weights(model)`` makes a private copy of ``model`` (later calls copy the weights in
with ``load_state_dict``), or, with ``share_weights = true``, samples from ``model`` itself.
Every completion carries ``weight_version``, the number of ``update_weights`` calls before it
as a string (``"0"``: the ``model_path`` weights), as SGLang counts its syncs.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import attrs
import torch

import rllab
from rllab.models.hfcompat import cache_argument, output_cache, with_cache
from rllab.types import Completion, SamplingParams
from rllab_backends.hf_process import ProcessHFBackend

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@attrs.frozen
class HFBackendConfig:
    """Knobs of the hf rollout backend."""

    model_path: str | None = rllab.knob(
        None, help="model directory to load; None: the trainer supplies the model via update_weights"
    )
    dtype: str = rllab.knob("float32", help="dtype of the sampling copy", choices=tuple(_DTYPES))
    max_batch_size: int = rllab.knob(1024, help="most rows (prompts × n) in one forward pass", ge=1)
    logprobs: str = rllab.knob(
        "temperature",
        help="reported log-prob: 'temperature' log_softmax(z/T) as SGLang; 'raw' log_softmax(z); "
        "'processed' after top-k/top-p renormalisation",
        choices=("temperature", "raw", "processed"),
    )
    share_weights: bool = rllab.knob(
        False, help="sample from the trainer's module itself instead of a copy (in the trainer's dtype: dtype then "
        "stays at its default)", validator=lambda inst, attr, value: _no_dtype_when_shared(inst, value),
    )
    process: bool = rllab.knob(
        False,
        help="sample in a child process (rllab_backends.hf_process): no GIL shared with the trainer's thread under "
        "asynchronous rollouts (it still needs a free core to gain); CPU float32 weights are shared with it, a sync is one copy",
        validator=lambda i, a, v: _not_with_share_weights(i, v),
    )
    seed: int = rllab.knob(0, help="seeds the backend's generator (used when params.seed is None)")
    device: str = rllab.knob("auto", help="torch device of the sampling model: auto (CUDA when available, as model.device), cpu, cuda, cuda:N")
    num_threads: int | None = rllab.knob(
        None, help="torch CPU threads during generate (None: leave the process setting)", ge=1
    )


def _no_dtype_when_shared(config, share: bool) -> None:
    if share and config.dtype != "float32":
        raise ValueError(
            f"dtype = {config.dtype!r} is the dtype of the sampling copy, but share_weights = true samples from the "
            f"trainer's module itself, in the trainer's dtype: drop one of them (a {config.dtype} sampler against the "
            f"trainer is share_weights = false)"
        )


def _not_with_share_weights(inst, value) -> None:
    if value and inst.share_weights:
        raise ValueError("process = true cannot sample from the trainer's own module (share_weights = true): set one of them")


class HFBackend(rllab.RolloutBackend):
    """Batched sampling from a transformers causal LM (see the module docstring)."""

    def __init__(self, config: HFBackendConfig):
        self.config = config
        self.model = None
        self.version = 0
        """``update_weights`` calls so far: the weight version completions report (as a string)."""
        self.eos_ids: list[int] = []
        """Token ids that always end a completion (the model's eos ids)."""
        self.cache_arg = "cache"
        """The model's KV-cache argument (:func:`rllab.models.hfcompat.cache_argument`)."""
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(auto if config.device == "auto" else config.device)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        if config.model_path is not None:
            from transformers import AutoModelForCausalLM

            self._set_model(AutoModelForCausalLM.from_pretrained(config.model_path))

    # -- weights

    def _set_model(self, model) -> None:
        model = model.to(device=self.device, dtype=_DTYPES[self.config.dtype]).eval()
        for p in model.parameters():
            p.requires_grad_(False)
            p.grad = None
        self.model = model
        self.eos_ids = _eos_ids(model)
        self.cache_arg = cache_argument(model)

    def update_weights(self, model: Any) -> None:
        """Sample from ``model``'s current weights from now on.

        ``model`` is a ``torch.nn.Module`` (the policy), a state dict, or a model directory.
        The first module given is deep-copied (or shared, with ``share_weights``); later ones
        are copied in with ``load_state_dict``, which also casts to ``dtype``.
        """
        self.version += 1
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            from transformers import AutoModelForCausalLM

            self._set_model(AutoModelForCausalLM.from_pretrained(model))
            return
        if isinstance(model, Mapping):
            if self.model is None:
                raise RuntimeError("hf backend: a state dict needs a model first (model_path or a module)")
            self.model.load_state_dict(model)
            return
        if self.config.share_weights:
            self.model = model
            self.eos_ids = _eos_ids(model)
            self.cache_arg = cache_argument(model)
            return
        if self.model is None:
            self._set_model(copy.deepcopy(model))
        else:
            with torch.no_grad():
                self.model.load_state_dict(model.state_dict())

    def last_metrics(self) -> dict[str, float]:
        """Nothing to report: in-process generation has no retries or servers (versions are on each completion)."""
        return {}

    def close(self) -> None:
        self.model = None

    # -- sampling

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """``params.n`` completions per prompt, grouped: prompt 0's n first (``prompt_index`` set)."""
        if self.model is None:
            raise RuntimeError("hf backend has no model: set model_path or call update_weights(model) first")
        prompts = [tuple(int(t) for t in p) for p in prompts]
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"hf backend: prompt {i} is empty")
        if params.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
        else:
            gen = self.generator
        stop_ids = sorted(set(self.eos_ids) | set(params.stop_token_ids))
        per_chunk = max(1, self.config.max_batch_size // params.n)
        out: list[Completion] = []
        threads_before, was_training = torch.get_num_threads(), self.model.training
        if self.config.num_threads is not None:
            torch.set_num_threads(self.config.num_threads)
        self.model.eval()  # a shared policy may be in train mode (dropout, checkpointing without cache)
        try:
            for start in range(0, len(prompts), per_chunk):
                chunk = prompts[start : start + per_chunk]
                out.extend(self._generate_chunk(chunk, start, params, stop_ids, gen))
        finally:
            self.model.train(was_training)
            if torch.get_num_threads() != threads_before:
                torch.set_num_threads(threads_before)
        return out

    def generate_until(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, caps: Sequence[int],
                       groups: Sequence[int], needed: int) -> list[Completion]:
        """One completion per prompt (``params.n`` must be 1), row ``i`` at most ``caps[i]`` tokens,
        in group ``groups[i]`` (a group's rows are consecutive). Chunks of whole groups (about
        ``max_batch_size`` rows) decode in turn; within one, after every token the groups whose
        rows have all finished are counted, and once ``needed`` groups (over the chunks so far)
        are complete the chunk stops: its unfinished rows come back with their tokens so far and
        finish reason ``"abort"``; a later chunk is not sampled at all (every row ``"abort"``, no
        tokens). Partial rollouts (``rollout.over_sample``) call this."""
        if params.n != 1 or len(caps) != len(prompts) or len(groups) != len(prompts):
            raise ValueError(f"hf backend: generate_until takes n = 1 (got {params.n}) and one cap and group per prompt "
                             f"({len(caps)} caps, {len(groups)} groups for {len(prompts)} prompts)")
        if self.model is None:
            raise RuntimeError("hf backend has no model: set model_path or call update_weights(model) first")
        prompts = [tuple(int(t) for t in p) for p in prompts]
        gen = self.generator if params.seed is None else torch.Generator(device=self.device).manual_seed(params.seed)
        stop_ids = sorted(set(self.eos_ids) | set(params.stop_token_ids))
        bounds = [0] + [k for k in range(1, len(groups)) if groups[k] != groups[k - 1]] + [len(groups)]
        chunks, start = [], 0
        for a, b in zip(bounds, bounds[1:]):  # whole groups, about max_batch_size rows each
            if b - start > self.config.max_batch_size and a > start:
                chunks.append((start, a))
                start = a
        chunks.append((start, len(prompts)))
        out: list[Completion] = []
        complete = 0
        was_training = self.model.training
        self.model.eval()
        try:
            for a, b in chunks:
                if complete >= needed or a == b:
                    out.extend(Completion(prompt_ids=prompts[k], token_ids=(), log_probs=(), finish_reason="abort",
                                          prompt_index=k, weight_version=str(self.version)) for k in range(a, b))
                    continue
                got = self._generate_chunk(prompts[a:b], a, attrs.evolve(params, max_new_tokens=max(caps[a:b])), stop_ids,
                                           gen, caps=caps[a:b], groups=groups[a:b], needed=needed - complete)
                unfinished = {groups[a + k] for k, c in enumerate(got) if c.finish_reason == "abort"}
                complete += len(set(groups[a:b]) - unfinished)
                out.extend(got)
        finally:
            self.model.train(was_training)
        return out

    @torch.inference_mode()
    def _generate_chunk(self, prompts, first_index, params, stop_ids, gen, *, caps=None, groups=None, needed=None) -> list[Completion]:
        model, device, n = self.model, self.device, params.n
        rows, expand = prompts, None
        if caps is not None:  # partial rollouts: rows of equal prompts (a fresh group's) are prefilled once
            uniq = list(dict.fromkeys(prompts))
            if len(uniq) < len(prompts):
                where = {p: i for i, p in enumerate(uniq)}
                prompts, expand = uniq, torch.tensor([where[p] for p in rows], dtype=torch.long, device=device)
        P, L, Tmax = len(prompts), max(len(p) for p in prompts), params.max_new_tokens
        pad = _pad_id(model)
        ids = torch.full((P, L), pad, dtype=torch.long)
        mask = torch.zeros(P, L + Tmax, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, L - len(p) : L] = 1
        ids, mask = ids.to(device), mask.to(device)
        prompt_mask = mask[:, :L]
        position_ids = (prompt_mask.cumsum(-1) - 1).clamp(min=0)

        out = model(
            input_ids=ids, attention_mask=prompt_mask, position_ids=position_ids, use_cache=True, logits_to_keep=1
        )
        cache, logits = output_cache(out, self.cache_arg), out.logits[:, -1]
        next_pos = position_ids[:, -1] + 1  # (P,)
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            mask = mask.repeat_interleave(n, dim=0)
            next_pos = next_pos.repeat_interleave(n, dim=0)
        if expand is not None:
            cache.batch_select_indices(expand)
            logits, mask, next_pos, P = logits[expand], mask[expand], next_pos[expand], len(rows)
        mask[:, L:] = 1  # generated tokens are always attended to (finished rows are ignored)
        R = P * n

        tokens = torch.full((R, Tmax), pad, dtype=torch.long, device=device)
        log_probs = torch.zeros(R, Tmax, dtype=torch.float32, device=device)
        lengths = torch.full((R,), Tmax, dtype=torch.long, device=device)
        done = torch.zeros(R, dtype=torch.bool, device=device)
        stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
        steps = 0
        cap = None if caps is None else torch.tensor(list(caps), dtype=torch.long, device=device)
        if cap is not None:  # each row's group, numbered 0.. in this chunk
            gid = torch.unique(torch.tensor(list(groups), dtype=torch.long), return_inverse=True)[1].to(device)
            open_rows = torch.zeros(int(gid.max()) + 1, dtype=torch.long, device=device)
        ended = done.clone()  # partial rollouts: finished by stop token or by the row's cap
        for t in range(Tmax):
            token, lp = sample(logits.float(), params, gen, self.config.logprobs)
            tokens[:, t] = token
            log_probs[:, t] = lp
            stopped = torch.isin(token, stops) & ~(done | ended)
            lengths = torch.where(stopped, t + 1, lengths)
            done |= stopped
            steps = t + 1
            if cap is not None:
                capped = (cap <= t + 1) & ~ended
                lengths = torch.where(capped, cap, lengths)
                ended |= stopped | capped
                left = open_rows.zero_().index_add_(0, gid, (~ended).long())
                if bool(ended.all()) or int((left == 0).sum()) >= needed:
                    break
            if t == Tmax - 1 or bool(done.all()):
                break
            out = model(
                input_ids=token.unsqueeze(1),
                attention_mask=mask[:, : L + t + 1],
                position_ids=(next_pos + t).unsqueeze(1),
                **with_cache(self.cache_arg, cache),
            )
            cache, logits = output_cache(out, self.cache_arg), out.logits[:, -1]

        token_rows = tokens[:, :steps].tolist()
        lp_rows = log_probs[:, :steps].tolist()
        lens = lengths.tolist()
        finished = done.tolist()
        completions = []
        version = str(self.version)
        over = None if cap is None else ended.tolist()
        for r in range(R):
            k = min(lens[r], steps)
            completions.append(
                Completion(
                    prompt_ids=rows[r // n],
                    token_ids=tuple(token_rows[r][:k]),
                    log_probs=tuple(lp_rows[r][:k]),
                    finish_reason="stop" if finished[r] else "length" if over is None or over[r] else "abort",
                    prompt_index=first_index + r // n,
                    weight_version=version,
                )
            )
        return completions


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator, convention: str = "temperature"):
    """Draw one token per row and report its log-prob under ``convention``.

    :param logits: (R, V) float32 next-token logits.
    :returns: ``token`` (R,) int64 and ``log_prob`` (R,) float32.
    """
    if params.temperature == 0:
        token = logits.argmax(-1)
        if convention == "processed":
            return token, torch.zeros(token.shape, dtype=torch.float32, device=logits.device)
        lp = torch.log_softmax(logits, dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
        return token, lp
    scaled = logits / params.temperature
    filtered = _top_k_top_p(scaled, params.top_k, params.top_p)
    token = _inverse_cdf_draw(torch.softmax(filtered, dim=-1), gen)
    source = {"temperature": scaled, "raw": logits, "processed": filtered}[convention]
    lp = torch.log_softmax(source, dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
    return token, lp


def _inverse_cdf_draw(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One draw per row of ``probs`` (R, V): the first index whose cumulative mass exceeds
    ``u · total`` with ``u ~ U[0, 1)``. One uniform per row (the exponential race needs V, and
    is ~10× slower here); the cumulative sum is float64 so tail tokens of a large vocabulary keep
    their probability; a zero-probability token can never be drawn (``right=True``)."""
    cdf = probs.double().cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=gen, dtype=torch.float64, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _top_k_top_p(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``scaled`` (R, V) with −inf outside the top-k and outside the top-p nucleus."""
    V = scaled.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= top_p  # the first token always has mass_before = 0 and stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def _eos_ids(model) -> list[int]:
    ids: list[int] = []
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(cfg, "eos_token_id", None)
        if eos is None:
            continue
        ids.extend(eos if isinstance(eos, (list, tuple)) else [eos])
    return sorted(set(int(i) for i in ids))


def _pad_id(model) -> int:
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        pad = getattr(cfg, "pad_token_id", None)
        if pad is not None:
            return int(pad)
    eos = _eos_ids(model)
    return eos[0] if eos else 0


def hf(*, config: HFBackendConfig):
    """In-process transformers sampling with a KV cache (temperature, top-k, top-p, n per prompt)."""
    if config.process:
        return ProcessHFBackend(config, HFBackend)
    return HFBackend(config)
