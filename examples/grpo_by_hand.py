"""One GRPO training step written out by hand, from rllab's parts: a reading copy of what the
``rl`` algorithm's step does with ``advantage = "grpo"``, ``policy_loss = "ppo_clip"``, the default
aggregation, one epoch and one minibatch (``plugins/rllab_algorithms/rl.py`` is the real thing,
with micro-batches, KL, critics and corrections; ``tests/test_grpo_by_hand.py`` keeps the two equal)::

    python examples/grpo_by_hand.py
"""

from __future__ import annotations

import argparse
import tempfile

import torch

import rllab
from rllab import grouped_response_logprobs


def grpo_step(policy, optimizer, batch: rllab.RolloutBatch, lab: rllab.Lab, *, temperature=1.0, max_grad_norm=1.0):
    """Train ``policy`` one step on ``batch``; returns the loss and the step's metrics."""
    # The components, by name from the plugin registry -- the names a config file would give.
    estimator = lab.get("advantage_estimator", "grpo")  # A_i = (s_i − mean of its group) / (std + ε)
    policy_loss = lab.get("policy_loss", "ppo_clip")  # max(−A·r, −A·clip(r, 1 − ε, 1 + ε)), r = π/π_old
    aggregation = lab.get("loss_aggregation", "token-mean")  # rl's default: the mean over every valid token
    mask = batch.response_mask  # (B, T): True on the tokens the model generated

    # 1. Advantages. Rows sampled from the same prompt share an ``index``; each row's score (its
    #    reward, on its last token) is compared with its group's and the result is spread over the
    #    row's tokens. No gradient flows through them.
    advantages, _returns = estimator(token_rewards=batch.token_rewards, mask=mask, index=batch.index)

    # 2. Log-probabilities of the sampled tokens under the current policy (with gradient). Rows of
    #    one prompt share the prompt's forward; the entropy is only reported.
    log_prob, entropy = grouped_response_logprobs(
        policy, batch.input_ids, batch.attention_mask, batch.response_length, with_entropy=True, temperature=temperature
    )

    # 3. The policy loss. One epoch of one minibatch is fully on-policy: the policy that sampled
    #    the batch *is* the current one, so its log-probs are this forward's, detached. The ratio
    #    r is then 1 and the gradient is −A·∇log π, averaged over tokens by the aggregation.
    loss, loss_metrics = policy_loss(
        log_prob=log_prob,
        old_log_prob=log_prob.detach(),
        advantages=advantages,
        mask=mask,
        aggregate=lambda loss_mat, m: aggregation(loss_mat=loss_mat, mask=m),
        rollout_log_prob=batch.rollout_log_prob,  # read only by ppo_clip's optional off-policy mask
    )

    # 4. Backward, clip the gradient's norm, and step the optimizer (rllab.Optimizers
    #    does this for every algorithm; it also refuses a non-finite gradient).
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for p in policy.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    metrics = {k: float(v) for k, v in loss_metrics.items()}  # actor/approx_kl, actor/clipfrac, ...
    metrics["loss/policy"] = loss.item()
    metrics["actor/entropy"] = rllab.ops.masked_mean(entropy.detach(), mask).item()
    metrics["actor/grad_norm"] = float(grad_norm)  # before clipping
    metrics["adv/mean"] = rllab.ops.masked_mean(advantages, mask).item()
    return loss.detach(), metrics


def main() -> None:
    from rllab import Trainer, load_config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if extra := parser.parse_known_args()[1]:
        parser.error(f"it takes no settings (got {' '.join(extra)}): the step is written for rl's defaults; `rllab run` takes settings")
    lab = rllab.Lab()  # every installed plugin's components
    cfg = load_config(None, ["loggers=[]"], lab=lab)  # the defaults: the tiny model on the addition task
    with tempfile.TemporaryDirectory() as run_dir:
        # The trainer is used only to build the tiny model and to sample one batch of rollouts.
        trainer = Trainer(cfg, lab=lab, run_dir=run_dir, progress=False)
        try:
            batch = trainer.rollout.to_batch(trainer.rollout.sample(0))  # a group of samples per prompt, scored
            optimizer = torch.optim.AdamW(trainer.policy.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
            loss, metrics = grpo_step(trainer.policy, optimizer, batch, lab,
                                      temperature=cfg.rollout.temperature, max_grad_norm=cfg.train.max_grad_norm)
        finally:
            trainer.close()
    # On-policy the loss's value is minus the mean advantage per token (often about 0): what trains is its gradient.
    print(f"{batch.input_ids.shape[0]} rows, mean reward {batch.rewards.mean().item():.3f}, loss {loss.item():.4g}")
    for name, value in sorted(metrics.items()):
        print(f"  {name:<20} {value:.4g}")


if __name__ == "__main__":
    main()
