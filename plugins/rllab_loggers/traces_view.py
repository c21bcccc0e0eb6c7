"""``rllab traces RUN``: a run's per-sample traces (the ``traces`` logger) as rich panels, or as one
self-contained HTML page (``--html out.html``).

In a panel the model's tokens are coloured by their advantage (green above 0, red below; ``--color
advantage``, the default) or by the sampler − trainer log-prob gap (``--color gap``: red where the
sampler gave the token more probability than the trainer, blue where less); the environment's
observation tokens are dimmed. Filters: ``--step`` (default: the last step traced), ``--min-reward``
/ ``--max-reward``, ``--finish`` and ``--grep`` (a substring of the prompt or the answer);
``--limit`` caps the panels.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Iterable

import rllab
from rllab_loggers.traces import FILENAME, read_traces


class TracesError(rllab.RllabError):
    """A run directory without traces, or a filter that names what the traces do not have."""


def _configured(run_dir: Path, logger: str = "traces", default: str = FILENAME) -> list[str] | None:
    """The files the run's ``logger`` loggers write (their ``filename`` knob), from its ``config.toml``
    (None: no readable config)."""
    import tomllib

    try:
        data = tomllib.loads((run_dir / "config.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    loggers = data.get("loggers", ["jsonl"])
    loggers = [loggers] if isinstance(loggers, (str, dict)) else loggers if isinstance(loggers, list) else []
    out = []
    for lg in loggers:
        if lg == logger:
            out.append(default)
        elif isinstance(lg, dict) and lg.get("name") == logger:
            out.append(str(lg.get("filename", default)))
    return out


def traces_path(run: str | Path) -> Path:
    """The traces file of run directory ``run`` (the one its traces logger's ``filename`` names, read
    from its ``config.toml``), or ``run`` itself when it is a file."""
    p = Path(run).expanduser()
    if not p.exists():
        raise TracesError(f"rllab traces: {str(run)!r} does not exist; give a run directory (one with {FILENAME})")
    if not p.is_dir():
        return p
    names = _configured(p)
    if names is None or not names:
        if (p / FILENAME).is_file():
            return p / FILENAME
        why = "its config.toml names no traces logger" if names is not None else f"it has no {FILENAME}"
        raise TracesError(
            f"rllab traces: {str(p)!r} has no traces ({why}); run with the traces logger, e.g. "
            f"rllab run 'loggers=[\"jsonl\", {{name=\"traces\", per_step=4}}]'"
        )
    found = [p / n for n in names if (p / n).is_file()]
    if not found:
        shown = " and ".join(repr(str(p / n)) for n in names)
        raise TracesError(f"rllab traces: the run's traces logger writes {shown}, which does not exist yet (the run "
                          "has not finished a step?)")
    return found[0]


def load(run: str | Path, *, on_cut=None) -> tuple[Path, list[dict]]:
    """The traces file of run directory ``run`` (or the file itself) and its records. A last line
    cut off by a killed run is left out, reported with ``on_cut(path, lineno)`` (default: a warning)."""
    from rllab_loggers.traces import BadLineError, warn_cut

    path = traces_path(run)
    try:
        recs = read_traces(path, on_cut=on_cut or warn_cut)
    except BadLineError as e:
        raise TracesError(f"rllab traces: {str(path)!r} is not a traces file: line {e.lineno} is not JSON ({e.error})") from None
    except UnicodeDecodeError as e:
        raise TracesError(f"rllab traces: {str(path)!r} is not a traces file ({e})") from None
    need = ("step", "prompt", "tokens", "model", "reward", "finish_reason", "advantages", "sampler_logprobs")
    bad = next((i for i, r in enumerate(recs) if not isinstance(r, dict) or any(k not in r for k in need)), None)
    if bad is not None:
        missing = [k for k in need if not isinstance(recs[bad], dict) or k not in recs[bad]]
        raise TracesError(f"rllab traces: {str(path)!r} is not a traces file (record {bad + 1} lacks {', '.join(missing)}); "
                          f"give a run directory with {FILENAME}")
    return path, recs


def _value(x: Any) -> float:
    return float(x)  # "nan"/"inf" were written as strings, which float() reads


def select(recs: list[dict], *, step: int | None = None, min_reward: float | None = None, max_reward: float | None = None,
           finish: str | None = None, grep: str | None = None, limit: int | None = None, all_steps: bool = False,
           kind: str | None = "train") -> list[dict]:
    """The records of ``kind`` (``train``, ``eval``; None: both) that pass the filters; ``step`` None:
    the last step traced (every step with ``all_steps``)."""
    others = {r["step"] for r in recs if kind is not None and r.get("kind", "train") != kind}
    if kind is not None:
        recs = [r for r in recs if r.get("kind", "train") == kind]
    steps = sorted({r["step"] for r in recs})
    if step is not None and step not in steps:
        if step in others:  # the step has the other kind's samples: say how to see them
            flag = "--eval" if kind == "train" else "no --eval"
            raise TracesError(f"rllab traces: step {step} has only {'evaluation answers' if kind == 'train' else 'training samples'}: "
                              f"show them with {flag}")
        if not steps:
            return []
        shown = ", ".join(map(str, steps[:10])) + (f", … {steps[-1]}" if len(steps) > 10 else "")
        raise TracesError(f"rllab traces: no samples of step {step}; traced steps: {shown}")
    if not steps:
        return []
    finishes = sorted({r["finish_reason"] for r in recs})
    if finish is not None and finish not in finishes:
        raise TracesError(f"rllab traces: --finish {finish!r} matches no sample; finish reasons traced: {', '.join(finishes)}")
    want = None if all_steps and step is None else (step if step is not None else steps[-1])
    out = []
    for r in recs:
        reward = _value(r["reward"])
        if want is not None and r["step"] != want:
            continue
        if min_reward is not None and not reward >= min_reward:
            continue
        if max_reward is not None and not reward <= max_reward:
            continue
        if finish is not None and r["finish_reason"] != finish:
            continue
        if grep is not None and grep not in r["prompt"] and grep not in "".join(r["texts"]):
            continue
        out.append(r)
    return out[:limit] if limit else out


def token_colour(r: dict, i: int, color: str) -> float | None:
    """The signed intensity in [−1, 1] of token ``i`` of record ``r`` (None: an observation token, or no value)."""
    if not r["model"][i]:
        return None
    if color == "gap":
        t = r.get("trainer_logprobs")
        if t is None:
            return None
        return max(-1.0, min(1.0, (r["sampler_logprobs"][i] - t[i]) / 0.5))
    scale = max((abs(a) for a in r["advantages"]), default=0.0) or 1.0
    return r["advantages"][i] / scale


def sample_advantage(r: dict) -> float | None:
    """The advantage a sample trains with: the mean over its trained tokens (model tokens with a
    non-zero advantage); 0.0 when none is non-zero, None for an evaluation answer (not trained)."""
    if r.get("kind") == "eval":
        return None
    trained = [_value(a) for a, m in zip(r["advantages"], r["model"]) if m and _value(a) != 0.0]
    return sum(trained) / len(trained) if trained else 0.0


def panel(r: dict, color: str):
    """One record as a rich Panel."""
    from rich.panel import Panel
    from rich.text import Text

    body = Text()
    body.append(r["prompt"], style="bold")
    body.append("\n")
    for i, tok in enumerate(r["tokens"]):
        v = token_colour(r, i, color)
        if not r["model"][i]:
            body.append(tok, style="dim")
        elif v is None:
            body.append(tok)
        else:
            hi = "red" if v < 0 else ("green" if color == "advantage" else "blue")
            if color == "gap":
                hi = "red" if v > 0 else "blue"
            body.append(tok, style=f"on {hi}" if abs(v) >= 0.5 else (hi if abs(v) > 0.05 else ""))
    comps = " ".join(f"{k}={_value(v):g}" for k, v in r["components"].items())
    mism = "" if r.get("mismatch") is None else " mismatch/turn=" + ",".join(f"{m:+.3f}" for m in r["mismatch"])
    stale = "" if r.get("staleness") is None else f" staleness={r['staleness']}"
    where = f"eval · problem {r['group']}" if r.get("kind") == "eval" else f"group {r['group']}"
    adv = sample_advantage(r)
    adv_s = "" if adv is None else f" · advantage {adv:+.4g}"
    title = (f"step {r['step']} · {where} · reward {_value(r['reward']):g}{(' (' + comps + ')') if comps else ''}{adv_s} · "
             f"{r['length']} tokens · {r['turns']} turn(s) · {r['finish_reason']}{stale}{mism}")
    return Panel(body, title=Text(title), title_align="left")  # as text: a component's name is not rich markup


def show(recs: list[dict], *, color: str, console=None) -> None:
    from rich.console import Console

    console = console or Console()
    for r in recs:
        console.print(panel(r, color))


def _curves_svg(metrics: list[dict], keys: Iterable[str]) -> str:
    """Inline SVG line plots of ``keys`` against step (one small chart each)."""
    parts = []
    for key in keys:
        pts = [(r["step"], float(r[key])) for r in metrics if key in r and isinstance(r[key], (int, float)) and math.isfinite(float(r[key]))]
        if len(pts) < 2:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        W, H = 320, 120
        sx = (lambda x: 30 + (x - x0) / ((x1 - x0) or 1) * (W - 40))
        sy = (lambda y: H - 20 - (y - y0) / ((y1 - y0) or 1) * (H - 40))
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(
            f'<figure class="curve"><svg width="{W}" height="{H}" role="img" aria-label="{html.escape(key)}">'
            f'<polyline fill="none" stroke="#2563eb" stroke-width="1.5" points="{path}"/>'
            f'<text x="30" y="12" font-size="11">{html.escape(key)}: {y0:.3g} … {y1:.3g}</text>'
            f'<text x="30" y="{H - 4}" font-size="10">step {x0} … {x1}</text></svg></figure>'
        )
    return "".join(parts)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rllab traces: {title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; }}
.sample {{ border: 1px solid #ccc; border-radius: 6px; padding: .6em; margin: .6em 0; white-space: pre-wrap; font-family: monospace; }}
.sample h3 {{ font: 600 13px system-ui, sans-serif; margin: 0 0 .4em; }}
.prompt {{ font-weight: bold; }} .obs {{ color: #999; }}
.curve {{ display: inline-block; margin: 0 1em 0 0; }}
#filters input, #filters select {{ margin-right: 1em; }}
</style></head><body>
<h1>rllab traces: {title}</h1>
<section id="curves">{curves}</section>
<section id="filters">
samples <select id="kind"><option value="">all</option><option value="train">training</option><option value="eval">evaluation</option></select>
step <select id="step"><option value="">all</option>{step_options}</select>
min reward <input id="minr" type="number" step="any">
finish <select id="finish"><option value="">any</option>{finish_options}</select>
text <input id="grep" type="search">
colour <select id="color"><option value="advantage"{advantage_selected}>advantage</option><option value="gap"{gap_selected}>sampler − trainer gap</option></select>
(a token's value shows when the pointer rests on it)
<span id="count"></span>
</section>
<div id="samples"></div>
<script id="data" type="application/json">{data}</script>
<script>
const recs = JSON.parse(document.getElementById('data').textContent);
const num = v => typeof v === 'string' ? parseFloat(v) : v;
function colour(r, i, mode) {{
  if (!r.model[i]) return null;
  if (mode === 'gap') {{
    if (!r.trainer_logprobs) return null;
    const d = r.sampler_logprobs[i] - r.trainer_logprobs[i], g = Math.max(-1, Math.min(1, d / 0.5));
    return [g > 0 ? `rgba(220,38,38,${{g}})` : `rgba(37,99,235,${{-g}})`, `sampler − trainer log-prob ${{sign(d)}}`];
  }}
  const s = Math.max(...r.advantages.map(Math.abs)) || 1, a = r.advantages[i] / s;
  return [a > 0 ? `rgba(22,163,74,${{a}})` : `rgba(220,38,38,${{-a}})`, `advantage ${{sign(r.advantages[i])}}`];
}}
const sign = v => (v > 0 ? '+' : '') + Number(num(v).toPrecision(4));
function esc(t) {{ const d = document.createElement('span'); d.textContent = t; return d.innerHTML; }}
function render() {{
  const step = document.getElementById('step').value, minr = document.getElementById('minr').value;
  const fin = document.getElementById('finish').value, grep = document.getElementById('grep').value;
  const mode = document.getElementById('color').value, kind = document.getElementById('kind').value;
  const shown = recs.filter(r => (!kind || (r.kind || 'train') === kind) && (!step || r.step == step) && (minr === '' || num(r.reward) >= parseFloat(minr))
    && (!fin || r.finish_reason === fin) && (!grep || r.prompt.includes(grep) || r.texts.join('').includes(grep)));
  document.getElementById('count').textContent = `${{shown.length}} of ${{recs.length}} samples`;
  document.getElementById('samples').innerHTML = shown.map(r => {{
    const toks = r.tokens.map((t, i) => {{
      if (!r.model[i]) return `<span class="obs">${{esc(t)}}</span>`;
      const c = colour(r, i, mode);
      return c ? `<span style="background:${{c[0]}}" title="${{c[1]}}">${{esc(t)}}</span>` : esc(t);
    }}).join('');
    return `<div class="sample"><h3>${{r.kind === 'eval' ? 'eval · ' : ''}}step ${{r.step}} · group ${{r.group}} · reward ${{num(r.reward)}}${{r.advantage === null ? '' : ' · advantage ' + sign(r.advantage)}} · ${{r.length}} tokens · ${{r.turns}} turn(s) · ${{r.finish_reason}}</h3>`
      + `<span class="prompt">${{esc(r.prompt)}}</span>\\n${{toks}}</div>`;
  }}).join('');
}}
for (const id of ['kind', 'step', 'minr', 'finish', 'grep', 'color']) document.getElementById(id).addEventListener('input', render);
render();
</script></body></html>
"""


