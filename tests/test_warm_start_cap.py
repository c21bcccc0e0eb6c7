"""A config that only adds ``rollout.max_prompt_tokens`` (as ``rllab import`` writes from verl's
``data.max_prompt_length``) reuses the cached warm start when the cap drops none of the prompts the
warm start read; a cap that would drop some builds its own."""

import json

import pytest

from rllab.config import load_config
from rllab.errors import ConfigError
from rllab.models import tiny
from rllab.training.export import base_model_dir, build_source
from tests.tiny import TINY, overrides

BASE = [*overrides(TINY), "model.warm_start.steps=5"]


def _dir(lab, *extra):
    cfg = load_config(None, [*BASE, *extra], lab=lab)
    return base_model_dir(cfg, build_source(cfg, lab))


def test_a_cap_that_drops_nothing_reuses_the_warm_start(lab, tmp_path, monkeypatch):
    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path))
    first = _dir(lab)
    record = json.loads((first / tiny.METRICS_FILE).read_text())
    assert record["longest_prompt"] == 7  # "12+34=": <bos> and six characters, every prompt of two-digit addition

    class Rebuilt(Exception):
        pass

    def no_rebuild(*a, **k):
        raise Rebuilt

    monkeypatch.setattr(tiny, "warm_start", no_rebuild)
    assert _dir(lab, "rollout.max_prompt_tokens=32") == first
    assert _dir(lab, "rollout.max_prompt_tokens=7") == first
    with pytest.raises((Rebuilt, ConfigError)):  # a cap below the longest prompt: a warm start of its own (here every prompt is dropped)
        _dir(lab, "rollout.max_prompt_tokens=6")
