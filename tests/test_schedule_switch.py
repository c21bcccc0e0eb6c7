"""``[[schedule]]`` entries that switch a component by name start from the new component."""

import pytest

from rllab.config import ConfigError, apply_schedule, load_config


def _at(cfg, step, lab):
    """The config in force at ``step``: the entries up to it applied in order, as the trainer does."""
    for entry in cfg.schedule:
        if entry.step <= step:
            cfg = apply_schedule(cfg, entry, lab=lab)
    return cfg


@pytest.mark.parametrize("key", ["policy_loss", "policy_loss.name"])
def test_a_schedule_switch_by_name_starts_from_the_new_components_defaults(lab, key):
    """Class: a schedule that does something else than it says. ``policy_loss.name = "gspo"``
    kept ppo_clip's knobs (``log_ratio_clamp``: refused as a gspo knob; ``clip_high = 0.2``: kept
    for cispo, whose own default is 5). Either spelling of the switch starts from the new
    component's defaults plus the knobs given in the same entry."""
    for name, expect in (("gspo", {"clip_low": 3e-4, "clip_high": 4e-4}), ("cispo", {"clip_high": 5.0})):
        cfg = load_config({"train": {"steps": 4}, "schedule": [{"step": 2, "set": {key: name}}]}, lab=lab)
        ref = _at(cfg, 2, lab).component("policy_loss")
        assert ref.name == name and {k: getattr(ref.config, k) for k in expect} == expect
    cfg = load_config(
        {"train": {"steps": 4}, "schedule": [{"step": 1, "set": {key: "gspo", "policy_loss.clip_high": 5e-4}}]}, lab=lab
    )
    ref = _at(cfg, 1, lab).component("policy_loss")
    assert (ref.name, ref.config.clip_low, ref.config.clip_high) == ("gspo", 3e-4, 5e-4)
    # the same on the command line: a knob of the replaced component does not follow it
    cfg = load_config({"policy_loss": {"name": "ppo_clip", "clip_high": 0.28}}, [f"{key}=cispo"], lab=lab)
    assert cfg.component("policy_loss").config.clip_high == 5.0


def test_schedule_entries_are_checked_on_the_config_the_earlier_ones_made(lab):
    """Class: a schedule accepted at load that fails (or is refused) mid-run. An entry is checked
    against the config in force at its step: a knob of the component switched to earlier is
    accepted, one of the component switched away from is refused at load."""
    schedule = [{"step": 1, "set": {"policy_loss": "gspo"}}, {"step": 2, "set": {"policy_loss.log_ratio_max": 5.0}}]
    cfg = load_config({"train": {"steps": 4}, "schedule": schedule}, lab=lab)
    assert _at(cfg, 2, lab).component("policy_loss").config.log_ratio_max == 5.0
    schedule[1] = {"step": 2, "set": {"policy_loss.log_ratio_clamp": 10.0}}
    with pytest.raises(ConfigError, match="schedule at step 2.*gspo.*log_ratio_clamp"):
        load_config({"train": {"steps": 4}, "schedule": schedule}, lab=lab)
