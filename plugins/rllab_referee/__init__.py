"""``rllab import``: a TRL or verl config in, the same algorithm as an rllab TOML out.

Commands (added through ``register_commands``)::

    rllab import trl CONFIG.yaml|json [--out run.toml] [--processes N] [--strict]
    rllab import verl CONFIG.yaml [key=value …] [--out run.toml] [--strict]
    rllab crosscheck trl CONFIG.yaml [--steps K] [--tries T] [--seeds N --curve-steps S] [--install-trl]
    rllab crosscheck verl CONFIG.yaml [key=value …] [--batches B]

Every knob of the source config is mapped to rllab settings (each written with a comment naming
the knob it came from), ignored because it only moves hardware, logging, data loading or
evaluation (listed in the printed summary), or refused, naming it and why — then nothing is
written. Knobs rllab follows up to a small stated difference (a learning-rate warm-up's first
step, …) are listed as such, and refused with ``--strict``. The written TOML is validated as
``rllab run`` would load it before it is written.

Modules: :mod:`rllab_referee.trl` (TRL ``GRPOConfig``, field table in
:mod:`rllab_referee.trl_fields`), :mod:`rllab_referee.verl` (verl ``ppo_trainer``),
:mod:`rllab_referee.result` (the :class:`~rllab_referee.result.Translation` both fill),
:mod:`rllab_referee.source` (reading the file, importing it); ``rllab crosscheck``: :mod:`rllab_referee.crosscheck` (TRL) and
:mod:`rllab_referee.verl_check` (verl's functions, loaded by :mod:`rllab_referee.verl_reference`). The
mapping in both directions is docs/frameworks.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import rllab
from rllab import RllabError
from rllab_referee.source import read_config_file, run_import

__all__ = ["read_config_file", "register_commands", "run_import"]


def cmd_import(args) -> int:
    if args.out and Path(args.out).is_dir():  # said before the import: --force cannot replace a directory with a file
        raise RllabError(f"--out {args.out} is a directory; give the TOML file to write, e.g. --out {Path(args.out) / 'run.toml'}")
    t = run_import(args.framework, args.config, args.overrides, lab=args.lab, processes=args.processes, strict=args.strict)
    header = f"Imported by `rllab import {args.framework}` from {args.config}.\nRun it with: rllab run {args.out or 'THIS.toml'}"
    text = t.toml(header=header)
    if args.out:
        out = Path(args.out)
        if out.exists() and not args.force:
            raise RllabError(f"{out} exists; pass --force to replace it")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(t.summary())
        print(f"wrote {out}; run it with: rllab run {out}")
    else:
        print(text, end="")
        print(t.summary(), file=sys.stderr)
    return 0


@rllab.hookimpl
def register_commands(subparsers):
    from rllab_suite import whole_number

    p = subparsers.add_parser("import", help="write the rllab TOML of a TRL GRPOConfig or a verl ppo_trainer config, knob by knob")
    p.add_argument("framework", choices=("trl", "verl"), help="whose config: trl (GRPOConfig YAML/JSON) or verl (ppo_trainer YAML)")
    p.add_argument("config", metavar="CONFIG", help="the config file (YAML, or JSON for TRL)")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="verl: dotted overrides, as on verl's command line")
    p.add_argument("--out", default=None, help="the TOML to write (default: print it)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--processes", type=whole_number(1), default=1,
                   help="trl: the number of training processes TRL ran with (sizes its generation batch; default 1)")
    p.add_argument("--strict", action="store_true", help="refuse the knobs rllab follows only up to a stated difference")
    p.set_defaults(func=cmd_import)
    from rllab_referee.crosscheck import add_parser

    add_parser(subparsers)
