"""``rollout.max_staleness = k`` with ``rollout.run_ahead = false`` is the synchronous run, value for value."""

from __future__ import annotations

import pytest
import torch

from rllab.config import load_config
from rllab.errors import ConfigError
from rllab.training.trainer import Trainer

from .tiny import TINY, overrides

# entropy bonus and no warm-up: every step changes the weights, so a stale batch would show
SMALL = [*overrides(TINY), "train.steps=3", "train.seed=2", "algorithm.entropy_coef=0.05", "train.warmup_steps=0", "train.lr=3e-3"]


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def _run(path, *extra):
    """Three steps; the metrics that do not measure time or memory, and the final weights."""
    tr = Trainer(load_config(None, [*SMALL, *extra]), run_dir=path, progress=False)
    try:
        rows = [tr.train_step() for _ in range(3)]
        weights = {k: v.clone() for k, v in tr.policy.state_dict().items()}
    finally:
        tr.close()
    keep = [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "async/"))} for r in rows]
    return keep, rows, weights


def test_async_without_run_ahead_equals_sync_and_with_run_ahead_differs(tmp_path):
    threads = torch.get_num_threads()
    sync, _, w_sync = _run(tmp_path / "sync")
    fresh, fresh_rows, w_fresh = _run(tmp_path / "fresh", "rollout.max_staleness=2", "rollout.run_ahead=false")
    ahead, ahead_rows, _ = _run(tmp_path / "ahead", "rollout.max_staleness=2")
    assert torch.get_num_threads() == threads
    assert [r["async/staleness_max"] for r in fresh_rows] == [0.0, 0.0, 0.0]
    assert [r["async/staleness_max"] for r in ahead_rows] == [0.0, 1.0, 2.0]
    for key in ("loss/policy", "rollout/reward", "actor/grad_norm"):
        assert key in sync[0], key
    assert fresh == sync  # exact equality: losses, rewards, gradient norms, every other value
    assert all(torch.equal(w_sync[k], w_fresh[k]) for k in w_sync)
    # step 0 is sampled with W(0) either way; the trainer ran on half the torch threads while the
    # producer sampled ahead, and a thread count may move float reductions (docs/reproducibility.md)
    assert ahead[0].keys() == sync[0].keys()
    assert {k: v for k, v in ahead[0].items() if k.startswith("rollout/")} == {k: v for k, v in sync[0].items() if k.startswith("rollout/")}
    assert ahead[0] == pytest.approx(sync[0], rel=1e-5, abs=1e-6)
    assert ahead[1:] != sync[1:]  # batches sampled ahead: the comparison can tell


def test_run_ahead_off_without_max_staleness_is_refused():
    with pytest.raises(ConfigError, match=r"run_ahead = False applies only with max_staleness > 0"):
        load_config(None, ["rollout.run_ahead=false"])
