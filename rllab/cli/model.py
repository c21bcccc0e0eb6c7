"""``rllab export`` and ``rllab eval``: a trained model out of its run, and a model scored on a task.

    rllab export RUN_DIR [--step N] --out DIR   a Hugging Face model directory (rllab.training.export)
    rllab eval [TARGET] [key=value …]          held-out accuracy, pass@k, intervals (rllab.training.evaluate)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rllab.errors import RllabError

console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _lab(args):
    from rllab.lab import Lab

    lab = getattr(args, "lab", None) or Lab(plugins=args.plugin or ())
    lab.register_components()  # a plugin can also fail while registering
    lab.refuse_named_failures()  # as rllab run does
    for p in lab.problems:
        err_console.print(f"[yellow]warning:[/] {escape(p)}")
    return lab


def cmd_export(args) -> int:
    from rllab.training.export import export_run

    lab = _lab(args)
    out, step = export_run(Path(args.run), Path(args.out), step=args.step, lab=lab, overwrite=args.overwrite, progress=True)
    console.print(f"exported [bold]{escape(args.run)}[/] after step {step} to [bold]{escape(str(out))}[/]")
    console.print(escape(f"load it: AutoModelForCausalLM.from_pretrained({str(out)!r}), AutoTokenizer.from_pretrained({str(out)!r})"),
                  highlight=False)
    console.print(escape(f"score it: rllab eval {out}    serve it: python -m sglang.launch_server --model-path {out}"), highlight=False)
    return 0


def _pct(x: float) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def cmd_eval(args) -> int:
    from rllab.training.evaluate import evaluate

    overrides = list(args.overrides)
    target = args.target
    if target is not None and "=" in target and not Path(target).exists():
        overrides.insert(0, target)
        target = None
    if args.show < 0:
        raise RllabError(f"--show must be 0 or more, got {args.show}")
    lab = _lab(args)
    result = evaluate(target, overrides, step=args.step, samples=args.samples, show=args.show, lab=lab, progress=not args.json)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False, default=str))
        return 0
    m, ci = result["metrics"], result["intervals"]
    console.print(escape(f"{result['target']} on {result['task']}: {result['problems']} held-out problems, solved when "
                         f"{result['solved_when']}"), highlight=False, soft_wrap=True)
    t = Table(box=box.SIMPLE_HEAVY)
    for col in ("metric", "value", "95% interval over problems"):
        t.add_column(col)
    for key, value in m.items():
        if key == "eval/n":
            continue
        lo_hi = ci.get(key)
        rate = key != "eval/reward" and key != "eval/turns"
        shown = _pct(value) if rate else f"{value:.4f}"
        interval = f"{_pct(lo_hi[0])} – {_pct(lo_hi[1])}" + (" (Wilson)" if key == "eval/accuracy" else " (bootstrap)") if lo_hi else ""
        t.add_row(key.removeprefix("eval/"), shown, interval)
    console.print(t)
    for i, s in enumerate(result["samples"]):
        mark = "[green]solved[/]" if s["solved"] else "[red]unsolved[/]"
        console.rule(f"sample {i + 1}: {mark}, reward {s['reward']:g}")
        console.print(f"[dim]prompt:[/] {escape(s['prompt'])}", highlight=False)
        if s.get("answer") is not None:
            console.print(f"[dim]answer:[/] {escape(str(s['answer']))}", highlight=False)
        console.print(f"[dim]model:[/]  {escape(s['completion'])}", highlight=False)
    return 0


def add_commands(sub, common) -> None:
    """The ``export`` and ``eval`` subcommands."""
    se = sub.add_parser("export", parents=[common], help="write a run's policy as a Hugging Face model directory")
    se.add_argument("run", metavar="RUN_DIR", help="the run directory")
    se.add_argument("--step", type=int, help="the checkpoint after N steps (default: the newest)")
    se.add_argument("--out", required=True, metavar="DIR", help="where to write the model directory")
    se.add_argument("--overwrite", action="store_true", help="replace DIR if it is not empty")
    se.set_defaults(func=cmd_export)

    sv = sub.add_parser("eval", parents=[common], help="score a model on a task's held-out split (accuracy, pass@k)")
    sv.add_argument("target", nargs="?", metavar="TARGET", help="a run directory, a model directory, or nothing with model.path=DIR")
    sv.add_argument("overrides", nargs="*", help="dotted overrides, e.g. task=countdown train.eval_size=500")
    sv.add_argument("--step", type=int, help="a run directory's checkpoint after N steps (default: the newest)")
    sv.add_argument("--samples", type=int, metavar="N", help="also N sampled answers per problem: mean@N and pass@k (default: train.eval_samples)")
    sv.add_argument("--show", type=int, default=0, metavar="N", help="print the first N greedy answers")
    sv.add_argument("--json", action="store_true", help="print the result as JSON")
    sv.set_defaults(func=cmd_eval)
