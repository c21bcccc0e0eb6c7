"""The Lab: loading, registries and every user-facing error."""

import sys
import textwrap
import types

import attrs
import pytest

import rllab
from rllab.lab import ConfigError, DuplicateComponentError, Lab, UnknownComponentError


@attrs.frozen
class ToyConfig:
    """Knobs of the toy loss."""

    clip: float = rllab.knob(0.2, help="clip range", ge=0.0, le=1.0)
    mode: str = rllab.knob("a", help="which mode", choices=("a", "b"))
    steps: int = rllab.knob(3, help="an integer knob", ge=1)
    horizon: int | None = rllab.knob(None, help="optional", ge=1)


def toy_loss(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """A toy loss for tests."""
    return aggregate(-advantages * log_prob, mask), {"actor/approx_kl": 0.0, "actor/clipfrac": 0.0}


def make_plugin(name="toy", loss_name="toy_loss"):
    mod = types.ModuleType(name)

    @rllab.hookimpl
    def register_policy_losses(register):
        register(loss_name, toy_loss, config=ToyConfig, aliases=(loss_name + "_alias",))

    mod.register_policy_losses = register_policy_losses
    return mod


def test_get_binds_a_validated_config():
    lab = Lab([make_plugin()], entry_points=False)
    comp = lab.get("policy_loss", "toy_loss", clip=0.3, mode="b")
    assert comp.config == ToyConfig(clip=0.3, mode="b")
    assert comp.spec.provider == "toy"
    assert comp.spec.summary == "A toy loss for tests."
    # alias resolves to the same spec
    assert lab.spec("policy_loss", "toy_loss_alias") is comp.spec
    # ints are accepted where floats are expected
    assert lab.get("policy_loss", "toy_loss", clip=1).config.clip == 1.0


def test_duplicate_names_both_plugins():
    with pytest.raises(DuplicateComponentError) as e:
        Lab([make_plugin("first"), make_plugin("second")], entry_points=False)
    assert "first" in str(e.value) and "second" in str(e.value) and "toy_loss" in str(e.value)


def test_duplicate_non_strict_records_problem():
    lab = Lab([make_plugin("first"), make_plugin("second")], entry_points=False, strict=False)
    assert any("registered twice" in p and "first" in p and "second" in p for p in lab.problems)
    assert lab.spec("policy_loss", "toy_loss").provider == "first"


def test_unknown_name_lists_known_and_suggests():
    lab = Lab([make_plugin()], entry_points=False)
    with pytest.raises(UnknownComponentError) as e:
        lab.get("policy_loss", "toy_los")
    msg = str(e.value)
    assert "'toy_los'" in msg and "Did you mean 'toy_loss'" in msg and "Known policy_loss names: toy_loss" in msg


def test_unknown_kind():
    lab = Lab(entry_points=False)
    with pytest.raises(KeyError, match="Did you mean 'policy_loss'"):
        lab.names("policy_losses")


@pytest.mark.parametrize(
    "knobs, expected",
    [
        ({"clpi": 0.1}, ["toy_loss", "toy", "no knob 'clpi'", "did you mean 'clip'", "clip, mode, steps, horizon"]),
        ({"clip": "big"}, ["toy_loss", "toy", "clip = 'big'", "wrong type", "expected float", "≥ 0.0 and ≤ 1.0"]),
        ({"clip": 1.5}, ["toy_loss", "toy", "clip = 1.5", "out of range", "≥ 0.0 and ≤ 1.0"]),
        ({"mode": "c"}, ["toy_loss", "mode = 'c'", "one of 'a', 'b'"]),
        ({"steps": 2.5}, ["steps = 2.5", "expected int"]),
        ({"steps": True}, ["steps = True", "expected int"]),
        ({"horizon": 0}, ["horizon = 0", "≥ 1"]),
    ],
)
def test_bad_knob_errors_name_plugin_field_value_and_range(knobs, expected):
    lab = Lab([make_plugin()], entry_points=False)
    with pytest.raises(ConfigError) as e:
        lab.get("policy_loss", "toy_loss", **knobs)
    for part in expected:
        assert part in str(e.value), (part, str(e.value))


def test_optional_knob_accepts_none():
    lab = Lab([make_plugin()], entry_points=False)
    assert lab.get("policy_loss", "toy_loss", horizon=None).config.horizon is None


def test_plugin_failing_on_import_is_reported_and_rest_loads(tmp_path):
    bad = tmp_path / "broken_plugin.py"
    bad.write_text("raise RuntimeError('boom at import')\n")
    lab = Lab([str(bad), make_plugin()], entry_points=False)
    broken = [p for p in lab.plugins if not p.ok]
    assert len(broken) == 1 and "boom at import" in broken[0].error and str(bad) in broken[0].name
    assert any("boom at import" in p for p in lab.problems)
    assert lab.names("policy_loss") == ["toy_loss"]


def test_plugin_failing_while_registering_is_reported_and_rest_loads():
    bad = types.ModuleType("regfail")

    @rllab.hookimpl
    def register_policy_losses(register):
        register("half_registered", toy_loss)
        raise ValueError("boom while registering")

    bad.register_policy_losses = register_policy_losses
    lab = Lab([bad, make_plugin()], entry_points=False)
    assert [p.name for p in lab.plugins if not p.ok] == ["regfail"]
    assert any("boom while registering" in p and "regfail" in p for p in lab.problems)
    # nothing from the broken plugin stays registered
    assert lab.names("policy_loss") == ["toy_loss"]
    with pytest.raises(UnknownComponentError, match=r"Broken plugins: regfail \(ValueError: boom while registering\)"):
        lab.get("policy_loss", "half_registered")


def test_plugin_from_file(tmp_path):
    f = tmp_path / "my_loss.py"
    f.write_text(
        textwrap.dedent(
            '''
            import rllab

            def my_loss(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
                """From a file."""
                return aggregate(-advantages * log_prob, mask), {}

            @rllab.hookimpl
            def register_policy_losses(register):
                register("file_loss", my_loss)
            '''
        )
    )
    lab = Lab([str(f)], entry_points=False)
    spec = lab.spec("policy_loss", "file_loss")
    assert spec.provider == str(f) and spec.summary == "From a file."
    assert isinstance(lab.get("policy_loss", "file_loss").config, rllab.NoConfig)


def test_plugin_from_module_name(tmp_path, monkeypatch):
    (tmp_path / "mod_plugin_xyz.py").write_text(
        "import rllab\n"
        "@rllab.hookimpl\n"
        "def register_kl_penalties(register):\n"
        "    register('zero_kl', lambda *, log_prob, ref_log_prob, config: log_prob * 0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    lab = Lab(["mod_plugin_xyz"], entry_points=False)
    assert lab.spec("kl_penalty", "zero_kl").provider == "mod_plugin_xyz"
    sys.modules.pop("mod_plugin_xyz", None)


def test_missing_plugin_file_is_an_error(tmp_path):
    with pytest.raises(rllab.PluginLoadError, match="plugin file not found: .*nope.py"):
        Lab([str(tmp_path / "nope.py")], entry_points=False)


def test_same_plugin_file_twice_loads_once(tmp_path):
    f = tmp_path / "twice.py"
    f.write_text(
        "import rllab\n"
        "@rllab.hookimpl\n"
        "def register_kl_penalties(register):\n"
        "    register('twice_kl', lambda *, log_prob, ref_log_prob, config: log_prob * 0)\n"
    )
    # the same file by two spellings, and the same module object twice
    lab = Lab([str(f), str(tmp_path / "." / "twice.py")], entry_points=False)
    assert lab.names("kl_penalty") == ["twice_kl"] and len(lab.plugins) == 1
    lab.add_plugin(str(f))
    assert len(lab.plugins) == 1


def test_knob_listing_shows_defaults_ranges_and_help():
    lab = Lab([make_plugin()], entry_points=False)
    knobs = {k.name: k for k in lab.spec("policy_loss", "toy_loss").knobs()}
    assert knobs["clip"].default == 0.2 and knobs["clip"].allowed == "≥ 0.0 and ≤ 1.0"
    assert knobs["clip"].help == "clip range" and knobs["clip"].type == "float"
    assert knobs["mode"].allowed == "one of 'a', 'b'"


def test_register_validates_its_arguments():
    bad = types.ModuleType("badreg")

    @rllab.hookimpl
    def register_policy_losses(register):
        register("x", toy_loss, config=dict)

    bad.register_policy_losses = register_policy_losses
    lab = Lab([bad], entry_points=False)
    assert any("config must be an attrs class" in p for p in lab.problems)


def test_env_allow_list_restricts_third_party_plugins_only(monkeypatch):
    builtins = {p.name for p in Lab().plugins}
    assert {"rllab_aggregations", "rllab_policy_losses", "rllab_advantages"} <= builtins
    # RLLAB_PLUGINS names third-party plugins; the built-ins stay
    monkeypatch.setenv("RLLAB_PLUGINS", "")
    assert {p.name for p in Lab().plugins} == builtins
    monkeypatch.setenv("RLLAB_PLUGINS", "some_third_party_plugin")
    assert {p.name for p in Lab().plugins} == builtins
    assert Lab().spec("task", "addition").provider == "rllab_tasks"
    # RLLAB_BUILTINS restricts the built-ins
    monkeypatch.setenv("RLLAB_BUILTINS", "rllab_aggregations")
    assert [p.name for p in Lab().plugins] == ["rllab_aggregations"]
    monkeypatch.setenv("RLLAB_BUILTINS", "0")
    assert Lab().plugins == []


def test_unknown_name_says_which_variable_left_plugins_out(monkeypatch):
    monkeypatch.setenv("RLLAB_BUILTINS", "rllab_aggregations")
    with pytest.raises(UnknownComponentError, match=r"RLLAB_BUILTINS='rllab_aggregations' left out the installed plugins .*rllab_tasks"):
        Lab().get("task", "addition")


def test_builtins_come_from_entry_points_with_distribution():
    lab = Lab()
    for p in lab.plugins:
        if p.name.startswith("rllab_"):
            assert p.source == "entry point" and p.distribution == "rllab"


def test_builtins_env_accepts_the_old_plugin_names_with_a_warning(monkeypatch):
    monkeypatch.setenv("RLLAB_BUILTINS", "rllab_ppo,rllab_agg")
    with pytest.warns(FutureWarning, match=r"'rllab_ppo' is now 'rllab_policy_losses' and 'rllab_value_losses'"):
        names = {p.name for p in Lab().plugins}
    assert names == {"rllab_policy_losses", "rllab_value_losses", "rllab_aggregations"}


def test_deferred_lab_registers_on_first_lookup_and_a_later_plugin_joins_it():
    """``Lab(defer=True)`` (the command line's) imports the plugins but runs no ``register_*``
    hook until a component is looked up; then every plugin registers, one added in between too.
    Class: slower than it should be (``--help`` paid for every plugin's components)."""
    calls = []
    first, later = types.ModuleType("first"), types.ModuleType("later")

    @rllab.hookimpl
    def register_policy_losses(register):
        calls.append("first")
        register("toy_loss", toy_loss)

    @rllab.hookimpl
    def register_kl_penalties(register):
        calls.append("later")
        register("toy_kl", toy_loss)

    first.register_policy_losses, later.register_kl_penalties = register_policy_losses, register_kl_penalties
    lab = Lab([first], entry_points=False, defer=True)
    assert calls == [] and lab.pm.has_plugin("first")
    lab.add_plugin(later)
    assert calls == ["first", "later"]  # adding a plugin registers, as it does on an eager Lab
    assert lab.names("policy_loss") == ["toy_loss"] and lab.names("kl_penalty") == ["toy_kl"]
    lab.register_components()
    assert calls == ["first", "later"]  # once
    deferred = Lab([first], entry_points=False, defer=True)
    assert deferred.spec("policy_loss", "toy_loss").provider == "first" and calls.count("first") == 2


def test_a_plugin_with_a_misspelt_hook_is_broken_naming_the_hook(tmp_path):
    """Silently wrong: a plugin whose ``@rllab.hookimpl`` was named ``register_taskz`` loaded and
    registered nothing, without a word."""
    bad = tmp_path / "typo_plugin.py"
    bad.write_text("import rllab\n@rllab.hookimpl\ndef register_taskz(register):\n    pass\n")
    lab = Lab([str(bad), make_plugin()], entry_points=False)
    broken = [p for p in lab.plugins if not p.ok]
    assert len(broken) == 1 and "register_taskz is not an rllab hook (did you mean register_tasks?)" in broken[0].error
    assert lab.names("policy_loss") == ["toy_loss"]


def test_a_named_plugin_that_did_not_load_stops_a_run(tmp_path, capsys):
    """Silently wrong: ``rllab run --plugin broken.py`` printed a warning and trained without it."""
    from rllab.cli import main

    bad = tmp_path / "syntax_plugin.py"
    bad.write_text("def oops(:\n")
    assert main(["run", "--plugin", str(bad), "--steps", "1"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "plugin given by name did not load" in err and "SyntaxError" in err and "syntax_plugin.py" in err
    assert main(["plugins", "--plugin", str(bad)]) == 0  # the listing shows it among the broken plugins


@pytest.mark.parametrize("command", [["export", "no-such-run", "--out", "x"], ["eval", "no-such-model"]])
def test_a_named_plugin_that_did_not_load_stops_export_and_eval(tmp_path, capsys, command):
    """Like a run: ``rllab export`` and ``rllab eval`` stop on a plugin given by name that did not load,
    before they look at their other arguments."""
    from rllab.cli import main

    bad = tmp_path / "syntax_plugin.py"
    bad.write_text("def oops(:\n")
    assert main([*command, "--plugin", str(bad)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "plugin given by name did not load" in err and "syntax_plugin.py" in err


@pytest.mark.parametrize("command", [
    ["suite", "benchmarks/suites/controls.toml", "--dry-run"],
    ["suite", "report", "no-such-suite-dir"],
    ["import", "trl", "no-such-config.yaml"],
    ["traces", "no-such-run"],
])
@pytest.mark.parametrize("source, says", [
    ("def oops(:\n", "SyntaxError"),
    ("import rllab\n@rllab.hookimpl\ndef register_policy_losses(register):\n    raise RuntimeError('boom in registration')\n",
     "RuntimeError: boom in registration"),
])
def test_a_named_plugin_that_did_not_load_stops_every_command_a_plugin_adds(tmp_path, capsys, command, source, says):
    """``rllab suite`` (and every command a plugin adds) stops on a plugin given by name that did
    not load, on import or while registering, naming it, before it looks at its other arguments;
    it printed a warning and went on without it."""
    from rllab.cli import main

    bad = tmp_path / "broken_plugin.py"
    bad.write_text(source)
    assert main([*command, "--plugin", str(bad)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"plugin given by name did not load ({bad}: {says}" in err and "drop it from --plugin" in err
