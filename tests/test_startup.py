"""Startup cost: what the ``rllab`` command imports before it answers.

Class: **slower than it should be** — every command paid for importing torch (~1-2 s) before doing
anything, ``--help`` and config errors included. These tests assert on the modules a fresh
interpreter has imported once the command has answered, never on seconds, so they hold on a
loaded machine.
"""

import json
import os
import subprocess
import sys
import textwrap

HEAVY = ("torch", "transformers", "numpy", "scipy", "matplotlib", "datasets", "textual", "pandas", "pyarrow")
"""Libraries that take a noticeable time to import."""

_CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from rllab.cli import main

    HEAVY = {heavy!r}
    results = []
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code
        loaded = [m for m in HEAVY if m in sys.modules]
        results.append({{"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue(), "loaded": loaded}})
    print(json.dumps(results))
    """
)


def _answers(cases: list[list[str]], cwd) -> list[dict]:
    """Each command line of ``cases`` run in turn by one fresh interpreter: its exit code, output
    and the heavy libraries imported so far (cumulative, so the first case that imports one is
    the one to blame)."""
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(heavy=HEAVY), json.dumps(cases)],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _commands() -> list[str]:
    import argparse

    from rllab.cli import build_parser
    from rllab.lab import Lab

    parser = build_parser(Lab(defer=True))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_help_and_kernel_config_errors_import_no_heavy_library(tmp_path):
    """``rllab --help``, every ``rllab COMMAND --help`` and the config errors the kernel finds
    without any plugin's components (unknown top-level key, unknown setting, missing or malformed
    file, unknown preset, a word that is no override) answer before torch is imported."""
    (tmp_path / "bad.toml").write_text("[train\nsteps = 2\n")
    commands = _commands()
    assert {"run", "suite", "compare", "record", "replay", "tui"} <= set(commands)
    errors = [
        (["run", "bogus=1"], "unknown key 'bogus'"),
        (["run", "train.bogus=1"], "bogus"),
        (["run", "missing.toml"], "config file not found: missing.toml"),
        (["run", "bad.toml"], "not valid TOML"),
        (["run", "--preset", "nope"], "unknown preset 'nope'"),
        (["run", "a=1", "--steps", "2", "oops"], "unrecognized arguments: oops"),
    ]
    cases = [["--help"], *([c, "--help"] for c in commands), ["settings"], ["presets"], *(argv for argv, _ in errors)]
    results = _answers(cases, tmp_path)
    for r in results:
        assert not r["loaded"], f"rllab {' '.join(r['argv'])} imported {r['loaded']}"
    helps = results[: 1 + len(commands)]
    assert all(r["code"] == 0 and "usage: rllab" in r["out"] for r in helps), [r["argv"] for r in helps if r["code"]]
    assert all(c in helps[0]["out"] for c in commands)  # the top-level help lists the plugins' commands too
    for r, (argv, message) in zip(results[-len(errors) :], errors):
        assert r["code"] not in (0, None) and message in r["err"], (argv, r["code"], r["err"])


def test_plugin_config_error_imports_only_what_the_components_need(tmp_path):
    """A knob error needs the plugins' components (so torch), but nothing used only for
    training, plotting, statistics, data sets or the TUI."""
    (result,) = _answers([["run", "advantage.bogus=1"]], tmp_path)
    assert result["code"] == 1 and "no knob 'bogus'" in result["err"], result
    assert "torch" in result["loaded"]  # the components are torch code: the check above is real
    assert not set(result["loaded"]) - {"torch", "numpy"}, result["loaded"]


def test_suite_and_compare_errors_about_their_inputs_import_no_heavy_library(tmp_path):
    """``rllab suite`` and ``rllab compare`` check their files and directories before loading torch
    (for the runs and replays) or scipy (for the statistics)."""
    (tmp_path / "bad_suite.toml").write_text('name = "s"\nbogus = 1\n')
    errors = [
        (["suite", "missing.toml"], "suite file not found: missing.toml"),
        (["suite", "bad_suite.toml"], "unknown suite key(s) bogus"),
        (["suite", "report", "nothere"], "nothere is not a suite directory"),
        (["compare", "nothere"], "not run directories (no config.toml): nothere"),
    ]
    for r, (argv, message) in zip(_answers([argv for argv, _ in errors], tmp_path), errors):
        assert r["code"] == 1 and message in r["err"], (argv, r["err"])
        assert not r["loaded"], f"rllab {' '.join(argv)} imported {r['loaded']}"


def test_every_public_name_of_rllab_resolves():
    """The torch-backed names of ``rllab.__all__`` come from their modules on first use: each one
    resolves to the object its module defines."""
    import rllab
    from rllab import algorithm, ops, types

    for name in rllab.__all__:
        assert getattr(rllab, name) is not None, name
    assert rllab.ops is ops and rllab.algorithm is algorithm and rllab.RolloutBatch is types.RolloutBatch
    assert rllab.RowError is ops.RowError and rllab.StepReport is algorithm.StepReport
