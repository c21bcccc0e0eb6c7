"""The ``rllab`` command.

    rllab plugins [--kind K]            every registered component, with its provider
    rllab plugins show NAME             docstring, equation and knobs of a component
    rllab check NAME                    run the contract suite on a component
    rllab new-plugin NAME --kind K      scaffold a pip-installable plugin package
    rllab presets [show NAME]           list the bundled experiment presets, or print one
    rllab settings [SECTION]            every [model] / [rollout] / [train] setting, default, range
    rllab run [exp.toml] [key=value …]  train (``--preset grpo``, ``--resume RUN_DIR``, ``--run-dir D [--overwrite]``)
    rllab export RUN_DIR --out DIR      the run's policy as a Hugging Face model directory (``--step N``)
    rllab eval [TARGET] [key=value …]   held-out accuracy, pass@k (``--samples N``), intervals, ``--show N``, ``--json``

``--plugin PATH_OR_MODULE`` (repeatable, anywhere on the line) loads extra plugins; ``key=value``
overrides may stand anywhere on the line too (before or after options). Plugins may
add subcommands through the ``register_commands`` hook.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Mapping

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rllab.errors import RllabError
from rllab.lab import KINDS, Lab
from rllab.members import member
from rllab.traits import TRAITS

# Piped output (files, CI logs, tests) gets wide tables instead of 80 columns of folded text.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _lab(args, strict: bool = True) -> Lab:
    lab = getattr(args, "lab", None)
    if lab is not None:
        return lab
    return Lab(plugins=args.plugin or (), strict=strict)


def _problems(lab: Lab) -> None:
    lab.register_components()  # a plugin can also fail while registering
    lab.refuse_named_failures()
    for p in lab.problems:
        err_console.print(f"[yellow]warning:[/] {escape(p)}")


# --------------------------------------------------------------------------- plugins


def cmd_plugins(args) -> int:
    lab = _lab(args, strict=False)
    if args.action != "show" and args.action is not None:
        name = args.name or args.action  # `plugins shwo NAME` (a typo of show) or `plugins NAME` (show left out)
        err_console.print(f"[red]error:[/] unknown action {args.action!r}: the only action is 'show' (did you mean 'rllab plugins show {name}'?)")
        return 2
    # loading the components (and torch) takes seconds: a spinner meanwhile, on a terminal
    status = err_console.status("loading the plugins' components…", spinner="dots") if err_console.is_terminal else None
    if args.action == "show":
        if not args.name:
            err_console.print("[red]error:[/] usage: rllab plugins show NAME")
            return 2
        return _show_kept(lab, args, status)
    from rllab.cli.listing import listing

    data = listing(lab, status=status)  # kept between calls while no plugin, version or rllab file changes
    kinds = [args.kind] if args.kind else list(KINDS)
    table = Table(box=box.SIMPLE_HEAVY, title="rllab components")
    for col in ("kind", "name", "provider", "knobs (default)", "summary"):
        table.add_column(col, overflow="fold")
    for kind in kinds:
        for row in (r for r in data["rows"] if r["kind"] == kind):
            provider = row["provider"] + (f" [dim]({row['distribution']})[/]" if row["distribution"] else "")
            table.add_row(kind, escape(row["name"]), provider, escape(row["knobs"]), escape(row["summary"]))
    console.print(table)
    if data["broken"]:
        t = Table(box=box.SIMPLE, title="[red]broken plugins[/]")
        t.add_column("plugin")
        t.add_column("error", overflow="fold")
        for name, error in data["broken"]:
            t.add_row(name, escape(error))
        console.print(t)
    for msg in data["conflicts"]:
        console.print(f"[red]conflict:[/] {escape(msg)}")
    return 0


def _show_kept(lab: Lab, args, status) -> int:
    """``plugins show``, printed from what an earlier call printed when nothing it reads changed
    (:func:`rllab.cli.listing.shown`), else rendered on a recording console and kept."""
    import io

    from rllab.cli import listing

    global console

    def render() -> str:
        global console
        shown_on = console
        console = Console(file=io.StringIO(), record=True, width=shown_on.width, force_terminal=shown_on.is_terminal,
                          color_system=shown_on.color_system, soft_wrap=shown_on.soft_wrap)
        try:
            if status is not None:
                with status:
                    lab.register_components()
            _show(lab, args.name, args.kind, doc=args.doc)
            return console.export_text(styles=shown_on.is_terminal)
        finally:
            console = shown_on

    key = [args.name, args.kind, bool(args.doc), console.width, console.is_terminal, console.color_system]
    console.file.write(listing.shown(lab, key, render))
    console.file.flush()
    return 0


def _show(lab: Lab, name: str, kind: str | None, doc: bool = False) -> int:
    specs = lab.resolve(name, kind)  # unknown: close names of every kind, and a plugin that may be missing
    for spec in specs:
        title = f"[bold]{spec.name}[/] — {spec.kind} from plugin [cyan]{spec.provider}[/]"
        if spec.distribution:
            title += f" ({spec.distribution})"
        console.rule(title)
        if spec.aliases:
            console.print(f"aliases: {', '.join(spec.aliases)}")
        if spec.requires:
            console.print(f"requires: {', '.join(spec.requires)}")
        for trait, value in spec.traits.items():
            if callable(value):
                value = "a function of the config" if TRAITS[spec.kind][trait].per_config else "a function"
            elif isinstance(value, frozenset):
                value = ", ".join(sorted(value))
            elif isinstance(value, Mapping):
                value = dict(value)
            console.print(escape(f"trait {trait}: {value}"), highlight=False)
        console.print(escape(spec.doc or spec.summary), highlight=False)
        knobs = spec.knobs()
        t = Table(box=box.SIMPLE_HEAVY, title=f"knobs ({spec.config.__name__})")
        for col in ("knob", "type", "default", "allowed", "help"):
            t.add_column(col, overflow="fold")
        for k in knobs:
            t.add_row(k.name, escape(k.type), escape(repr(k.default)), escape(k.allowed), escape(k.help))
        if knobs:
            console.print(t)
        else:
            console.print("[dim]no knobs[/]")
        if spec.kind == "environment":
            _show_tools(spec)
        mod = sys.modules.get(getattr(spec.fn, "__module__", ""), None)
        if mod is not None and mod.__doc__:
            if doc:
                console.rule(f"plugin {spec.provider}: module notes")
                console.print(escape(mod.__doc__.strip()), highlight=False)
            else:
                console.print(f"[dim]the plugin's module notes (background, references): rllab plugins show {spec.name} --doc[/]")
    return 0


def _show_tools(spec) -> None:
    """The tools an environment built with its default knobs exposes (its ``tools``)."""
    try:
        tools = list(member(spec.fn(config=spec.config()), "environment", "tools"))
    except Exception as e:  # noqa: BLE001 — listing must not fail on an environment that needs knobs set
        console.print(escape(f"(tools not listed: building it with its default knobs raised {type(e).__name__}: {e})"), style="dim")
        return
    if not tools:
        return
    t = Table(box=box.SIMPLE_HEAVY, title="tools (rllab.rollout.tools; the model calls <name(arguments)> or <tool_call>{...}</tool_call>)")
    for col in ("tool", "parameters", "description"):
        t.add_column(col, overflow="fold")
    for tool in tools:
        params = ", ".join(getattr(tool, "parameter_names", ()))
        t.add_row(escape(str(getattr(tool, "name", tool))), escape(params), escape(getattr(tool, "description", "")))
    console.print(t)


# --------------------------------------------------------------------------- check


def cmd_check(args) -> int:
    from rllab.config import parse_value
    from rllab.errors import ConfigError
    from rllab.testing import check_knobs, run_contract

    lab = _lab(args)
    _problems(lab)
    specs = lab.resolve(args.name, args.kind)  # unknown: close names of every kind, and a plugin that may be missing
    knobs = {}
    for item in args.knob or ():
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise RllabError(f"--knob {item!r}: give KEY=VALUE (e.g. --knob clip_ratio=0.2); 'rllab plugins show {args.name}' lists the knobs")
        knobs[k.strip()] = parse_value(v)
    for spec in specs:  # a bad knob is the caller's mistake: refused before any check runs
        try:
            check_knobs(lab, spec.kind, spec.name, knobs)
        except ConfigError as e:
            raise ConfigError(f"--knob: {e}", key=e.key) from None
    failed = 0
    for spec in specs:
        results = run_contract(lab, spec.kind, spec.name, knobs)
        t = Table(box=box.SIMPLE_HEAVY, title=f"contract: {spec.kind} {spec.name} ({spec.provider})")
        t.add_column("check", overflow="fold")
        t.add_column("result")
        t.add_column("detail", overflow="fold")
        for r in results:
            mark = "[yellow]skip[/]" if r.skipped else ("[green]pass[/]" if r.passed else "[red]FAIL[/]")
            t.add_row(escape(r.check), mark, escape(r.message))
            failed += not r.passed
        console.print(t)
    console.print("[green]all checks passed[/]" if not failed else f"[red]{failed} check(s) failed[/]")
    return 1 if failed else 0


# --------------------------------------------------------------------------- new-plugin


def cmd_new_plugin(args) -> int:
    from rllab.cli.scaffold import scaffold

    root = scaffold(args.name, args.kind, Path(args.dir))
    console.print(f"created [bold]{root}[/]")
    console.print(f"next: [cyan]pip install -e {root}[/] then [cyan]rllab plugins --kind {args.kind}[/] and [cyan]pytest {root}/tests[/]")
    return 0


# --------------------------------------------------------------------------- presets / run


def cmd_presets(args) -> int:
    from rllab.config import preset_names, preset_text

    if args.action == "show":
        if not args.name:
            err_console.print("[red]error:[/] usage: rllab presets show NAME")
            return 2
        console.print(escape(preset_text(args.name)), highlight=False, soft_wrap=True)
        return 0
    if args.action is not None:
        err_console.print(f"[red]error:[/] unknown action {args.action!r} (did you mean 'rllab presets show {args.action}'?)")
        return 2
    t = Table(box=box.SIMPLE_HEAVY, title="presets (rllab run --preset NAME; rllab presets show NAME)")
    t.add_column("preset")
    t.add_column("description", overflow="fold")
    for name in preset_names():
        first = next((ln.lstrip("# ").strip() for ln in preset_text(name).splitlines() if ln.startswith("#")), "")
        t.add_row(name, escape(first))
    console.print(t)
    return 0


def cmd_settings(args) -> int:
    from rllab.config import COMPONENT_SECTIONS, PLAIN_SECTIONS
    from rllab.lab import ComponentSpec

    sections = [args.section] if args.section else list(PLAIN_SECTIONS)
    for sec in sections:
        if sec not in PLAIN_SECTIONS:
            err_console.print(f"[red]error:[/] no settings section {sec!r}; sections: {', '.join(PLAIN_SECTIONS)}")
            return 1
        cls = PLAIN_SECTIONS[sec]
        spec = ComponentSpec(kind="section", name=sec, fn=cmd_settings, config=cls)
        t = Table(box=box.SIMPLE_HEAVY, title=escape(f"[{sec}] — {(cls.__doc__ or '').strip()}"))
        for col in ("setting", "type", "default", "allowed", "help"):
            t.add_column(col, overflow="fold")
        for k in spec.knobs():
            t.add_row(k.name, escape(k.type), escape(repr(k.default)), escape(k.allowed), escape(k.help))
        console.print(t)
    if not args.section:
        rows = ", ".join(f"[{sec}] ({kind}, " + (f"default {name!r})" if name else "optional; instead of [task])")
                         for sec, (kind, name) in COMPONENT_SECTIONS.items())
        console.print(f"Component sections take name = ... plus that component's knobs (rllab plugins show NAME): {escape(rows)}")
    return 0


def cmd_run(args) -> int:
    from rllab.config import load_config

    lab = _lab(args)
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    if args.resume:
        if args.config is not None:
            if "=" not in args.config:
                raise RllabError(f"--resume takes its configuration from the run directory; drop {args.config!r}")
            overrides.insert(0, args.config)
        if args.preset or args.run_dir or args.overwrite:
            raise RllabError("--resume continues the run in RUN_DIR with its own config: --preset, --run-dir and --overwrite do not apply")
        from rllab.training.runs import resume_run

        _problems(lab)
        resume_run(Path(args.resume), lab=lab, overrides=overrides, progress=not args.quiet)
        return 0
    if args.overwrite and not args.run_dir:
        raise RllabError("--overwrite replaces the run in --run-dir DIR; without --run-dir every run gets a new directory")
    source = args.config
    if source is not None and "=" in source and not Path(source).exists():
        overrides.insert(0, source)
        source = None
    files = [o for o in overrides if "=" not in o]
    if source is None and len(files) == 1:  # the config file after an override: `rllab run a=1 exp.toml`
        source = files[0]
        overrides.remove(source)
    elif files:
        given = ([source] if source is not None else []) + files
        raise RllabError(
            f"rllab run takes one config file and key=value overrides; got {len(given)} words that are not "
            f"key=value: {', '.join(map(repr, given))}"
        )
    # the file, the overrides and the top-level keys are checked before any plugin's components load
    cfg = load_config(source, overrides, lab=lab, preset=args.preset)
    _problems(lab)
    from rllab.training.trainer import run_experiment

    run_experiment(cfg, lab=lab, run_dir=Path(args.run_dir) if args.run_dir else None, progress=not args.quiet, overwrite=args.overwrite)
    return 0


# --------------------------------------------------------------------------- main


class _Once(argparse.Action):
    """A single-valued option that refuses to be given twice (the first would be silently lost)."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        if before is not None:
            hint = "; presets do not combine: start from one and set the other's keys as overrides" if self.dest == "preset" else ""
            parser.error(f"argument {option_string}: given twice ({before!r} and {values!r}){hint}")
        setattr(namespace, self.dest, values)


