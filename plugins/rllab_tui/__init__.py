"""``rllab tui``: a terminal front end of ``rllab suite`` (Textual).

::

    rllab tui                          browse the registry, build a grid
    rllab tui SUITE.toml [--dir DIR]   open a suite file (its directory: suites/NAME or --dir)
    rllab tui SUITE_DIR                open a suite directory (what is there, and run the rest)

Four screens: the **registry** (every kind and component with its knobs; the contract suite on
the selected one), the **grid** builder (a base preset, axes of components or knobs validated as
they are typed, seeds; the cells it makes and their estimated time; saved as a suite file), the
**live** view of a suite (every cell's state, step, reward, accuracy and curve; start, stop,
retry, add seeds) and its **results** (rllab_suite's statistics, sortable; export to Markdown,
CSV and PNG). The suite runs as an ``rllab suite FILE --dir DIR -q`` process, so the TUI stays
responsive, and closing it leaves a suite directory that ``rllab suite`` resumes.

Textual is optional: ``pip install 'rllab[tui]'``. See docs/tui.md.
"""

from __future__ import annotations

from pathlib import Path

import rllab


def cmd_tui(args) -> int:
    try:
        import textual  # noqa: F401
    except ImportError:
        raise rllab.MissingExtraError("rllab tui needs Textual: pip install 'rllab[tui]'") from None
    from rllab_tui.app import SuiteApp

    target = Path(args.target) if args.target else None
    if target is not None and not target.exists():
        raise rllab.RllabError(f"{target}: no such suite file or directory")
    app = SuiteApp(lab=args.lab, plugins=list(getattr(args, "plugin", None) or []), target=target, directory=args.dir,
                   workers=args.workers, identical_check=not args.no_identical_check, theme_name=args.theme)
    app.run()
    return 0


@rllab.hookimpl
def register_commands(subparsers):
    p = subparsers.add_parser("tui", help="a terminal UI for suites: registry, grid builder, live progress, results")
    p.add_argument("target", nargs="?", metavar="SUITE.toml|SUITE_DIR", help="a suite file or a suite directory to open")
    p.add_argument("--dir", default=None, help="the suite directory for a suite file (default: suites/NAME)")
    p.add_argument("--workers", type=int, default=None, help="runs at a time when the suite is started (default: one per core)")
    p.add_argument("--no-identical-check", action="store_true", help="start the suite without the identical-variant check")
    p.add_argument("--theme", choices=("dark", "light"), default="dark", help="colour theme (t switches it)")
    p.set_defaults(func=cmd_tui)
