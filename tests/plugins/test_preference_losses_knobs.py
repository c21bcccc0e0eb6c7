"""Preference-loss knobs are part of the interface: names, order, defaults, types, ranges and help
of every registered preference loss, compared with a snapshot (``preference_knobs.json``).

Regenerate the snapshot only for an intended change of a knob:
``python -m tests.plugins.test_preference_losses_knobs > tests/plugins/preference_knobs.json``.
"""

import json
import pathlib

import pytest

import rllab

SNAPSHOT = pathlib.Path(__file__).with_name("preference_knobs.json")


def describe() -> dict:
    """Every preference loss: aliases, config class, docstrings and knobs, in registration order."""
    out = {}
    for spec in rllab.Lab().specs("preference_loss"):
        out[spec.name] = {
            "aliases": list(spec.aliases),
            "summary": spec.summary,
            "doc": spec.doc,
            "config": spec.config.__name__,
            "config_doc": spec.config.__doc__,
            "knobs": [
                {"name": k.name, "default": repr(k.default), "type": k.type, "allowed": k.allowed, "help": k.help}
                for k in spec.knobs()
            ],
        }
    return out


def test_preference_knobs_match_the_snapshot():
    assert describe() == json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def test_settings_a_loss_does_not_expose_are_not_knobs():
    """The base config's fixed values (reverse KL, no smoothing, ...) are read by the formulas but
    are refused as knobs of a loss whose config does not declare them."""
    lab = rllab.Lab()
    for name, knob in (("nca_pair", "f_divergence_type"), ("aot", "discopop_tau"), ("cdpo", "running_mean")):
        with pytest.raises(rllab.ConfigError, match=f"has no knob {knob!r}"):
            lab.get("preference_loss", name, **{knob: "x"})


if __name__ == "__main__":
    print(json.dumps(describe(), indent=1, ensure_ascii=False))
