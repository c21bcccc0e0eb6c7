"""Every rollout an algorithm is handed (``ctx.rollout``) has each member of the declared
protocol, rllab.Rollout, and the wrappers forward nothing else."""

from __future__ import annotations

import typing

import pytest
import torch

import rllab
from rllab.rollout import asynchronous as asyncrollout
from rllab.algorithm import ROLLOUT_MEMBERS
from rllab.config import load_config
from rllab.training.trainer import Trainer

from .tiny import TINY, overrides

SMALL = [*overrides(TINY), "train.steps=3"]


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def test_the_member_list_is_the_protocols():
    assert set(ROLLOUT_MEMBERS) == set(typing._get_protocol_attrs(rllab.Rollout))
    assert {"sample", "to_batch", "greedy_rewards", "evaluate", "tokenizer"} <= set(ROLLOUT_MEMBERS)


def test_the_stage_and_the_async_wrapper_implement_the_protocol(tmp_path):
    tr = Trainer(load_config(None, [*SMALL, "rollout.max_staleness=1"]), run_dir=tmp_path, progress=False)
    try:
        ar, stage = tr.rollout, tr.rollout.stage
        assert isinstance(stage, rllab.Rollout) and isinstance(ar, rllab.Rollout) and ar.samples_ahead
        assert tr.context().rollout is ar
        assert ar.tokenizer is stage.tokenizer and ar.task is stage.task
        assert ar.encode("1+1=") == stage.encode("1+1=")
        assert ar.sampling_params(0, n=2) == stage.sampling_params(0, n=2)
        # members of the stage outside the protocol are not forwarded
        assert hasattr(stage, "component_names") and hasattr(stage, "runner")
        for name in ("component_names", "runner", "decode", "no_such_member"):
            with pytest.raises(AttributeError, match=f"no member '{name}'.*members of rllab.Rollout only"):
                getattr(ar, name)
        # nor are the backend's own attributes by the versioned backend around it
        assert isinstance(tr.backend, asyncrollout.VersionedBackend)
        assert hasattr(tr.backend.inner, "model")
        with pytest.raises(AttributeError, match="model"):
            tr.backend.model  # noqa: B018
        assert tr.backend.follow_weights is None and tr.backend.pushes_in_flight is False
        assert isinstance(tr.backend, rllab.RolloutBackend)
    finally:
        tr.close()


def test_a_recorded_rollout_has_every_member():
    batch = rllab.RolloutBatch(
        input_ids=torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 3, dtype=torch.bool),
        response_mask=torch.ones(1, 2, dtype=torch.bool), rollout_log_prob=torch.zeros(1, 2),
        index=torch.zeros(1, dtype=torch.long), rewards=torch.zeros(1),
    )  # fmt: skip
    rec = rllab.RecordedRollout(batch=batch)
    missing = [n for n in ROLLOUT_MEMBERS if not hasattr(type(rec), n)]
    assert not missing
    assert rec.to_batch(rec.sample(0)) is batch
    calls = {
        "task": lambda: rec.task, "tokenizer": lambda: rec.tokenizer, "greedy_rewards": lambda: rec.greedy_rewards([]),
        "generate": lambda: rec.generate([], None), "play": lambda: rec.play([], None), "sampling_params": lambda: rec.sampling_params(0, n=1),
        "score_components": lambda: rec.score_components([], []), "solved": lambda: rec.solved(None, 0.0),
        "encode": lambda: rec.encode("x"), "response_ids": lambda: rec.response_ids("x"), "evaluate": lambda: rec.evaluate(1),
    }  # fmt: skip
    assert set(calls) | {"sample", "to_batch"} == set(ROLLOUT_MEMBERS)
    for name, call in calls.items():
        with pytest.raises(rllab.RllabError, match="a recorded rollout cannot"):
            call()
