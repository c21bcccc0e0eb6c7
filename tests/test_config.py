"""Experiment configs: TOML, presets, overrides, schedules and their errors."""

import textwrap

import pytest

from rllab.config import ConfigError, apply_schedule, dump_toml, load_config, parse_value, preset_names


def write(tmp_path, text):
    p = tmp_path / "exp.toml"
    p.write_text(textwrap.dedent(text))
    return p


def test_defaults_validate(lab):
    cfg = load_config(None, lab=lab)
    assert cfg.component("advantage").name == "grpo"
    assert cfg.component("policy_loss").name == "ppo_clip"
    assert cfg.component("algorithm").name == "rl"


def test_toml_sections_and_overrides(tmp_path, lab):
    p = write(
        tmp_path,
        """
        name = "exp"
        [train]
        steps = 7
        [policy_loss]
        name = "ppo_clip"
        clip_high = 0.25
        [advantage]
        name = "grpo"
        norm_by_std = false
        """,
    )
    cfg = load_config(p, ["policy_loss.clip_high=0.28", "advantage=rloo", "train.lr=0.01"], lab=lab)
    assert cfg.name == "exp" and cfg.train.steps == 7 and cfg.train.lr == 0.01
    assert cfg.component("policy_loss").knobs == {"clip_high": 0.28}
    # switching component drops the old component's knobs
    assert cfg.component("advantage").name == "rloo" and cfg.component("advantage").knobs == {}
    assert lab.get("policy_loss", "ppo_clip", **cfg.component("policy_loss").knobs).config.clip_high == 0.28


def test_bad_knob_points_at_toml_line(tmp_path, lab):
    p = write(
        tmp_path,
        """
        [train]
        steps = 3

        [policy_loss]
        name = "ppo_clip"
        clip_hihg = 0.28
        """,
    )
    with pytest.raises(ConfigError) as e:
        load_config(p, lab=lab)
    msg = str(e.value)
    assert "[policy_loss] (line 7)" in msg and "clip_hihg" in msg and "did you mean 'clip_high'" in msg


def test_unknown_component_lists_known(tmp_path, lab):
    p = write(tmp_path, '[advantage]\nname = "grop"\n')
    with pytest.raises(ConfigError) as e:
        load_config(p, lab=lab)
    assert "(line 2)" in str(e.value) and "Did you mean 'grpo'" in str(e.value) and "rloo" in str(e.value)


def test_bad_plain_setting(tmp_path, lab):
    p = write(tmp_path, "[train]\nsteps = -1\n")
    with pytest.raises(ConfigError, match=r"steps = -1 is out of range: must be ≥ 0 \(line 2\)"):
        load_config(p, lab=lab)
    p = write(tmp_path, "[train]\nstep = 1\n")
    with pytest.raises(ConfigError, match="did you mean 'steps'|Did you mean 'steps'"):
        load_config(p, lab=lab)
    p = write(tmp_path, "[trian]\nsteps = 1\n")
    with pytest.raises(ConfigError, match="unknown key 'trian'.*Did you mean 'train'"):
        load_config(p, lab=lab)


def test_malformed_toml(tmp_path, lab):
    p = write(tmp_path, "[train\nsteps = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p, lab=lab)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml", lab=lab)


def test_override_syntax_errors(lab):
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["policy_loss.clip_high"], lab=lab)


def test_parse_value():
    assert parse_value("0.28") == 0.28 and parse_value("3") == 3 and parse_value("true") is True
    assert parse_value("rloo") == "rloo" and parse_value("[1, 2]") == [1, 2]


def test_schedule_is_validated_and_applied(tmp_path, lab):
    p = write(
        tmp_path,
        """
        [[schedule]]
        step = 5
        set = { "policy_loss" = "cispo", "algorithm.entropy_coef" = 0.01 }
        """,
    )
    cfg = load_config(p, lab=lab)
    new = apply_schedule(cfg, cfg.schedule[0], lab=lab)
    assert new.component("policy_loss").name == "cispo" and new.component("algorithm").config.entropy_coef == 0.01
    bad = write(tmp_path, '[[schedule]]\nstep = 5\nset = { "policy_loss" = "nope" }\n')
    with pytest.raises(ConfigError, match="schedule at step 5.*nope"):
        load_config(bad, lab=lab)


def test_presets_all_validate(lab):
    names = preset_names()
    for expected in ("grpo", "ppo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo", "cispo", "dpo", "online_dpo"):
        assert expected in names
    for name in names:
        load_config(None, preset=name, lab=lab)


def test_dump_roundtrip(lab):
    import tomllib

    cfg = load_config(None, ["policy_loss.clip_high=0.28"], preset="dapo", lab=lab)
    again = load_config(tomllib.loads(dump_toml(cfg.to_dict())), lab=lab)
    assert again.to_dict() == cfg.to_dict()


