"""rllab's update on TRL's own batches, optimizer step by optimizer step (``rllab crosscheck trl``).

Each generation batch TRL trained on (:class:`rllab_referee.trl_capture.Generation`) becomes one
rllab training step: its rows (prompt and completion ids, masks, TRL's reward and the prompt's
group) are a :class:`rllab.types.RolloutBatch` handed to the configured algorithm by a
:class:`rllab.RecordedRollout`, exactly as ``rllab replay`` does; rllab computes the advantages,
losses and updates itself, from its own optimizer (AdamW, ``train.*``) and learning-rate schedule.

Minibatch membership: TRL shuffles a generation batch once and splits it into micro-batches, the
same split in every iteration (``num_iterations``); the import sets ``minibatch_order = "once"``,
so rllab too draws one permutation and keeps it. The rows are handed to rllab in the order that
makes that permutation's minibatches TRL's optimizer steps (the permutation the ``rl`` algorithm
draws is reproduced here), so the comparison is step for step in every epoch.

Recorded per optimizer step: the gradient norm before clipping (:func:`grad_norm`, measured as TRL's is), the learning rate, the weights
after it; per generation: ``loss/total`` (the mean over its optimizer steps).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rllab.algorithm import seed_for


def generation_batch(chunks: Sequence[dict[str, torch.Tensor]]):
    """The :class:`RolloutBatch` of TRL's micro-batches, rows in TRL's training order."""
    from rllab.types import RolloutBatch

    def cat(key, left=False):  # generation batches of different widths: prompts padded left, completions right
        width = max(c[key].shape[1] for c in chunks) if chunks[0][key].dim() == 2 else 0
        parts = []
        for c in chunks:
            x = c[key]
            if width and x.shape[1] < width:
                pad = torch.zeros(x.shape[0], width - x.shape[1], dtype=x.dtype)
                x = torch.cat([pad, x] if left else [x, pad], 1)
            parts.append(x)
        return torch.cat(parts)

    prompt, completion = cat("prompt_ids", left=True), cat("completion_ids")
    pmask, cmask = cat("prompt_mask", left=True).bool(), cat("completion_mask").bool()
    old = cat("old_per_token_logps").float() if "old_per_token_logps" in chunks[0] else torch.zeros(completion.shape)
    return RolloutBatch(
        input_ids=torch.cat([prompt, completion], 1), attention_mask=torch.cat([pmask, cmask], 1), response_mask=cmask,
        rollout_log_prob=old, index=cat("rllab_group").long(), rewards=cat("rllab_reward").float(),
    )


def rllab_order(cfg: Any, step: int, rows: int) -> torch.Tensor | None:
    """The permutation the ``rl`` algorithm draws for the first epoch of ``step`` (None: no shuffle)."""
    a = cfg.component("algorithm").config
    if getattr(a, "minibatches", 1) <= 1 or getattr(a, "minibatch_order", "reshuffle") == "in_order":
        return None
    gen = torch.Generator().manual_seed(seed_for(cfg.train.seed, step, 2))
    return torch.randperm(rows, generator=gen)


def permute_for_rllab(batch, order: torch.Tensor | None):
    """``batch`` reordered so that ``batch'[order] == batch``: rllab's minibatches are then TRL's."""
    import attrs

    if order is None:
        return batch
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    out = {}
    for f in attrs.fields(type(batch)):
        v = getattr(batch, f.name)
        out[f.name] = v[inverse] if isinstance(v, torch.Tensor) and v.shape[:1] == (order.numel(),) else v
    return type(batch)(**out)


def grad_norm(grads) -> float:
    """The gradient norm as TRL's Trainer logs it (``clip_grad_norm_``'s total: per-tensor norms, then
    their norm). Not the norm of the gradients concatenated into one vector: torch's float32 norm of a
    vector of 10⁵–10⁶ entries comes out low by up to a few 1e-5 (its accumulated rounding), which read
    as rllab's gradient norm sitting below TRL's in every step."""
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def run_rllab(cfg: Any, lab: Any, *, model_dir: str, generations: Sequence[Any]) -> dict[str, list]:
    """rllab's steps on TRL's ``generations``; returns ``grad_norm``, ``lr``, ``weights`` (per
    optimizer step) and ``loss`` (per generation)."""
    from transformers import AutoModelForCausalLM

    from rllab import RecordedRollout
    from rllab.training import parts
    from rllab.training.optimizer import advance_per_step, lr_scheduler

    torch.manual_seed(cfg.train.seed)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    built = parts.build_parts(cfg, lab)
    algo_name = cfg.component("algorithm").name
    # TRL's reference model (beta > 0) is the initial model, frozen
    needs = built.algorithm.needs(parts.run_context(cfg, built.components, step=0, policy=policy, hook=lab.hook))
    reference = None
    if "reference" in needs:
        reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval().requires_grad_(False)
    optimizer, _ = parts.build_optimizers(cfg, parts.FullPolicy(policy))
    scheduler = lr_scheduler(optimizer, cfg.train)
    params = list(policy.parameters())
    out: dict[str, list] = {"grad_norm": [], "lr": [], "weights": [], "loss": [], "reward": []}

    def observe(request, params=params):  # before the optimizer checks and clips the gradient
        out["grad_norm"].append(grad_norm([p.grad for p in params if p.grad is not None]))
        out["lr"].append(float(optimizer.param_groups[0]["lr"]))

    hook = optimizer.register_step_post_hook(
        lambda *_: out["weights"].append({k: v.detach().clone() for k, v in policy.state_dict().items()}))
    try:
        for step, generation in enumerate(generations):
            batch = generation_batch(generation.chunks)
            batch = permute_for_rllab(batch, rllab_order(cfg, step, batch.input_ids.shape[0]))
            ctx = parts.run_context(cfg, built.components, step=step, policy=policy, reference=reference,
                                    rollout=RecordedRollout(batch=batch), hook=lab.hook)
            drv = parts.optimizers(cfg, policy=policy, optimizer=optimizer, observe=observe)
            outcome = drv.drive(built.algorithm.step(ctx), step=step, algorithm=algo_name, nonfinite=cfg.train.nonfinite)
            # the loss backpropagated (TRL's: policy, KL and entropy terms together)
            out["loss"].append(float(outcome.metrics.get("loss/total", outcome.metrics.get("loss/policy", float("nan")))))
            out["reward"].append(float(batch.rewards.mean()))
            advance_per_step(scheduler, cfg.train)
    finally:
        hook.remove()
    return out
