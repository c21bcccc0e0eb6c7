"""What the rl step acts on travels as typed values: the KL the controller adapts to (never read
back from a metric), and the reward components' weights on the batch."""

from __future__ import annotations

import attrs
import pytest
import torch

import rllab
from rllab.config import load_config
from rllab.training.trainer import Trainer

from .tiny import TINY, overrides

SMALL = [*overrides(TINY), "train.steps=3"]


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def _trainer(tmp_path, *extra):
    return Trainer(load_config(None, [*SMALL, *extra]), run_dir=tmp_path, progress=False)


def _controller_inputs(tr):
    """The controller's update calls, recorded; the reference moved off the policy (a nonzero KL)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in tr.reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g).to(p))
    seen = []
    update = tr.kl_controller.update
    tr.kl_controller.update = lambda **kw: seen.append(kw) or update(**kw)
    return seen


@pytest.mark.parametrize(
    "extra, logged",
    [
        (("algorithm.kl_in=reward", "algorithm.kl_measure=penalty_row_mean", "kl=k3"), "kl/current"),
        (("algorithm.kl_in=reward", "kl=k3"), "kl/policy_ref"),  # k1_token_mean: old − ref, old forward
        (("algorithm.kl_in=loss",), "kl/policy_ref"),  # on-policy: measured by the update's own forward
        (("algorithm.kl_in=loss", "algorithm.micro_batch_size=3"), "kl/policy_ref"),  # over micro-batches
    ],
    ids=["penalty_row_mean", "k1_token_mean", "on-policy", "on-policy-micro"],
)
def test_the_controller_gets_the_kl_measure_the_step_logs(tmp_path, extra, logged):
    tr = _trainer(tmp_path, "kl_controller=adaptive", "kl_controller.kl_coef=0.05", *extra)
    seen = _controller_inputs(tr)
    for _ in range(2):
        m = tr.train_step()
        assert seen[-1] == {"current_kl": m[logged], "n_steps": int(m["train/rows"])}
        assert m[logged] != 0.0
    assert len(seen) == 2
    if logged == "kl/current":  # the measures differ: the setting picks which one steers β
        assert m["kl/current"] != m["kl/policy_ref"]
    tr.close()


def test_the_controller_ignores_a_metric_named_like_the_kl(tmp_path, monkeypatch):
    """Metrics are only logged: a rollout metric called kl/current does not reach the controller."""
    tr = _trainer(tmp_path, "algorithm.kl_in=loss", "kl_controller=adaptive", "kl_controller.kl_coef=0.05")
    seen = _controller_inputs(tr)
    sample = tr.rollout.sample

    def with_metric(step, **kw):
        scored = sample(step, **kw)
        return attrs.evolve(scored, metrics={**scored.metrics, "kl/current": 123.0})

    monkeypatch.setattr(tr.rollout, "sample", with_metric)
    m = tr.train_step()
    assert m["kl/current"] == 123.0 and seen[-1]["current_kl"] == m["kl/policy_ref"] != 123.0
    tr.close()


# --------------------------------------------------------------------------- reward weights


def _sampled(tmp_path, *extra):
    tr = _trainer(tmp_path, "task.format_weight=0.25", *extra)
    batch = tr.rollout.to_batch(tr.rollout.sample(0))
    return tr, batch


def test_the_batch_carries_the_tasks_reward_weights(tmp_path):
    tr, batch = _sampled(tmp_path, "advantage=gdpo")
    assert batch.reward_component_names == ("correct", "format")
    assert batch.reward_component_weights == (1.0, 0.25)
    assert batch.select(torch.tensor([0, 2])).reward_component_weights == (1.0, 0.25)  # kept as is
    tr.close()
    tr = _trainer(tmp_path / "one")
    assert tr.rollout.to_batch(tr.rollout.sample(0)).reward_component_weights is None  # one reward
    tr.close()


@pytest.mark.parametrize("estimator", ["gdpo", "normalize_then_sum"])
def test_estimators_weigh_components_by_the_batchs_weights(tmp_path, estimator):
    tr, batch = _sampled(tmp_path, f"advantage={estimator}")
    ctx = tr.context()

    def advantages(b):
        return tr.algorithm.prepare(ctx, b)[0].advantages

    task = advantages(batch)
    other = advantages(attrs.evolve(batch, reward_component_weights=(1.0, 3.0)))
    assert not torch.equal(task, other)  # the weights on the batch are the ones used
    # the same weights given as the knob instead: the same advantages
    tr.close()
    tr, _ = _sampled(tmp_path / "knob", f"advantage={estimator}", "advantage.reward_weights=[1.0, 3.0]")
    knob = tr.algorithm.prepare(tr.context(), attrs.evolve(batch, reward_component_weights=None))[0].advantages
    assert torch.equal(knob, other)
    tr.close()


def test_a_batch_refuses_weights_that_do_not_match_its_components(tmp_path):
    tr, batch = _sampled(tmp_path, "advantage=gdpo")
    tr.close()
    with pytest.raises(ValueError, match="reward_component_weights has 3 entries for the 2 components"):
        attrs.evolve(batch, reward_component_weights=(1.0, 1.0, 1.0))


def test_a_recorded_rollout_gives_its_weights_to_the_batch(tmp_path):
    tr, batch = _sampled(tmp_path, "advantage=gdpo")
    tr.close()
    assert rllab.RecordedRollout(batch=batch).to_batch(None).reward_component_weights == (1.0, 0.25)
    given = rllab.RecordedRollout(batch=batch, component_weights=[1, 0.5]).to_batch(None)
    assert given.reward_component_weights == (1.0, 0.5)
    old = attrs.evolve(batch, reward_component_weights=None)  # a recording made before batches carried them
    assert rllab.RecordedRollout(batch=old).to_batch(None).reward_component_weights is None