@pytest.mark.parametrize(
    "schedule, match",
    [
        ([{"step": 10, "set": {"train.lr": 1e-5}}], r"schedule entry at step 10 .*can never apply: train.steps = 10 runs steps 0 … 9"),
        ([{"step": 3, "set": {}}], r"schedule entry at step 3 sets nothing"),
        ([{"step": 2, "set": {"policy_loss": "cispo"}}, {"step": 2, "set": {"policy_loss": "gspo", "train.lr": 1e-5}}],
         r"two schedule entries at step 2 set 'policy_loss'.*only the later would apply"),
    ],
)
def test_a_schedule_entry_that_would_do_nothing_is_refused(lab, schedule, match):
    """Class: a knob that does nothing. A `[[schedule]]` entry the run never reaches, or one whose
    key another entry at the same step overwrites, was accepted and silently dropped."""
    with pytest.raises(ConfigError, match=match):
        load_config({"schedule": schedule}, ["train.steps=10"], lab=lab)
    ok = [{"step": 2, "set": {"policy_loss": "cispo"}}, {"step": 2, "set": {"train.lr": 1e-5}}, {"step": 9, "set": {"train.lr": 2e-5}}]
    assert len(load_config({"schedule": ok}, ["train.steps=10"], lab=lab).schedule) == 3



@pytest.mark.parametrize(
    "schedule, match",
    [
        ({"step": 1, "set": {"train.lr": 1e-5}}, r"schedule must be a list of entries \(\[\[schedule\]\] tables.*got dict"),
        ([{"step": 1, "set": ["train.lr=1e-5"]}], r"schedule entry 0: set must be a table of settings.*got list \['train.lr=1e-5'\]"),
        ([{"step": 1, "set": {"train.lr": 1e-5}, "train.lr": 2e-5}], r"schedule entry 0 has unknown key\(s\) 'train.lr'.*step and set only"),
        ([{"step": True, "set": {"train.lr": 1e-5}}], r"schedule entry 0: step must be a non-negative integer, got True"),
    ],
)
def test_a_malformed_schedule_is_refused_naming_the_entry_and_value(lab, schedule, match):
    """Class: a malformed [[schedule]]. A `set` given as a list crashed with a ValueError from dict();
    `[schedule]` (a table) was read key by key; a stray key beside `set` was ignored."""
    with pytest.raises(ConfigError, match=match):
        load_config({"schedule": schedule}, ["train.steps=10"], lab=lab)

def test_digits_for_a_text_knob_are_refused_with_how_to_quote_them():
    from rllab.config import load_config
    from rllab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"sha256 = 12345678 has the wrong type.*read as a number: quote it \(sha256='\"...\"'"):
        load_config(None, ["model.sha256=12345678"])
    assert load_config(None, ['model.sha256="12345678"']).model.sha256 == "12345678"


def test_a_logger_table_without_a_name_says_it_was_read_as_jsonl(lab):
    """Unclear: ``loggers = [{ project = "x" }]`` (the name forgotten) said only that logger
    'jsonl' has no knob 'project'."""
    with pytest.raises(ConfigError, match=r"logger 'jsonl' \(plugin rllab_loggers\) has no knob 'project'.* This table names no "
                       r"logger, so it is read as 'jsonl': name the one meant, e\.g\. \{ name = \"wandb\", \.\.\. \} \(one of .*wandb"):
        load_config({"loggers": [{"project": "x"}]}, lab=lab)
    assert load_config({"loggers": [{"filename": "m.jsonl"}]}, lab=lab).loggers[0].name == "jsonl"  # jsonl's own knob: fine
    with pytest.raises(ConfigError) as named:
        load_config({"loggers": [{"name": "jsonl", "project": "x"}]}, lab=lab)
    assert "names no logger" not in str(named.value)


@pytest.mark.parametrize(
    "loggers, match",
    [
        (["jsonl", "jsonl"], r"loggers: logger 'jsonl' is given twice with the same knobs"),
        (["jsonl", {"name": "jsonl", "filename": "metrics.jsonl"}], r"logger 'jsonl' is given twice"),
        ([{"name": "traces", "per_step": 2}, {"name": "traces", "per_step": 4}],
         r"two 'traces' loggers would both write filename = 'traces.jsonl'; give each its own filename"),
        (["tensorboard", {"name": "tensorboard", "subdir": "tb"}], None),
        (["jsonl", {"name": "jsonl", "filename": "again.jsonl"}], None),
    ],
)
def test_a_logger_given_twice_is_refused(lab, loggers, match):
    """Silently wrong: ``loggers = ["jsonl", "jsonl"]`` wrote every row of metrics.jsonl twice."""
    if match is None:
        assert len(load_config({"loggers": loggers}, lab=lab).loggers) == 2
        return
    with pytest.raises(ConfigError, match=match):
        load_config({"loggers": loggers}, lab=lab)
