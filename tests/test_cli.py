"""The rllab command: listings, show, check and errors."""

import pytest

from rllab.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plugins_lists_builtins_with_providers(capsys):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    for name in ("token-mean", "rllab_aggregations"):
        assert name in out


def test_plugins_kind_filter(capsys):
    code, out, _ = run(capsys, "plugins", "--kind", "loss_aggregation")
    assert code == 0 and "token-sum" in out


def test_plugins_show(capsys):
    code, out, _ = run(capsys, "plugins", "show", "seq-mean-token-sum-norm")
    assert code == 0 and "horizon" in out and "loss_aggregation" in out


def test_show_unknown(capsys):
    code, _, err = run(capsys, "plugins", "show", "token-maen")
    assert code == 1 and "token-mean" in err


def test_check_builtin(capsys):
    code, out, _ = run(capsys, "check", "token-mean")
    assert code == 0 and "all checks passed" in out


def test_check_unknown_lists_names(capsys):
    code, _, err = run(capsys, "check", "nonexistent_thing")
    assert code == 1 and "unknown" in err


def test_broken_plugin_is_shown(capsys, tmp_path):
    bad = tmp_path / "bad_plugin.py"
    bad.write_text("import nonexistent_module_xyz\n")
    code, out, _ = run(capsys, "plugins", "--plugin", str(bad))
    assert code == 0 and "broken plugins" in out and "nonexistent_module_xyz" in out


def test_show_ppo_dual_clip_has_equation_and_knobs(capsys):
    code, out, _ = run(capsys, "plugins", "show", "ppo_dual_clip")
    assert code == 0
    for part in ("clip_c", "clip_low", "clip_high", "3.0", "> 1", "rllab_policy_losses"):
        assert part in out, part


def test_listing_shows_knobs(capsys):
    code, out, _ = run(capsys, "plugins", "--kind", "advantage_estimator")
    assert code == 0 and "lam=" in out and "gamma=" in out


def test_settings_lists_train_rollout_model(capsys):
    code, out, _ = run(capsys, "settings")
    assert code == 0
    for part in ("[train]", "[rollout]", "[model]", "prompts_per_step", "lr_schedule", "reward_errors", "[policy_loss]"):
        assert part in out, part
    code, _, err = run(capsys, "settings", "trian")
    assert code == 1 and "rollout" in err


def test_plugins_show_puts_the_component_first_and_module_notes_behind_a_flag(capsys):
    code, out, _ = run(capsys, "plugins", "show", "ppo_dual_clip")
    assert code == 0
    # the component's own summary and equation, then its knobs; the module's notes only on --doc
    assert out.index("Dual-clip PPO") < out.index("clip_c") and "--doc" in out
    import rllab_policy_losses.ppo

    module_notes = rllab_policy_losses.ppo.__doc__.strip().splitlines()[0]
    assert module_notes not in out
    code, out_doc, _ = run(capsys, "plugins", "show", "ppo_dual_clip", "--doc")
    assert code == 0 and module_notes in out_doc


def test_presets_show(capsys):
    code, out, _ = run(capsys, "presets", "show", "dapo")
    assert code == 0 and "clip_high" in out and "dynamic_sampling" in out
    code, _, err = run(capsys, "presets", "show", "dapoo")
    assert code == 1 and "Did you mean 'dapo'" in err
    code, out, _ = run(capsys, "presets")
    assert code == 0 and "rllab presets show NAME" in out


def test_overrides_after_an_option_are_accepted_and_unknown_options_still_refused(capsys, monkeypatch):
    """Unclear message: overrides placed after an option (``rllab run a=1 --steps 2 b=2``) ended in
    argparse's "unrecognized arguments" under the top-level usage line. They are accepted anywhere
    on the line (run, record, replay); an unknown ``--flag`` or stray word is still an error, under
    the command's own usage line."""
    import rllab.training.trainer

    seen = {}
    monkeypatch.setattr(rllab.training.trainer, "run_experiment", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    code, _, err = run(capsys, "run", "train.lr=1e-4", "--steps", "2", "advantage=rloo", "-q")
    assert code == 0, err
    cfg = seen["cfg"]
    assert cfg.train.lr == 1e-4 and cfg.train.steps == 2 and cfg.components["advantage"].name == "rloo"
    for argv, bad in ((("run", "a.b=1", "--steps", "2", "--bogus"), "--bogus"), (("run", "--steps", "2", "x.y=1", "--nope=3"), "--nope=3")):
        try:
            main(list(argv))
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"{argv} was accepted")
        err = capsys.readouterr().err
        assert f"unrecognized arguments: {bad}" in err and "usage: rllab run" in err



def test_a_config_file_after_an_override_is_the_config(capsys, monkeypatch, tmp_path):
    """Unclear message: ``rllab run train.lr=1e-4 exp.toml`` took the override for the config and
    refused the file as "override 'exp.toml' must look like key=value". The one word that is not
    key=value is the config file, wherever it stands; two such words are refused, both named."""
    import rllab.training.trainer

    exp = tmp_path / "exp.toml"
    exp.write_text('[train]\nseed = 7\n')
    seen = {}
    monkeypatch.setattr(rllab.training.trainer, "run_experiment", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    code, _, err = run(capsys, "run", "--steps", "2", "train.lr=1e-4", str(exp), "-q")
    assert code == 0, err
    assert seen["cfg"].train.seed == 7 and seen["cfg"].train.lr == 1e-4 and seen["cfg"].train.steps == 2
    code, _, err = run(capsys, "run", str(exp), "train.lr=1e-4", "other.toml")
    assert code == 1 and "one config file" in err and "'other.toml'" in err and repr(str(exp)) in err

def test_a_bad_knob_is_a_config_error_before_any_check(capsys):
    """Unclear message: ``rllab check NAME --knob singleton=bogus`` was reported as a failed
    "builds with its default config" check, and ``--knob singleton`` (no ``=``) became an empty
    string. A knob that is not a valid config is refused before the checks run; ``--knob`` needs
    KEY=VALUE."""
    code, out, err = run(capsys, "check", "grpo", "--knob", "singleton=bogus")
    assert code == 1 and "--knob" in err and "singleton = 'bogus' is not allowed" in err
    assert "default config" not in out + err and "contract:" not in out
    code, out, err = run(capsys, "check", "grpo", "--knob", "singleton")
    assert code == 1 and "KEY=VALUE" in err and "contract:" not in out
    code, out, err = run(capsys, "check", "grpo", "--knob", "singleton=zero")
    assert code == 0 and "builds with the given knobs" in out and "all checks passed" in out


def test_a_single_valued_run_option_given_twice_is_refused(capsys):
    """`--preset a --preset b` used to run b alone, a silently lost."""
    for argv, named in ((["--preset", "async_grpo", "--preset", "dapo"], "--preset"), (["--steps", "2", "--steps", "3"], "--steps")):
        with pytest.raises(SystemExit) as e:
            main(["run", *argv])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {named}: given twice" in err, err
