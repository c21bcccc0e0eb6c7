"""A short default job raises no deprecation warning from rllab's calls into transformers/torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from .tiny import TINY, overrides
from .warning_probe import ROOT, record_into


def _probe(tmp_path, *args):
    env = {**os.environ, "RLLAB_CACHE": str(tmp_path / "cache"), "PYTHONWARNINGS": "always"}
    cmd = [sys.executable, "-m", "tests.warning_probe", "run", *args, "--run-dir", str(tmp_path / "run"), "-q"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("WARNINGS ")][-1]
    return json.loads(line.removeprefix("WARNINGS ")), proc.stderr


def test_a_short_default_job_raises_no_deprecation_warning(tmp_path):
    """A fresh process (so transformers' once-only log messages show), its own model cache (so the
    warm start and its greedy probes run too), the default algorithm and backend."""
    found, stderr = _probe(tmp_path, *overrides(TINY), "train.steps=2", "model.warm_start.steps=20")
    assert found == [], json.dumps(found, indent=1)
    assert "deprecated" not in stderr.lower(), stderr[-4000:]  # transformers' logger notices too


def test_a_short_lora_job_raises_no_deprecation_warning(tmp_path):
    """The same with LoRA adapters (peft): peft reads transformers' deprecated
    ``is_gradient_checkpointing`` when it wraps the model, which warned on every LoRA run."""
    pytest.importorskip("peft")
    found, stderr = _probe(tmp_path, *overrides(TINY), "train.steps=2", "model.warm_start.steps=20", "model.lora.r=8")
    assert found == [], json.dumps(found, indent=1)
    assert "deprecated" not in stderr.lower(), stderr[-4000:]


def test_the_peft_filter_is_narrow():
    """Only transformers' warning about the old attribute name is silenced around peft's call:
    another FutureWarning, or the same text as another category, still shows."""
    from rllab.models.hfcompat import peft_deprecations_quiet

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with peft_deprecations_quiet():
            warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
            warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", UserWarning)
            warnings.warn("`past_key_values` is deprecated", FutureWarning)
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
    assert [(w.category, str(w.message)[:25]) for w in seen] == [
        (UserWarning, "`is_gradient_checkpointin"),
        (FutureWarning, "`past_key_values` is depr"),
        (FutureWarning, "`is_gradient_checkpointin"),
    ]


def test_the_probe_catches_an_old_style_call_and_names_rllabs_frame():
    """The check above can fail: the hf backend made to pass the cache the old way (as it does
    on a transformers without ``cache``) still samples, and its warnings name hf.py's call."""
    import rllab
    from rllab.models.tiny import TinyModelConfig, build_tiny_model
    from rllab.types import SamplingParams

    model, tok = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64))
    backend = rllab.Lab().get("rollout_backend", "hf", device="cpu")()
    backend.update_weights(model)
    params = SamplingParams(n=2, max_new_tokens=3, temperature=1.0, seed=0)
    prompts = [tok("1+1=").input_ids]
    found: list[dict] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record_into(found)
        new = backend.generate(prompts, params)
        assert found == []
        backend.cache_arg = "past_key_values"
        old = backend.generate(prompts, params)
    assert [c.token_ids for c in old] == [c.token_ids for c in new]
    assert found and all(w["category"] == "FutureWarning" and "past_key_values" in w["message"] for w in found)
    assert all("plugins/rllab_backends/hf.py:" in w["via"] for w in found)
