"""The rollout-vs-trainer log-prob gap: measured every step, and dialled with the sampler's precision.

A bfloat16 sampling copy (``backend.dtype``) against the float32 trainer makes the rollout policy
differ from the trained one by rounding alone, so the importance corrections have something to
correct on a CPU; a float32 copy reproduces the trainer's log-probs up to float noise.
"""

from __future__ import annotations

import math

import pytest
import torch

from rllab import ops
from rllab.config import load_config
from rllab.training.trainer import Trainer

from .tiny import TINY, overrides

SMALL = [*overrides(TINY), "train.steps=1", "train.eval_every=0"]


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def test_log_prob_gap_by_hand():
    # Δ = old − rollout over the valid tokens [0.1, −0.3, 0.2]; the masked NaN never matters
    old = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, 0.0, 0.0]])
    rollout = torch.tensor([[-1.1, -1.7, 0.0], [-0.7, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    d = [0.1, -0.3, 0.2]
    gap = ops.log_prob_gap(old, rollout, mask)
    assert float(gap["mismatch/abs_diff"]) == pytest.approx(0.6 / 3, abs=1e-6)
    assert float(gap["mismatch/k1"]) == pytest.approx(-sum(d) / 3, abs=1e-6)
    assert float(gap["mismatch/k3"]) == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 3, abs=1e-6)
    none = ops.log_prob_gap(old, rollout, torch.zeros_like(mask))
    assert all(float(v) == 0.0 for v in none.values())


def _gap(tmp_path, *extra):
    tr = Trainer(load_config(None, [*SMALL, *extra]), run_dir=tmp_path, progress=False)
    try:
        m = tr.train_step()
    finally:
        tr.close()
    return m


@pytest.mark.parametrize("prepared", [False, True], ids=["on-policy-forward", "old-log-prob-forward"])
def test_bfloat16_sampler_against_float32_trainer_shows_a_gap(tmp_path, prepared):
    """End to end on CPU: bfloat16 sampling gives a clearly nonzero gap, float32 sampling a ~zero
    one — whether the gap is measured in the update's forward (one epoch, one minibatch) or in the
    separate old-log-prob forward (two epochs)."""
    extra = ["algorithm.epochs=2"] if prepared else []
    bf16 = _gap(tmp_path / "bf16", "backend.dtype=bfloat16", *extra)
    fp32 = _gap(tmp_path / "fp32", "backend.dtype=float32", *extra)
    for m in (bf16, fp32):
        assert {"mismatch/abs_diff", "mismatch/k1", "mismatch/k3"} <= m.keys()
        assert all(math.isfinite(m[k]) for k in ("mismatch/abs_diff", "mismatch/k1", "mismatch/k3"))
    assert fp32["mismatch/abs_diff"] < 1e-4 and fp32["mismatch/k3"] < 1e-7
    # bfloat16 keeps 8 bits of mantissa: the logits, and with them the log-probs, move by ~1e-3 to 1e-2
    assert bf16["mismatch/abs_diff"] > 1e-3 and bf16["mismatch/abs_diff"] > 30 * fp32["mismatch/abs_diff"]
    assert bf16["mismatch/k3"] > 0
    print(f"abs_diff bf16 {bf16['mismatch/abs_diff']:.3g} fp32 {fp32['mismatch/abs_diff']:.3g}; "
          f"k3 bf16 {bf16['mismatch/k3']:.3g} fp32 {fp32['mismatch/k3']:.3g}")


def test_corrections_act_on_the_bfloat16_gap(tmp_path):
    """The dialled mismatch is what a correction sees: a tight token_k1 rejection drops part of
    the bfloat16 sampler's tokens, and its k1 estimate is the step's ``mismatch/k1``."""
    m = _gap(tmp_path, "backend.dtype=bfloat16", "correction=rejection", "correction.criterion=token_k1",
             "correction.upper=1.002")
    assert 0.0 < m["tis/rs_masked_frac"] < 1.0
    assert m["tis/k1_token"] == pytest.approx(m["mismatch/k1"], abs=1e-7)


def test_float16_sampler_shows_a_smaller_gap_than_bfloat16(tmp_path):
    """float16 keeps 10 bits of mantissa to bfloat16's 8: a gap well above float32's noise and a few
    times below bfloat16's (ideally 4×: two bits)."""
    fp16 = _gap(tmp_path / "fp16", "backend.dtype=float16")["mismatch/abs_diff"]
    bf16 = _gap(tmp_path / "bf16", "backend.dtype=bfloat16")["mismatch/abs_diff"]
    assert 1e-4 < fp16 < bf16 / 2


def test_a_sampling_dtype_with_shared_weights_is_refused():
    import rllab

    with pytest.raises(rllab.ConfigError, match=r"dtype = 'bfloat16' is the dtype of the sampling copy, but share_weights"):
        load_config(None, ["backend.dtype=bfloat16", "backend.share_weights=true"])


def test_the_readme_laptop_commands_are_valid_configs():
    """The commands of the README's "Off-policy corrections on a laptop" load as written."""
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("### Off-policy corrections on a laptop", 1)[1].split("\n#", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    commands = [shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("rllab run")]
    assert len(commands) >= 4
    for argv in commands:
        cfg = load_config(None, argv[2:])
        if "correction=rejection" in argv:
            assert cfg.component("correction").config.criteria == (("token_k1", 1 / 1.01, 1.01), ("seq_max_k3", None, 0.001))
