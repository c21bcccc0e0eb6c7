"""Settings for quick end-to-end tests: a smaller tiny model, short warm start, small steps.

``TINY`` holds the overrides as a dict; the ``model_cache`` fixture (tests/conftest.py) gives a
test module its own model cache.
"""

from __future__ import annotations

TINY = {
    "model.tiny.hidden_size": 64,
    "model.tiny.intermediate_size": 128,
    "model.warm_start.steps": 60,
    "model.warm_start.eval_limit": 0,
    "rollout.prompts_per_step": 4,
    "rollout.group_size": 4,
    "rollout.max_new_tokens": 6,
    "train.eval_size": 16,
    "train.checkpoint_every": 0,
}


def overrides(settings: dict) -> list[str]:
    """``key=value`` strings, as on the command line."""
    return [f"{k}={v}" for k, v in settings.items()]