def build_parser(lab: Lab | None = None) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--plugin", action="append", metavar="PATH_OR_MODULE", help="load an extra plugin (repeatable)")

    p = argparse.ArgumentParser(prog="rllab", description="A plugin-based lab for RL on language models.", parents=[common],
                                epilog="rllab --version [-v]: the version (-v: python, torch, transformers and the CPU too)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sp = sub.add_parser("plugins", parents=[common], help="list components, or show one")
    sp.add_argument("action", nargs="?", help="'show' to describe one component")
    sp.add_argument("name", nargs="?")
    sp.add_argument("--kind", choices=list(KINDS))
    sp.add_argument("--doc", action="store_true", help="with show: also print the plugin module's notes")
    sp.set_defaults(func=cmd_plugins)

    sc = sub.add_parser("check", parents=[common], help="run the contract suite on a component")
    sc.add_argument("name")
    sc.add_argument("--kind", choices=list(KINDS))
    sc.add_argument("--knob", action="append", metavar="KEY=VALUE", help="a knob to build the component with")
    sc.set_defaults(func=cmd_check)

    from rllab.cli.scaffold import _BODIES

    sn = sub.add_parser("new-plugin", parents=[common], help="scaffold a pip-installable plugin package")
    sn.add_argument("name")
    sn.add_argument("--kind", required=True, choices=list(_BODIES))
    sn.add_argument("--dir", default=".", help="where to create the package (default: here)")
    sn.set_defaults(func=cmd_new_plugin)

    spr = sub.add_parser("presets", parents=[common], help="list experiment presets, or print one")
    spr.add_argument("action", nargs="?", help="'show' to print one preset's TOML")
    spr.add_argument("name", nargs="?")
    spr.set_defaults(func=cmd_presets)

    ss = sub.add_parser("settings", parents=[common], help="list the [model], [rollout] and [train] settings")
    ss.add_argument("section", nargs="?", help="model, rollout or train")
    ss.set_defaults(func=cmd_settings)

    sr = sub.add_parser("run", parents=[common], help="train (default: GRPO on the addition task)")
    sr.add_argument("config", nargs="?", help="an experiment TOML file")
    sr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. policy_loss.clip_high=0.28 advantage=rloo")
    sr.add_argument("--preset", action=_Once, help="start from a bundled preset (see 'rllab presets')")
    sr.add_argument("--resume", action=_Once, metavar="RUN_DIR", help="continue a run from its last checkpoint (train.steps=N extends it)")
    sr.add_argument("--steps", action=_Once, type=int, help="shortcut for train.steps=N")
    sr.add_argument("--run-dir", action=_Once, help="where to write the run (default: OUTPUT_DIR/NAME-TIMESTAMP); one that holds a run is refused")
    sr.add_argument("--overwrite", action="store_true", help="with --run-dir: remove the run already there first (to continue it instead: --resume)")
    sr.add_argument("-q", "--quiet", action="store_true", help="no progress bar (the final summary line is still printed)")
    sr.set_defaults(func=cmd_run)

    from rllab.cli.model import add_commands as add_model_commands

    add_model_commands(sub, common)  # export, eval

    if lab is not None:
        lab.hook.register_commands(subparsers=sub)
    return p


def _plugin_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """Every ``--plugin X`` / ``--plugin=X`` on the line, wherever it stands, and the line without them."""
    plugins, rest, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--plugin" and i + 1 < len(argv):
            plugins.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--plugin="):
            plugins.append(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    return plugins, rest


_OVERRIDE = re.compile(r"[A-Za-z_][\w.\-]*=")
"""What a ``key=value`` override looks like: a (dotted) name, then ``=``."""


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args`` that accepts ``key=value`` overrides anywhere on the line.

    argparse fills a command's positionals from the first run of them only, so overrides after
    an option (``rllab run a=1 --steps 2 b=2``) are left over. Left-over words that look like
    overrides go, in order, to the command's list positional (``overrides`` of ``run``, ``items``
    of ``record``, ``variants`` of ``replay``, ...); anything else — an unknown ``--flag``, a stray
    word, an override for a command that takes none — is refused under that command's usage line."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = sub.choices[args.command]
    lists = [a for a in command._actions if not a.option_strings and a.nargs in ("*", "+")]
    stray = [w for w in extra if w.startswith("-") or not _OVERRIDE.match(w)]
    if stray or len(lists) != 1:
        hint = ""
        if not stray:
            hint = f" (rllab {args.command} takes no key=value overrides)"
        elif any(w.startswith("-") for w in stray):
            hint = f" (see rllab {args.command} --help for its options)"
        command.error(f"unrecognized arguments: {' '.join(stray or extra)}{hint}")
    dest = lists[0].dest
    setattr(args, dest, list(getattr(args, dest) or ()) + extra)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-V") or argv[:2] in (["-v", "--version"], ["-v", "-V"]):
        extra = [a for a in argv if a not in ("--version", "-V", "-v", "--verbose")]
        if extra:
            err_console.print(f"[red]error:[/] rllab --version [-v] takes nothing else (got {escape(' '.join(extra))})")
            return 2
        from rllab.cli.version import print_version

        print_version(verbose=any(a in ("-v", "--verbose") for a in argv))
        return 0
    try:
        plugins, rest = _plugin_options(argv)
        strict = not (rest[:1] == ["plugins"])  # `rllab plugins` shows conflicts instead of failing on them
        # deferred: the components (and torch) load on first use, so `--help` and a config error answer at once
        lab = Lab(plugins=plugins, strict=strict, defer=True)
        parser = build_parser(lab)
        args = _parse(parser, rest)
        args.lab, args.plugin = lab, plugins
        if plugins and args.command != "plugins":  # a plugin given by name that did not load stops every command, as run's
            lab.register_components()  # a plugin can also fail while registering
            lab.refuse_named_failures()
        return int(args.func(args) or 0)
    except RllabError as e:
        err_console.print(f"[red]error:[/] {escape(str(e))}")
        for note in getattr(e, "__notes__", ()):  # whether and how the run can continue (rllab.training.runs)
            err_console.print(escape(note), highlight=False)
        return 1
    except KeyboardInterrupt as e:
        err_console.print("[yellow]interrupted[/]")
        for note in getattr(e, "__notes__", ()):  # whether and how the run can continue (rllab.training.runs)
            err_console.print(escape(note), highlight=False)
        return 130


if __name__ == "__main__":
    sys.exit(main())
