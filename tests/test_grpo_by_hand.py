"""examples/grpo_by_hand.py, the reading copy of one GRPO step, does what the ``rl`` algorithm does."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import attrs
import pytest
import torch

import rllab
from rllab.config import load_config
from rllab.training.trainer import Trainer

from .tiny import TINY, overrides

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grpo_by_hand.py"


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def load_example():
    spec = importlib.util.spec_from_file_location("grpo_by_hand", EXAMPLE)
    assert spec is not None and spec.loader is not None, EXAMPLE
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_step_is_the_rl_step(tmp_path):
    # the components the example names, the rl algorithm's defaults for the rest (aggregation), and a
    # temperature that is not 1, so that the example must pass it on
    cfg = load_config(None, [*overrides(TINY), "advantage=grpo", "policy_loss=ppo_clip", "algorithm.epochs=1",
                             "algorithm.minibatches=1", "rollout.temperature=0.8", "loggers=[]"])
    tr = Trainer(cfg, run_dir=tmp_path, progress=False)
    try:
        batch = tr.rollout.to_batch(tr.rollout.sample(0))
        # scores that differ within each group (the barely trained tiny model often scores a whole
        # group alike, which gives no advantage and no gradient)
        batch = attrs.evolve(batch, rewards=torch.rand(batch.rewards.shape, generator=torch.Generator().manual_seed(0)))
        weights, optimizer_state = copy.deepcopy(tr.policy.state_dict()), copy.deepcopy(tr.optimizer.state_dict())
        grads: list[list[torch.Tensor]] = []  # the (clipped) gradients each optimizer step applies

        def record(optimizer, *_):
            grads.append([p.grad.clone() for p in tr.policy.parameters() if p.grad is not None])

        tr.optimizer.register_step_pre_hook(record)

        # by hand, with the run's optimizer and settings
        loss, by_hand = load_example().grpo_step(
            tr.policy, tr.optimizer, batch, tr.lab, temperature=cfg.rollout.temperature, max_grad_norm=cfg.train.max_grad_norm
        )
        after_by_hand = copy.deepcopy(tr.policy.state_dict())

        # the rl algorithm's own step on the same batch, from the same weights and optimizer state
        tr.policy.load_state_dict(weights)
        tr.optimizer.load_state_dict(optimizer_state)
        ctx = attrs.evolve(tr.context(), rollout=rllab.RecordedRollout(batch=batch))
        outcome = tr.optimizers().drive(tr.algorithm.step(ctx), step=0, algorithm="rl", nonfinite="raise")
        rl = outcome.metrics
    finally:
        tr.close()

    assert outcome.stepped and len(grads) == 2, "one optimizer step each"
    assert by_hand["actor/grad_norm"] > 1e-3, "a step that moves the weights"
    assert loss.item() == pytest.approx(rl["loss/policy"], abs=1e-6)
    assert set(by_hand) <= set(rl), f"metrics rl does not report: {sorted(set(by_hand) - set(rl))}"
    for key, value in by_hand.items():
        assert value == pytest.approx(rl[key], rel=1e-5, abs=1e-6), key
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for name, value in tr.policy.state_dict().items():
        torch.testing.assert_close(after_by_hand[name], value, rtol=1e-5, atol=1e-6, msg=name)