def _json_safe(v: Any) -> Any:
    """``v`` with non-finite floats as strings ("nan", "-inf"): JSON.parse reads no NaN or Infinity."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def embed_json(value: Any) -> str:
    """``value`` as JSON text that is inert inside an HTML ``<script>`` element: every ``<``, ``>`` and
    ``&`` (which could end the element, or open a comment that swallows the page's own script) and the
    line separators U+2028/U+2029 are written as ``\\u`` escapes, which JSON.parse reads back as the
    same characters."""
    text = json.dumps(_json_safe(value), allow_nan=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def write_html(path: Path, recs: list[dict], *, title: str, metrics: list[dict], color: str = "advantage") -> Path:
    """One self-contained page (no network): the samples with client-side filters, and the run's
    curves; its tokens coloured by ``color`` (``advantage``, ``gap``) until another is chosen."""
    steps = sorted({r["step"] for r in recs})
    finishes = sorted({r["finish_reason"] for r in recs})
    data = embed_json([{**r, "advantage": sample_advantage(r)} for r in recs])
    page = PAGE.format(
        title=html.escape(title), curves=_curves_svg(metrics, ("rollout/reward", "rollout/accuracy", "eval/accuracy", "actor/entropy")),
        step_options="".join(f'<option value="{s}">{s}</option>' for s in steps),
        finish_options="".join(f'<option value="{html.escape(f)}">{html.escape(f)}</option>' for f in finishes), data=data,
        advantage_selected=" selected" if color == "advantage" else "", gap_selected=" selected" if color == "gap" else "",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def register_command(subparsers) -> None:
    p = subparsers.add_parser("traces", help="show a run's per-sample traces (the traces logger) as panels, or as an HTML page")
    p.add_argument("run", metavar="RUN", help="a run directory (with traces.jsonl) or a traces file")
    p.add_argument("--step", type=int, default=None, help="the step to show (default: the last traced)")
    p.add_argument("--min-reward", type=float, default=None)
    p.add_argument("--max-reward", type=float, default=None)
    p.add_argument("--finish", default=None, help="only samples that ended so (stop, length, max_turns, …)")
    p.add_argument("--grep", default=None, help="only samples whose prompt or answer contains this text")
    p.add_argument("--limit", type=int, default=None, help="show at most this many")
    p.add_argument("--eval", action="store_true", help="the evaluations' greedy answers instead of the training samples")
    p.add_argument("--color", choices=("advantage", "gap"), default="advantage", help="colour the model's tokens by advantage or by the sampler − trainer log-prob gap")
    p.add_argument("--html", default=None, metavar="OUT.html", help="write every traced step as one self-contained page instead")
    p.set_defaults(func=cmd_traces)


def _filtered(args) -> bool:
    return any(v is not None for v in (args.step, args.min_reward, args.max_reward, args.finish, args.grep))


def _nothing_shown(args, recs: list[dict], path: Path) -> str:
    """Why no sample is shown: the filters, or what the file lacks."""
    if _filtered(args):
        given = [f"--{name.replace('_', '-')} {value!r}" for name in ("step", "min_reward", "max_reward", "finish", "grep")
                 if (value := getattr(args, name)) is not None]
        return f"no sample passes the filters ({', '.join(given)})"
    if args.html:
        return f"{str(path)!r} holds no sample"
    if args.eval:
        return (f"{str(path)!r} holds no evaluation answers (the traces logger's per_eval is 0, or no evaluation has run); "
                "drop --eval for the training samples")
    return f"{str(path)!r} holds no training samples, only evaluation answers: show them with --eval"


def cmd_traces(args) -> int:
    import sys

    from rllab_loggers.traces import BadLineError

    def cut(path, lineno):
        print(f"warning: {path}: line {lineno}, the last, is cut off (the run stopped while writing it, or is writing it now); "
              "showing the lines before it", file=sys.stderr)

    if args.limit is not None and args.limit < 1:
        print(f"rllab traces: --limit {args.limit} must be at least 1", file=sys.stderr)
        return 2
    if args.min_reward is not None and args.max_reward is not None and args.min_reward > args.max_reward:
        print(f"rllab traces: --min-reward {args.min_reward} is above --max-reward {args.max_reward}: no reward passes both",
              file=sys.stderr)
        return 2
    try:
        path, recs = load(args.run, on_cut=cut)
        if not recs:
            raise TracesError(f"rllab traces: {str(path)!r} is empty: the run has traced no sample yet")
        if args.html and Path(args.html).is_dir():
            raise TracesError(f"rllab traces: --html {args.html!r} is a directory; give the page's file name, e.g. {args.html.rstrip('/')}/traces.html")
        kind = "eval" if args.eval else None if args.html else "train"  # a page holds both kinds, but with --eval
        shown = select(recs, step=args.step, min_reward=args.min_reward, max_reward=args.max_reward, finish=args.finish,
                       grep=args.grep, limit=args.limit, all_steps=bool(args.html), kind=kind)
        if not shown:
            raise TracesError(f"rllab traces: {_nothing_shown(args, recs, path)}" + ("; no page written" if args.html else ""))
        if args.html:
            names = _configured(path.parent, "jsonl", "metrics.jsonl") or ["metrics.jsonl"]
            metrics_file = path.parent / names[0]
            try:
                metrics = read_traces(metrics_file, on_cut=cut) if metrics_file.is_file() else []
            except (BadLineError, UnicodeDecodeError) as e:
                print(f"warning: {metrics_file} is unreadable ({e}); the page has no curves", file=sys.stderr)
                metrics = []
            out = write_html(Path(args.html), shown, title=path.parent.name, metrics=metrics, color=args.color)
            print(f"wrote {out} ({len(shown)} samples)")
            return 0
        show(shown, color=args.color)
    except TracesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
