"""A task or environment whose optional package is missing stops the run with one error line
naming the extra to install (the lean core installs none of them), not a traceback."""

import textwrap

from rllab.cli import main
from tests.tiny import TINY, overrides

PLUGIN = textwrap.dedent('''
    import attrs
    import rllab


    @attrs.frozen
    class NeedsConfig:
        pass


    def needs_extra(*, config):
        raise ImportError("the needs_extra task needs the made-up package: pip install 'rllab[madeup]'") from None


    def broken(*, config):
        raise ImportError("cannot import name 'x' from 'y'")


    @rllab.hookimpl
    def register_tasks(register):
        register("needs_extra", needs_extra, config=NeedsConfig)
        register("broken_import", broken, config=NeedsConfig)
''')


def test_a_missing_optional_package_is_one_error_naming_the_extra(tmp_path, capsys):
    plugin = tmp_path / "extra_plugin.py"
    plugin.write_text(PLUGIN)
    args = ["run", *overrides(TINY), "model.warm_start.steps=0", "--plugin", str(plugin), "--run-dir", str(tmp_path / "run"), "-q"]
    assert main([*args, "task=needs_extra"]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "pip install 'rllab[madeup]'" in err and "Traceback" not in err
    try:  # an ImportError that names no install is a bug, and keeps its traceback
        main([*args, "task=broken_import"])
    except ImportError as e:
        assert "cannot import name" in str(e)
    else:
        raise AssertionError("an ImportError without an install hint was turned into a config error")
