"""Training on CUDA: placement, compute dtype, gradient checkpointing, a CPU reference.

Marked ``gpu``: deselected by default and skipped without CUDA (``python -m pytest -m gpu``).
"""

from __future__ import annotations

import math

import pytest
import torch

from rllab.training.trainer import Trainer, run_experiment

from .test_trainer import SMALL, _cache, small_cfg  # noqa: F401  (the module-scoped model cache)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _finite(m: dict) -> None:
    bad = {k: v for k, v in m.items() if isinstance(v, float) and not math.isfinite(v)}
    assert not bad, bad


def test_auto_device_trains_on_cuda_in_bfloat16(tmp_path):
    tr = Trainer(small_cfg("train.steps=2"), run_dir=tmp_path, progress=False)
    assert tr.device.type == "cuda" and tr.autocast_dtype == torch.bfloat16
    assert next(tr.policy.parameters()).device.type == "cuda"
    assert next(tr.policy.parameters()).dtype == torch.float32  # float32 master weights
    assert tr.backend.device.type == "cuda"
    for _ in range(2):
        m = tr.train_step()
        _finite(m)
    assert m["perf/peak_cuda_mb"] > 0
    tr.close()


def test_ppo_with_critic_and_kl_reference_on_cpu(tmp_path):
    cfg = small_cfg(
        "train.steps=2", "model.gradient_checkpointing=true", "model.reference_device=cpu", "algorithm.kl_in=loss",
        "kl_controller.kl_coef=0.01", preset="ppo",
    )  # fmt: skip
    tr = Trainer(cfg, run_dir=tmp_path, progress=False)
    assert next(tr.reference.parameters()).device.type == "cpu" and next(tr.critic.parameters()).device.type == "cuda"
    for _ in range(2):
        m = tr.train_step()
        _finite(m)
    assert "loss/value" in m and "loss/kl" in m
    tr.close()


@pytest.mark.parametrize("preset", ["dpo", "online_dpo"])
def test_preference_algorithms_on_cuda(tmp_path, preset):
    extra = ["algorithm.pairs=16", "algorithm.batch_size=8"] if preset == "dpo" else []
    summary = run_experiment(small_cfg("train.steps=2", *extra, preset=preset), run_dir=tmp_path / "run", progress=False)
    assert 0.0 <= summary["final/accuracy"] <= 1.0


def test_cuda_and_cpu_agree_on_the_first_step(tmp_path):
    """float32 on both devices: the same rollouts give the same loss to float rounding."""
    cpu = Trainer(small_cfg("model.device=cpu", "backend.device=cpu"), run_dir=tmp_path / "cpu", progress=False)
    gpu = Trainer(small_cfg("model.dtype=float32", "backend.device=cpu"), run_dir=tmp_path / "gpu", progress=False)
    a, b = cpu.train_step(), gpu.train_step()
    assert a["rollout/reward"] == b["rollout/reward"]  # same sampler device, same samples
    assert a["loss/policy"] == pytest.approx(b["loss/policy"], abs=1e-4)
    cpu.close()
    gpu.close()
