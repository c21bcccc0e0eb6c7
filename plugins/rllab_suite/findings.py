"""``rllab findings build [--check]``: the numbers of docs/findings.md, rebuilt from committed results.

The page's numbers live in generated blocks, each rebuilt from a suite's committed files
(``benchmarks/suites/NAME.toml`` and ``benchmarks/suites/results/NAME/``)::

    <!-- findings: verdicts NAME [CLAIM …] -->  the suite file's [claims] (or those named), decided on runs.csv
                                                (over problems and seeds where problems.csv is committed;
                                                per start and over all starts when the runs came from several)
    <!-- findings: arms NAME [track:METRIC …] --> per arm: final and AUC accuracy (summary.csv), tracked metrics;
                                                per start too (summary.json) for runs from several starts
    <!-- findings: passk NAME -->               pass@k gains after − before (summary.json)
    <!-- findings: law NAME -->                 the entropy–performance law per arm (summary.json)
    <!-- findings: pooled POOL [CLAIM …] -->    claims over several suites' committed runs, each run once
                                                (benchmarks/suites/pooled/POOL.toml, rllab_suite.pooled)
    <!-- findings: index -->                    one row per finding: its suites and computed verdicts
    … generated text …
    <!-- /findings -->

``build`` rewrites every block; ``--check`` rebuilds them and fails (exit 1) when the page differs.
Both also check the prose outside the blocks: a decimal number a finding quotes must occur in its
own generated blocks or in its suites' files (``NAME.toml``, ``report.md``, ``summary.csv``), so a
number no committed file rebuilds is not quoted; and "recovers", "equal", "matches", "parity",
"no cost" appear only in a finding with an ``equivalent`` verdict.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path

import attrs

from rllab_suite import verdicts as verdicts_
from rllab_suite.committed import CsvRun, read_runs_csv, read_summary_csv

BLOCK = re.compile(r"(?P<open><!-- findings: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(?P<close><!-- /findings -->)", re.S)
SECTION = re.compile(r"^## (?P<num>\d+)\. (?P<title>.+)$", re.M)
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.]*\d)")
ARXIV = re.compile(r"\b\d{4}\.\d{4,5}\b")


class FindingsError(ValueError):
    """A findings page that cannot be rebuilt (an unknown block, a suite without committed results)."""


class Findings:
    """Renders blocks from the committed files under ``root`` (the repository)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.suites = self.root / "benchmarks" / "suites"
        self.results = self.suites / "results"
        self._sizes: dict[str, int | None] = {}
        self._pools: dict = {}
        self.decided: dict[str, list[dict]] = {}
        self.learning: dict[str, list[dict]] = {}
        """Per suite whose verdicts were decided: whether each start's reference arm learns (:func:`rllab_suite.verdicts.learning_by_start`)."""

    def files(self, name: str) -> Path:
        d = self.results / name
        if not (d / "runs.csv").is_file():
            raise FindingsError(f"suite {name!r}: no committed results ({d / 'runs.csv'} is missing)")
        return d

    def eval_size(self, name: str) -> int | None:
        """Held-out problems per evaluation: train.eval_size capped by the task's held-out set."""
        if name not in self._sizes:
            self._sizes[name] = held_out_size(self.suites / f"{name}.toml")
        return self._sizes[name]

    def render(self, spec: str) -> str:
        kind, *args = spec.split()
        if kind == "verdicts" and args:
            return self.verdicts(args[0], args[1:], key=spec)
        if kind == "arms" and args:
            return self.arms(args[0], args[1:])
        if kind == "passk" and len(args) == 1:
            return self.passk(args[0])
        if kind == "law" and len(args) == 1:
            return self.law(args[0])
        if kind == "pooled" and args:
            return self.pooled(args[0], args[1:], key=spec)
        raise FindingsError(f"unknown block <!-- findings: {spec} -->; blocks: verdicts NAME [CLAIM …], arms NAME [track:METRIC …], passk NAME, law NAME, "
                            "pooled POOL [CLAIM …], index")

    # ------------------------------------------------------------------ blocks

    def verdicts(self, name: str, only: list[str] = (), *, key: str = "") -> str:
        from rllab_suite.spec import parse_suite

        suite = parse_suite(self.suites / f"{name}.toml")
        if not suite.claims:
            raise FindingsError(f"suite {name!r} states no [claims]: nothing to decide")
        unknown = [c for c in only if c not in {c.name for c in suite.claims}]
        if unknown:
            raise FindingsError(f"verdicts {name}: {', '.join(unknown)} not among the suite's claims ({', '.join(c.name for c in suite.claims)})")
        claims = tuple(c for c in suite.claims if not only or c.name in only)
        runs = read_runs_csv(self.files(name) / "runs.csv")
        tasks = list(dict.fromkeys(r.task for r in runs))
        control = next((v.name for v in suite.variants if v.control == verdicts_.NO_LEARNING_CONTROL), None)
        entries = verdicts_.evaluate_claims(runs, claims, tasks=tasks, control=control)
        entries = [{**self._from_gain(name, suite, e), "suite": name} for e in entries]
        self.decided[key or f"verdicts {name}"] = entries
        self.learning[name] = verdicts_.learning_by_start(runs, [v.name for v in suite.variants if not v.control], control, tasks=tasks)
        lines = verdicts_.markdown_lines(entries, eval_size=self.eval_size(name), explain=False, learning=self.learning[name])
        lines[0] = f"Verdicts of `{name}.toml`'s claims, decided on `results/{name}/runs.csv`."
        return "\n".join(lines).rstrip() + "\n"

    def _from_gain(self, name: str, suite, e: dict) -> dict:
        """A pass@K claim against the warm start (``no_rl``), which runs.csv does not carry: decided on
        summary.json's gain after − before (each seed against its own step-0 evaluation, which is
        the warm start evaluated alike), with its 95% CI over seeds; no 90% CI, so no equivalence test."""
        control = next((v.control for v in suite.variants if v.name == e["against"]), None)
        if e["diff"] is not None or not e["metric"].startswith("pass@") or control != "no_rl":
            return e
        path = self.files(name) / "summary.json"
        rows = json.loads(path.read_text())["rows"] if path.is_file() else []
        row = next((r for r in rows if r["variant"] == e["arm"] and r["task"] == e["task"]), None)
        g = ((row or {}).get("pass_at") or {}).get("gain", {}).get(e["metric"][5:])
        if g is None:
            return e
        diff = {"effect": g[0], "ci95": (g[1], g[2]), "ci90": (math.nan, math.nan), "problems": 1, "seeds": (row["runs"], row["runs"]), "levels": "seeds"}
        claim = next(c for c in suite.claims if c.name == e["claim"])
        verdict, why = verdicts_.decide(claim, diff)
        return {**e, "diff": diff, "verdict": verdict, "why": why + "; from summary.json's gain after − before (each seed against its own warm-start evaluation)"}

    def arms(self, name: str, extra: list[str]) -> str:
        rows = read_summary_csv(self.files(name) / "summary.csv")
        for m in extra:
            if not m.startswith("track:") or f"last {m[6:]} mean" not in rows[0]:
                raise FindingsError(f"arms {name}: {m!r} is not a tracked metric of results/{name}/summary.csv (give track:NAME)")
        head = ["arm", "seeds", "final acc % [95% CI]", "AUC acc % [95% CI]"] + [f"{m[6:]}, last 10% of steps [95% CI]" for m in extra]
        levels = "held-out problems and seeds" if (self.files(name) / "problems.csv").is_file() else "seeds"
        out = [f"From `results/{name}/summary.csv`: mean over seeds, 95% percentile-bootstrap CI over {levels}; "
               f"{verdicts_.resolution(self.eval_size(name))}.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            cells = [r["variant"], r["runs"], _stat(r, "final_accuracy", 100, ".1f"), _stat(r, "auc_accuracy", 100, ".1f")]
            cells += [_stat(r, f"last {m[6:]}", 1, ".3g", sep=" ") for m in extra]
            out.append("| " + " | ".join(cells) + " |")
        path = self.files(name) / "summary.json"
        starts = (json.loads(path.read_text()).get("starts") or []) if path.is_file() else []
        if starts:
            from rllab_suite.report import format_percent

            out[0] = out[0].replace("over held-out problems and seeds", "over starts, held-out problems and seeds (the runs of "
                                    f"{len(starts)} starting models pooled)")
            out += ["", f"Per start, from `results/{name}/summary.json`: each starting model's runs alone (warm-start seed and sha256), "
                    "95% CI over its problems and seeds.", "",
                    "| start | sha256 | arm | seeds | initial acc % | final acc % [95% CI] | AUC acc % [95% CI] |", "|---|---|---|---|---|---|---|"]
            for st in starts:
                for r in st["rows"]:
                    init = r.get("initial_accuracy")
                    init = f"{100 * init:.1f}" if isinstance(init, (int, float)) and math.isfinite(init) else "—"
                    out.append(f"| {st['start']} | {(st.get('sha256') or '—')[:16]} | {r['variant']} | {r['runs']} | {init} | "
                               f"{format_percent(r['final_accuracy'])} | {format_percent(r['auc_accuracy'])} |")
        return "\n".join(out) + "\n"

    def passk(self, name: str) -> str:
        from rllab_suite.report import crossover

        summary = json.loads((self.files(name) / "summary.json").read_text())
        rows = [r for r in summary["rows"] if r.get("pass_at", {}).get("gain")]
        if not rows:
            raise FindingsError(f"passk {name}: results/{name}/summary.json has no pass@k gains")
        ks = sorted({int(k) for r in rows for k in r["pass_at"]["gain"]})
        levels = ("held-out problems and seeds (each problem paired with itself)" if all(r["pass_at"].get("gain_levels") for r in rows)
                  else "seeds")
        out = [f"From `results/{name}/summary.json`: pass@k gain after − before in points, each seed against its own first "
               f"evaluation, mean over seeds with a 95% bootstrap CI over {levels}; {verdicts_.resolution(self.eval_size(name))}.", "",
               "| arm | " + " | ".join(f"pass@{k}" for k in ks) + " | crossover |", "|---|" + "---|" * (len(ks) + 1)]
        for r in rows:
            g = {int(k): tuple(v) for k, v in r["pass_at"]["gain"].items()}
            if not any(v[0] != 0 for v in g.values()):
                continue
            k_mean, k_sure = crossover(g)
            cross = f"none up to k = {max(g)}" if k_mean is None else f"k ≥ {k_mean}" + (f" (CI below 0 from k = {k_sure})" if k_sure else " (CI spans 0)")
            out.append(f"| {r['variant']} | " + " | ".join(
                (f"{100 * g[k][0]:+.1f} [{100 * g[k][1]:+.1f}, {100 * g[k][2]:+.1f}]" if math.isfinite(g[k][1]) else f"{100 * g[k][0]:+.1f}") if k in g else "—"
                for k in ks) + f" | {cross} |")
        return "\n".join(out) + "\n"

    def law(self, name: str) -> str:
        summary = json.loads((self.files(name) / "summary.json").read_text())
        law = summary.get("entropy_law") or {}
        tasks = law.get("tasks") or {}
        if not tasks:
            raise FindingsError(f"law {name}: results/{name}/summary.json has no entropy_law")
        from rllab_suite.entropy_law import heldout_lines

        out = []
        for task in tasks:
            held = heldout_lines(law, task, heading=False)
            if held:
                out += [f"From `results/{name}/summary.json` (`entropy_law.heldout`, from the series it keeps in `entropy_law.series`), "
                        f"task `{task}`: R = −a·exp(H) + b on *held-out* accuracy. " + held[0], *held[1:]]
        if not out:
            out = [f"`results/{name}/summary.json` holds no held-out series (it was written before the suite kept them): "
                   f"`rllab suite report` on the suite's directory adds them.", ""]
        out += [f"The same law fitted to *training* accuracy (`{law.get('reward', 'rollout/accuracy')}`) against entropy "
                "(pooled points of every seed, each the mean over a bin of steps), 95% CIs from refits on seeds drawn with replacement.", "",
                "| task | arm | a [95% CI] | b [95% CI] | R² |", "|---|---|---|---|---|"]
        for task, t in tasks.items():
            for arm, d in (t.get("arms") or t).items():
                if not isinstance(d, dict) or "a" not in d:
                    continue
                out.append(f"| {task} | {arm} | {_ci(d, 'a')} | {_ci(d, 'b')} | {_num(d.get('r2'), '.2f')} |")
        return "\n".join(out) + "\n"

    def pool(self, name: str):
        """The pool ``benchmarks/suites/pooled/NAME.toml`` (:mod:`rllab_suite.pooled`), read once."""
        from rllab_suite import pooled as pooled_
        from rllab_suite.spec import parse_suite

        if name not in self._pools:
            path = self.suites / "pooled" / f"{name}.toml"
            if not path.is_file():
                raise FindingsError(f"pooled {name}: no pool file {path}")
            known = {p.stem: None for p in self.suites.glob("*.toml") if (self.results / p.stem / "runs.csv").is_file()}
            try:
                raw = tomllib.loads(path.read_text()).get("suites") or []
                for n in raw:
                    if n in known:
                        known[n] = parse_suite(self.suites / f"{n}.toml").variant_names
                self._pools[name] = pooled_.read_pool(path, {k: v for k, v in known.items() if v is not None})
            except (pooled_.PoolError, tomllib.TOMLDecodeError) as e:
                raise FindingsError(str(e)) from None
        return self._pools[name]

    def pooled(self, name: str, only: list[str] = (), *, key: str = "") -> str:
        from rllab_suite import pooled as pooled_

        pool = self.pool(name)
        unknown = [c for c in only if c not in {c.name for c in pool.claims}]
        if unknown:
            raise FindingsError(f"pooled {name}: {', '.join(unknown)} not among the pool's claims ({', '.join(c.name for c in pool.claims)})")
        claims = [c for c in pool.claims if not only or c.name in only]
        try:
            folded, idle = pooled_.gather(self.root, pool, {a for c in claims for a in (c.arm, c.against)})
            controls, _ = pooled_.gather(self.root, pool, {verdicts_.NO_LEARNING_CONTROL})
            entries = [{**pooled_.decide_pool(folded, c, controls=controls), "suite": "pooled"} for c in claims]
        except pooled_.PoolError as e:
            raise FindingsError(f"pooled {name}: {e}") from None
        self.decided[key or f"pooled {name}"] = entries
        sizes = {self.eval_size(n) for n in pool.suites if n not in idle}
        return "\n".join(pooled_.markdown_lines(name, pool, entries, idle=idle, eval_size=sizes.pop() if len(sizes) == 1 else None)).rstrip() + "\n"

    def index(self, text: str) -> str:
        out = ["| # | finding | suites | computed verdicts |", "|---|---|---|---|"]
        for num, title, body in sections(text):
            names = block_suites(body, self.root)
            decided = [e for m in BLOCK.finditer(body) for e in self.decided.get(m.group("spec").strip(), [])]
            said = "; ".join(f"{e['suite'] + '/' if len(names) > 1 else ''}{e['claim']}: {verdicts_.verdict_cell(e)}" + _over_starts(e) for e in decided) or "no claim decided here"
            said += "".join(_learning_note(n, self.learning[n], len(names) > 1) for n in names if self.learning.get(n))
            out.append(f"| {num} | {title} | {', '.join(f'`{n}`' for n in names) or '—'} | {said} |")
        return "\n".join(out) + "\n"


def _learning_note(name: str, learning: list[dict], several: bool) -> str:
    """An index row's note on the starts of suite ``name`` whose reference arm does not learn (or that no control can check)."""
    where = f" in `{name}`" if several else ""
    if all(g["learns"] is None for g in learning):
        return f"; whether each start learns is not checked{where}: {learning[0]['why']}"
    flat = [g for g in learning if g["learns"] is False]
    if not flat:
        return ""
    said = ", ".join(f"{verdicts_.start_label(g['start'])} ({g['arm']} − {g['control']}, final accuracy {verdicts_.gain_text(g['diff'], g['metric'])})"
                     for g in flat)
    return f"; **not shown to learn{where}**: {said}, so no equivalence holds from {'it' if len(flat) == 1 else 'them'}"


def _over_starts(e: dict) -> str:
    """How an index entry's verdict stands across starts: "" for one start."""
    if e.get("strata"):
        said = ", ".join(verdicts_.verdict_text(g) for g in e["strata"])
        return f" over {len(e['strata'])} comparisons" + (f", differing between them ({said})" if e.get("differs") else ", the same in each")
    per = e.get("per_start")
    if not per:
        return ""
    if e.get("differs"):
        return " over " + f"{len(per)} starts, differing between them (" + ", ".join(verdicts_.verdict_text(p) for p in per) + ")"
    if per[0]["verdict"] != e["verdict"]:  # every start alone agrees, the starts together say more (or less)
        return f" over {len(per)} starts, {verdicts_.verdict_text(per[0])} from each alone"
    return f" from each of {len(per)} starts"


def _stat(r: dict, key: str, k: float, fmt: str, sep: str = "_") -> str:
    try:
        m, lo, hi = (float(r[f"{key}{sep}{p}"]) for p in ("mean", "low", "high"))
    except (KeyError, ValueError):
        return "—"
    if not math.isfinite(m):
        return "—"
    return format(k * m, fmt) + (f" [{format(k * lo, fmt)}, {format(k * hi, fmt)}]" if math.isfinite(lo) else "")


def _num(x, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and math.isfinite(x) else "—"


def _ci(d: dict, name: str) -> str:
    ci = d.get(f"{name}_ci") or {}
    s = _num(d.get(name), ".3f")
    if isinstance(ci, dict) and isinstance(ci.get("low"), (int, float)) and math.isfinite(ci["low"]):
        s += f" [{ci['low']:.3f}, {ci['high']:.3f}]"
    return s


def held_out_size(suite_path: Path) -> int | None:
    """Held-out problems one evaluation of the suite scores: ``train.eval_size`` of its first cell,
    capped by the size of its task's (or environment's) held-out set; None when it cannot be built."""
    from rllab import Lab
    from rllab.config import COMPONENT_SECTIONS, load_config
    from rllab_suite.spec import _resolve, cell_overrides, parse_suite

    lab = Lab()
    suite = parse_suite(suite_path)
    v = suite.variants[0]
    cfg = load_config(_resolve(v.config or (None if v.preset else suite.base_config), suite),
                      cell_overrides(suite, v, suite.tasks[0], suite.seeds[0], frozenset(lab.names("environment"))),
                      lab=lab, preset=v.preset or (None if v.config else suite.base_preset))
    size = cfg.train.eval_size
    comp = cfg.component(cfg.source)
    try:
        made = lab.get(COMPONENT_SECTIONS[cfg.source][0], comp.name, **dict(comp.knobs))()
        held = len(made.eval_examples())
    except Exception:  # a source that cannot be built here (a server, a dataset): the configured size
        return size
    return min(size, held)


def block_suites(body: str, root: Path) -> list[str]:
    """The suites a finding's blocks read: each block's suite, and every suite a ``pooled`` block's pool names."""
    names = []
    for m in BLOCK.finditer(body):
        kind, *args = m.group("spec").split() or ["index"]
        if kind == "index" or not args:
            continue
        if kind == "pooled":
            path = Path(root) / "benchmarks" / "suites" / "pooled" / f"{args[0]}.toml"
            try:
                names += [n for n in tomllib.loads(path.read_text()).get("suites") or [] if isinstance(n, str)]
            except (OSError, tomllib.TOMLDecodeError):
                pass
            continue
        names.append(args[0])
    return list(dict.fromkeys(names))


def sections(text: str) -> list[tuple[str, str, str]]:
    """(number, title, body) of each ``## N. title`` section."""
    heads = list(SECTION.finditer(text))
    return [(h.group("num"), h.group("title").strip(), text[h.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)])
            for i, h in enumerate(heads)]


def build(text: str, root: Path) -> str:
    """The page with every generated block rebuilt (the index last, from the verdicts decided)."""
    f = Findings(root)

    def fill(m: re.Match) -> str:
        spec = m.group("spec").strip()
        return m.group("open") + ("" if spec == "index" else f.render(spec)) + m.group("close")

    text = BLOCK.sub(fill, text)
    return BLOCK.sub(lambda m: m.group("open") + (f.index(text) if m.group("spec").strip() == "index" else m.group("body")) + m.group("close"), text)


def lint(text: str, root: Path) -> list[str]:
    """What the prose of each finding says that its committed files do not back (see the module docstring)."""
    problems = []
    results = Path(root) / "benchmarks" / "suites"
    for num, title, body in sections(text):
        generated = "".join(m.group("body") for m in BLOCK.finditer(body))
        prose = BLOCK.sub("", body)
        names = block_suites(body, root)
        backing = generated
        for n in names:
            for p in (results / f"{n}.toml", results / "results" / n / "report.md", results / "results" / n / "summary.csv"):
                backing += p.read_text() if p.is_file() else ""
        unbacked = list(dict.fromkeys(m.group(0) for m in DECIMAL.finditer(ARXIV.sub("", prose)) if m.group(0) not in backing))
        if unbacked:
            problems.append(f"finding {num} ({title}): quotes {', '.join(unbacked)}, which none of its generated blocks or committed files "
                            f"({', '.join(names) or 'no suite named'}) contains")
        word = verdicts_.claims_equivalence(prose)
        if word and "equivalent within" not in generated:
            problems.append(f"finding {num} ({title}): says {word!r}, which needs an 'equivalent within ±m' verdict; none of its claims has one")
    return problems


def run(doc: Path, *, check: bool, root: Path | None = None) -> tuple[int, list[str]]:
    """``(exit code, messages)`` of ``rllab findings build [--check]``."""
    doc = Path(doc)
    if not doc.is_file():
        raise FindingsError(f"{doc}: no such findings page")
    if root and not (Path(root) / "benchmarks" / "suites").is_dir():
        raise FindingsError(f"--root {root}: no benchmarks/suites there; give the repository that holds the committed suite results")
    root = Path(root) if root else _repo_root(doc)
    old = doc.read_text()
    new = build(old, root)
    messages = lint(new, root)
    if check:
        if new != old:
            changed = [s.strip() for s, a, b in _blocks_changed(old, new)]
            messages.insert(0, f"{doc}: generated blocks out of date ({', '.join(changed) or 'layout'}); rebuild with: rllab findings build")
        return (1 if messages else 0), messages
    if new != old:
        doc.write_text(new)
        messages.insert(0, f"{doc}: rebuilt")
    return (1 if any(not m.endswith("rebuilt") for m in messages) else 0), messages


def _blocks_changed(old: str, new: str) -> list[tuple[str, str, str]]:
    a = {m.group("spec"): m.group("body") for m in BLOCK.finditer(old)}
    return [(m.group("spec"), a.get(m.group("spec"), ""), m.group("body")) for m in BLOCK.finditer(new) if a.get(m.group("spec")) != m.group("body")]


def _repo_root(doc: Path) -> Path:
    for d in [doc.resolve().parent, *doc.resolve().parents]:
        if (d / "benchmarks" / "suites").is_dir():
            return d
    raise FindingsError(f"{doc}: no benchmarks/suites above it; give --root")


def cmd_findings(args) -> int:
    """``rllab findings build [--check] [--doc PATH] [--root DIR]``."""
    try:
        code, messages = run(Path(args.doc), check=args.check, root=Path(args.root) if args.root else None)
    except FindingsError as e:
        print(f"rllab findings: {e}")
        return 2
    for m in messages:
        print(m)
    if code == 0:
        print(f"{args.doc}: every generated block matches the committed results" if args.check else f"{args.doc}: up to date")
    return code
