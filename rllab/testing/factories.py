"""The contract checks of factory kinds (KL controllers, tasks, loggers, rollout backends), of
reward functions, and partition invariance: a policy loss gives the same loss and gradient
whether a batch is processed whole or in micro-batches with gradient accumulation, and an
advantage estimator the same advantages for a batch whole or split at group boundaries — unless
the component declares why its definition says otherwise (``partition=``, ``batch_step=``).

Registered with :mod:`rllab.testing.checks`'s registry (see :mod:`rllab.testing`).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Mapping

import torch

from rllab.testing.checks import ContractSkip, _adv_inputs, _check, _close, _gen, _pl_call_with, _pl_inputs
from rllab.members import member

PARTITION_RTOL = 1e-6
"""How close (relative) a batch processed whole and in micro-batches must be."""


@_check("policy_loss", "micro-batches with gradient accumulation give the whole batch's loss and gradient (≤ 1e-6 relative)")
def _pl_partition(comp):
    reason = comp.trait("partition")
    if reason is not None:
        raise ContractSkip(f"{comp.name} depends on how a batch is split, by its definition: {reason}")
    kw = {k: v.double() if v.is_floating_point() else v for k, v in _pl_inputs(B=7, T=9, seed=4).items()}
    kw["mask"][3] = False  # an empty row
    mask = kw["mask"]
    tokens, seqs = int(mask.sum()), int(mask.any(-1).sum())

    def token_mean(m, k):  # the rl step's aggregate: bound to the whole batch's count
        return torch.where(k, m, torch.zeros((), dtype=m.dtype)).sum() / tokens

    whole, grad, _ = _pl_call_with(comp, kw, token_mean)
    total, grads = 0.0, []
    for rows in (slice(0, 3), slice(3, 5), slice(5, 7)):
        part = {k: v[rows] for k, v in kw.items()}
        loss, g, _ = _pl_call_with(comp, part, token_mean)
        if comp.trait("aggregation") == "seq-mean":  # the rl step weighs such a loss by its share of rows
            share = int(part["mask"].any(-1).sum()) / seqs
            loss, g = loss * share, g * share
        total, grads = total + loss, [*grads, g]
    _close(total, whole, "summed micro-batch losses vs the whole batch's", rtol=PARTITION_RTOL, atol=1e-12)
    _close(torch.cat(grads), grad, "accumulated micro-batch gradients vs the whole batch's", rtol=PARTITION_RTOL, atol=1e-12)


@_check("advantage_estimator", "the batch split at a group boundary gives the same advantages (≤ 1e-6 relative)")
def _adv_partition(comp):
    step = comp.trait("batch_step")
    if step is not None:
        raise ContractSkip(f"{comp.name} couples the whole batch by its definition ({step}); the rl step computes "
                           "advantages once per step on the whole batch, never per micro-batch")
    kw = _adv_inputs(comp, B=8, seed=6)  # groups of two rows: rows 0–3 and 4–7 hold whole groups
    mask = kw["mask"]
    last = torch.zeros_like(mask)
    last[torch.arange(mask.shape[0]), mask.long().cumsum(-1).argmax(-1)] = True
    # continuous scores: the halves' statistics differ, so a statistic spanning the batch shows
    kw["token_rewards"] = torch.where(last, torch.randn(mask.shape, generator=_gen(7)), 0.0)
    adv, ret = comp(**kw)
    halves = [comp(**{k: v[rows] for k, v in kw.items()}) for rows in (slice(0, 4), slice(4, 8))]
    _close(torch.cat([h[0] for h in halves]), adv, "advantages of the halves vs the whole batch's", rtol=PARTITION_RTOL, atol=1e-7)
    _close(torch.cat([h[1] for h in halves]), ret, "returns of the halves vs the whole batch's", rtol=PARTITION_RTOL, atol=1e-7)


@_check("kl_controller", "a finite, non-negative value that updates")
def _klc(comp):
    ctl = comp()
    v0 = float(ctl.value)
    if not math.isfinite(v0) or v0 < 0:
        raise AssertionError(f"initial value {v0}")
    ctl.update(current_kl=0.5, n_steps=1)
    if not math.isfinite(float(ctl.value)) or float(ctl.value) < 0:
        raise AssertionError(f"value after update {ctl.value}")


@_check("task", "deterministic examples; demonstrations earn reward 1")
def _task(comp):
    task = comp()
    ex1 = task.train_examples(4, _gen(0))
    ex2 = task.train_examples(4, _gen(0))
    if [e.prompt for e in ex1] != [e.prompt for e in ex2]:
        raise AssertionError("train_examples is not deterministic given the generator state")
    if not task.eval_examples():
        raise AssertionError("eval_examples is empty")
    from rllab.rollout.accuracy import is_solved, scalar_reward

    names = tuple(member(task, "task", "reward_components"))
    for e in ex1 + task.eval_examples()[:4]:
        out = task.reward(e, task.demonstration(e))
        if names and (not isinstance(out, dict) or set(out) != set(names)):
            raise AssertionError(f"reward returned {out!r}, not a dict of its reward_components {names!r}")
        r = scalar_reward(task, out)
        if (r != 1.0) if not names else not is_solved(task, e, r, out):
            raise AssertionError(f"demonstration {task.demonstration(e)!r} for {e.prompt!r} scored {out!r}")
        if not math.isfinite(scalar_reward(task, task.reward(e, ""))):
            raise AssertionError("the empty completion's reward is not finite")


@_check("logger", "writes metrics and closes")
def _logger(comp):
    with tempfile.TemporaryDirectory() as d:
        lg = comp(run_dir=Path(d))
        if callable(getattr(lg, "start", None)):  # the optional start(config) of rllab.training.listeners
            lg.start({"name": "contract", "train": {"lr": 1e-5, "steps": 2}})
        lg.log(0, {"rollout/reward": 0.5})
        lg.log(1, {"rollout/reward": 0.75})
        lg.close()


@_check("rollout_backend", "grouped completions with per-token log-probs; seeded sampling repeats; last_metrics() a dict")
def _backend(comp):
    from rllab.models.tiny import TinyModelConfig, build_tiny_model
    from rllab.types import Completion, SamplingParams

    model, tok = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64))
    backend = comp()
    try:
        backend.update_weights(model)
        prompts = [tok("12+3=").input_ids, tok("7+80=").input_ids]
        params = SamplingParams(n=3, max_new_tokens=5, temperature=1.0, stop_token_ids=(tok.eos_token_id,), seed=7)
        out = backend.generate(prompts, params)
        if len(out) != 6 or not all(isinstance(c, Completion) for c in out):
            raise AssertionError(f"expected 6 Completions for 2 prompts × n=3, got {len(out)}")
        if [c.prompt_index for c in out] != [0, 0, 0, 1, 1, 1]:
            raise AssertionError(f"completions are not grouped by prompt: {[c.prompt_index for c in out]}")
        for c in out:
            if list(c.prompt_ids) != list(prompts[c.prompt_index]):
                raise AssertionError("a completion's prompt_ids differ from its prompt")
            if len(c.token_ids) > 5 or len(c.log_probs) != len(c.token_ids):
                raise AssertionError(f"{len(c.token_ids)} tokens, {len(c.log_probs)} log-probs (max_new_tokens=5)")
            if c.finish_reason not in ("stop", "length", "abort"):
                raise AssertionError(f"finish_reason {c.finish_reason!r}")
            if any(not (lp <= 0.0 and math.isfinite(lp)) for lp in c.log_probs):
                raise AssertionError(f"log-probs must be finite and ≤ 0: {c.log_probs}")
        again = backend.generate(prompts, params)
        if [c.token_ids for c in again] != [c.token_ids for c in out]:
            raise AssertionError("the same seed gave different samples")
        metrics = backend.last_metrics()
        if not isinstance(metrics, Mapping) or not all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in metrics.items()):
            raise AssertionError(f"last_metrics() must return a dict of str → float ({{}} when there is nothing), got {metrics!r}")
    finally:
        backend.close()


@_check("reward_function", "one finite float (or None) per completion, in its declared signature; no state between calls")
def _reward_function(comp):
    from rllab.rollout.rewards import RewardFunction

    fn = RewardFunction(name=comp.name, ref=comp.name, fn=comp.spec.fn, style=comp.trait("signature"), config=comp.config)
    kw = dict(
        prompts=["12+34=", "sort 31:", "5*5="], completions=["46", "31", "not an answer"],
        ground_truth=["46", "13", "25"], columns=[{"data_source": "check"}] * 3,
        rows=["contract row 1", "contract row 2", "contract row 3"],
    )
    out = fn.batch(**kw)
    if len(out) != 3:
        raise AssertionError(f"{len(out)} scores for 3 completions")
    chat = fn.batch(**{**kw, "prompts": [({"role": "user", "content": p},) for p in kw["prompts"]]})
    if fn.style == "trl" and chat != out:
        raise AssertionError(f"chat-format completions scored {chat} but the same texts as strings scored {out}")
    if fn.batch(**kw) != out:
        raise AssertionError("scoring the same completions twice gave different scores")
