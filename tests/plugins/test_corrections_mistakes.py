"""Importance-correction knobs under which nothing is learnt are refused when the config loads."""

import pytest

from rllab.config import ConfigError, load_config


@pytest.mark.parametrize("name", ["token_mask", "mis", "sequence_mask"])
@pytest.mark.parametrize(
    ("knobs", "said"),
    [
        (["correction.c_min=1.5"], "c_min = 1.5, c_max = 2.0"),
        (["correction.c_max=0.5"], "c_max = 0.5 (c_min unset)"),
        (["correction.c_min=0.5", "correction.c_max=0.9"], "c_min = 0.5, c_max = 0.9"),
    ],
)
def test_mask_bounds_that_exclude_an_on_policy_weight_are_refused(lab, name, knobs, said):
    """Class: knobs that train nothing. IcePop bounds [c_min, c_max] of the masking corrections
    that exclude 1 zero the weight of every on-policy token (π_train/π_rollout = 1): every token
    rejected, a gradient of 0 at every step. Refused at load, naming the knobs and their values."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"correction={name}", *knobs], lab=lab)
    assert said in str(e.value) and "every on-policy token would be rejected" in str(e.value)
    assert "[correction]" in str(e.value)


def test_mask_bounds_are_checked_in_a_schedule_too_and_truncation_is_unchanged(lab):
    """Class: knobs that train nothing. A ``[[schedule]]`` entry that moves the bounds off 1 is
    refused the same way; the truncating forms, which only clamp, keep accepting such bounds."""
    with pytest.raises(ConfigError, match="c_min = 1.5"):
        load_config({"correction": "token_mask", "schedule": [{"step": 1, "set": {"correction.c_min": 1.5}}]}, lab=lab)
    for name in ("token_mask", "sequence_mask"):
        cfg = load_config(None, [f"correction={name}", "correction.c_min=0.5", "correction.c_max=1.0"], lab=lab)
        assert cfg.component("correction").config.c_max == 1.0  # 1 itself is kept
    for name in ("token_truncate", "sequence_truncate"):
        cfg = load_config(None, [f"correction={name}", "correction.c_max=0.5"], lab=lab)
        assert cfg.component("correction").config.c_max == 0.5
