"""The Textual application: registry, grid builder, live view and results, on four tabs.

Every screen is usable from the keyboard alone (``?`` lists the keys) and fits 80×24. What the
screens show is computed in :mod:`rllab_tui.state`; this module only lays it out and maps keys.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

from rich.markup import escape
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.worker import get_current_worker
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import DataTable, Footer, Input, Label, RichLog, Sparkline, Static, TabbedContent, TabPane, Tree

from rllab import Lab, RllabError
from rllab_tui import state
from rllab_tui.kernel import expand, parse_suite, preset_names, report

HELP = """\
[b]everywhere[/b]  1-4 switch tabs (F2-F5 in a text field) · ? or F1 help · t theme
            tab next field or table · esc close this help · q or ctrl+q quit
[b]registry[/b]    ↑↓ pick a component · c contract suite · r reload plugins
            a use the component as a grid axis
[b]grid[/b]        ⏎ in "axis" adds it · delete removes the axis under the cursor
            ctrl+s save · ctrl+o open "file" · ctrl+r save, open and run
[b]live[/b]        ↑↓ pick a cell · s start/resume · x stop · r retry failed cells
            + add a seed · l the suite process's log
[b]results[/b]     o sort by the next column · O reverse · e export report.md,
            summary.csv, runs.csv, curves.png and final.png

Quitting stops a running suite; its cells stay resumable:
rllab suite FILE --dir DIR (or rllab tui DIR, then s) goes on from there.
"""

STATUS_STYLE = {"queued": "dim", "running": "bold yellow", "stopped": "magenta", "done": "green", "failed": "bold red"}
LIVE_COLUMNS = ("state", "variant", "task", "seed", "step", "reward", "acc %", "curve")


def _num(v: float, pct: bool = False) -> str:
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return "—"
    return f"{100 * v:.1f}" if pct else f"{v:.3f}"


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,f1,q", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 80; max-width: 100%; height: auto; max-height: 100%; border: round $accent; background: $surface; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text.from_markup(HELP), id="help-text")


class RegistryPane(Horizontal):
    BINDINGS = [Binding("c", "contract", "contract"), Binding("r", "reload", "reload plugins"), Binding("a", "axis", "as axis")]

    def compose(self) -> ComposeResult:
        yield Tree("components", id="reg-tree")
        with Vertical(id="reg-right"):
            with VerticalScroll(id="reg-scroll"):
                yield Static("", id="reg-detail")
            yield DataTable(id="reg-contract", cursor_type="row", zebra_stripes=True)

    def fill(self, lab) -> None:
        tree = self.query_one(Tree)
        tree.clear()
        tree.root.expand()
        groups = state.registry(lab)
        for kind, specs in groups.items():
            node = tree.root.add(f"{kind} ({len(specs)})", data=None, expand=True)
            for spec in specs:
                node.add_leaf(spec.name, data=spec)
        total = sum(len(s) for s in groups.values())
        self.query_one("#reg-detail", Static).update(
            f"{total} components of {len(groups)} kinds from {len({s.provider for v in groups.values() for s in v})} plugins.\n\n"
            "Move with the arrows; c runs the contract suite on the highlighted component; r reloads the plugins "
            "(a freshly installed one appears); a adds it to the grid as an axis."
        )

    def selected(self):
        node = self.query_one(Tree).cursor_node
        return node.data if node is not None else None

    @on(Tree.NodeHighlighted)
    def _show(self, event: Tree.NodeHighlighted) -> None:
        spec = event.node.data
        if spec is not None:
            self.query_one("#reg-detail", Static).update(Text.from_markup(state.describe(spec)))
            self.query_one("#reg-scroll").scroll_home(animate=False)
            self.query_one("#reg-contract", DataTable).display = False

    def action_contract(self) -> None:
        spec = self.selected()
        if spec is None:
            self.app.notify("highlight a component first", severity="warning")
            return
        table = self.query_one("#reg-contract", DataTable)
        table.clear(columns=True)
        table.add_columns("check", "result", "message")
        table.add_row(f"running the contract suite on {spec.name}…", "", "")
        table.display = True
        self._contract(spec)

    @work(thread=True, exclusive=True, group="contract")
    def _contract(self, spec) -> None:
        from rllab.testing import run_contract

        try:
            results = run_contract(self.app.lab, spec.kind, spec.name)
        except Exception as e:  # a broken component is a result to show, not a crash
            results = [type("R", (), {"check": "run_contract", "passed": False, "skipped": False, "message": f"{type(e).__name__}: {e}"})()]
        self.app.call_from_thread(self._show_contract, spec, results)

    def _show_contract(self, spec, results) -> None:
        table = self.query_one("#reg-contract", DataTable)
        table.clear()
        for r in results:
            verdict = Text("skip", "yellow") if r.skipped else Text("pass", "green") if r.passed else Text("FAIL", "bold red")
            table.add_row(r.check, verdict, r.message)
        failed = sum(not r.passed for r in results)
        self.app.notify(f"{spec.name}: {len(results) - failed}/{len(results)} checks passed", severity="error" if failed else "information")

    def action_reload(self) -> None:
        self.app.reload_lab()

    def action_axis(self) -> None:
        spec = self.selected()
        section = state.SECTION_OF_KIND.get(spec.kind) if spec is not None else None
        if section is None:
            self.app.notify("highlight a component of a kind a config names", severity="warning")
            return
        self.app.show_tab("grid")
        field = self.app.main.query_one("#f-axis", Input)
        text = field.value.strip()
        key = text.split("=", 1)[0].strip() if "=" in text else ""
        field.value = f"{text}, {spec.name}" if key == section else f"{section} = {spec.name}"
        field.focus()


class GridPane(Horizontal):
    BINDINGS = [
        Binding("ctrl+s", "save", "save"), Binding("ctrl+o", "open", "open"), Binding("ctrl+r", "run", "run"),
        Binding("delete", "remove_axis", "remove axis", show=False),
    ]
    FIELDS = (("file", "suite file or directory"), ("name", ""), ("preset", ""), ("steps", ""), ("seeds", "0, 1, 2  or a count"),
              ("tasks", "addition, sort"), ("baseline", "a variant name"), ("overrides", "key=value …"), ("axis", "key = v1, v2  ⏎ adds it"))

    def compose(self) -> ComposeResult:
        with Vertical(id="grid-form"):
            for name, placeholder in self.FIELDS:
                with Horizontal(classes="row"):
                    yield Label(name, classes="field")
                    yield Input(placeholder=placeholder, id=f"f-{name}",
                                suggester=SuggestFromList(preset_names()) if name == "preset" else None)
            yield DataTable(id="grid-axes", cursor_type="row")
            yield Static("", id="grid-error")
        with VerticalScroll(id="grid-preview-box"):
            yield Static("", id="grid-preview")

    def on_mount(self) -> None:
        self.query_one("#grid-axes", DataTable).add_columns("axis", "values")

    def load(self, grid: state.Grid, file: Path | None) -> None:
        with self.prevent(Input.Changed):
            values = {"file": str(file or Path("suites") / f"{grid.name}.toml"), "name": grid.name, "preset": grid.preset,
                      "steps": str(grid.steps), "seeds": _seeds_text(grid.seeds),
                      "tasks": ", ".join(t if isinstance(t, str) else t["name"] for t in grid.tasks),
                      "baseline": grid.baseline or "", "overrides": " ".join(f"{k}={_toml(v)}" for k, v in grid.overrides.items()), "axis": ""}
            for k, v in values.items():
                self.query_one(f"#f-{k}", Input).value = v
        self.grid = grid
        self._axes_table()
        self.refresh_preview()

    def _axes_table(self) -> None:
        table = self.query_one("#grid-axes", DataTable)
        table.clear()
        for k, vals in self.grid.axes.items():
            table.add_row(k, ", ".join(map(_toml, vals)), key=k)
        if self.grid.variants:
            table.add_row("[variants]", ", ".join(self.grid.variants), key="[variants]")

    def read(self) -> state.Grid:
        """The grid as the fields say; a ValueError names the field that does not parse."""
        g = self.grid
        get = lambda k: self.query_one(f"#f-{k}", Input).value.strip()  # noqa: E731
        g.name = get("name") or "my_suite"
        g.preset = get("preset")
        if g.preset and g.preset not in preset_names():
            raise ValueError(f"preset: unknown preset {g.preset!r}; presets: {', '.join(preset_names())}")
        try:
            g.steps = int(get("steps"))
            if g.steps < 1:
                raise ValueError
        except ValueError:
            raise ValueError(f"steps: a positive integer, not {get('steps')!r}") from None
        text = get("seeds")
        try:
            if text.isdigit():  # a count: 3 → seeds 0, 1, 2
                g.seeds = list(range(int(text)))
            else:
                g.seeds = [int(s) for s in text.replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"seeds: a count or integers separated by commas, not {text!r}") from None
        if not g.seeds:
            raise ValueError("seeds: at least one seed")
        names = [t.strip() for t in get("tasks").split(",") if t.strip()]
        old = {(t if isinstance(t, str) else t["name"]): t for t in g.tasks}
        g.tasks = [old.get(n, n) for n in names]
        g.baseline = get("baseline") or None
        try:
            g.overrides = state.parse_pairs(get("overrides"))
        except ValueError as e:
            raise ValueError(f"overrides: {e}") from None
        return g

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        if event.input.id == "f-file":
            return
        if event.input.id == "f-name":  # a file named after the suite follows its name
            field = self.query_one("#f-file", Input)
            if field.value == str(Path("suites") / f"{self.grid.name}.toml"):
                field.value = str(Path("suites") / f"{event.value.strip() or 'my_suite'}.toml")
        self.refresh_preview()

    @on(Input.Submitted, "#f-axis")
    def _add_axis(self, event: Input.Submitted) -> None:
        try:
            g = self.read()
            key, values = state.parse_axis(event.value)
        except ValueError as e:
            self._error(str(e))
            return
        problems = state.check_axis(self.app.lab, g, key, values)
        if problems:
            self._error("\n".join(problems))
            return
        g.axes[key] = values
        event.input.value = ""
        self._axes_table()
        self.refresh_preview()

    def action_remove_axis(self) -> None:
        table = self.query_one("#grid-axes", DataTable)
        if not table.has_focus or not table.row_count:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if key == "[variants]":
            self.grid.variants = {}
        else:
            self.grid.axes.pop(key, None)
        self._axes_table()
        self.refresh_preview()

    def _error(self, text: str) -> None:
        self.query_one("#grid-error", Static).update(Text(text, "bold red") if text else "")

    def refresh_preview(self) -> None:
        try:
            g = self.read()
        except ValueError as e:
            self._error(str(e))
            return
        self._preview(copy.deepcopy(g), g.to_dict(), self.query_one("#f-axis", Input).value.strip(), self.app.run_workers)

    @work(thread=True, exclusive=True, group="preview")
    def _preview(self, g: state.Grid, data: dict, axis: str, workers: int | None) -> None:
        """Validate the axis being typed, then expand the grid and estimate its time (off the UI thread)."""
        worker = get_current_worker()

        def post(fn, *args):  # a newer keystroke's check has the last word
            if not worker.is_cancelled:
                self.app.call_from_thread(fn, *args)

        if axis:
            try:
                key, values = state.parse_axis(axis)
                problems = state.check_axis(self.app.lab, g, key, values)
            except ValueError as e:
                problems = [str(e)]
            if problems:
                post(self._error, "\n".join(problems))
                return
        post(self._error, "")
        try:
            cells = expand(parse_suite(data), lab=self.app.lab)
        except RllabError as e:
            post(self._error, str(e))
            post(self.query_one("#grid-preview", Static).update, Text("no cells: fix the grid", "red"))
            return
        dirs = [Path("suites"), Path("runs")] + ([self.app.suite.directory] if self.app.suite else [])
        per_step, n_runs = state.step_seconds(*dirs)
        n = max(1, min(workers or state.workers_default(), len(cells)))
        eta = state.estimate_seconds(len(cells), data["steps"], per_step, n)
        variants = list(dict.fromkeys(c.variant for c in cells))
        tasks = list(dict.fromkeys(c.task for c in cells))
        seeds = sorted({c.seed for c in cells})
        lines = [
            f"[b]{len(cells)} cells[/b] ≈ {state.fmt_seconds(eta)} on {n} worker(s)",
            f"{len(variants)} variants × {len(tasks)} tasks × {len(seeds)} seeds",
            f"[dim]{per_step:.3f} s/step: " + (f"median of {n_runs} runs" if n_runs else "a default (no run measured)") + "[/dim]",
            "", "[b]variants[/b]",
        ] + [f"  {escape(v)}" for v in variants[:40]] + (["  …"] if len(variants) > 40 else [])
        post(self.query_one("#grid-preview", Static).update, Text.from_markup("\n".join(lines)))

    def _file(self) -> Path:
        return Path(self.query_one("#f-file", Input).value.strip() or f"suites/{self.grid.name}.toml")

    def action_save(self) -> Path | None:
        try:
            g = self.read()
            expand(parse_suite(g.to_dict()), lab=self.app.lab)
        except (ValueError, RllabError) as e:
            self._error(str(e))
            self.app.notify("not saved: the grid does not validate", severity="error")
            return None
        path = self._file()
        if path.is_dir() or not path.suffix:
            path = path / "suite.toml" if (path / "suite.toml").is_file() else path.with_suffix(".toml")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(g.to_toml())
        self.app.notify(f"saved {path}")
        return path

    def action_open(self) -> None:
        self.app.open_target(self._file())

    def action_run(self) -> None:
        path = self.action_save()
        if path is not None:
            self.app.open_target(path, directory=None, start=True)


def _seeds_text(seeds: list) -> str:
    if seeds == list(range(len(seeds))) and seeds:
        return str(len(seeds))
    return ", ".join(map(str, seeds)) + ("," if len(seeds) == 1 else "")


def _toml(v) -> str:
    from rllab_tui.kernel import dump_toml

    return dump_toml({"x": v}).split("=", 1)[1].strip()


class LivePane(Vertical):
    BINDINGS = [
        Binding("s", "start", "start"), Binding("x", "stop", "stop"), Binding("r", "retry", "retry failed"),
        Binding("plus", "add_seed", "add seed"), Binding("l", "suite_log", "suite log"),
    ]

    def compose(self) -> ComposeResult:
        yield Static("no suite open: build one in the grid (ctrl+r) or open one (rllab tui SUITE)", id="live-progress")
        yield DataTable(id="live-cells", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="live-detail"):
            with Vertical(id="live-left"):
                yield Static("", id="live-metrics")
                yield Sparkline([], id="live-spark")
            yield RichLog(id="live-log", wrap=False, max_lines=400)

    def on_mount(self) -> None:
        table = self.query_one("#live-cells", DataTable)
        for c in LIVE_COLUMNS:
            table.add_column(c, key=c)
        self.show_log = False

    def show(self, suite, runner) -> None:
        table = self.query_one("#live-cells", DataTable)
        if suite is None:
            return
        keys = [str(c.run_dir) for c in suite.cells]
        if [k.value for k in table.rows] != keys:
            row = table.cursor_row
            table.clear()
            for c in suite.cells:
                table.add_row(*self._cells(c), key=str(c.run_dir))
            if table.row_count:
                table.move_cursor(row=min(row, table.row_count - 1))
        else:
            for c in suite.cells:
                for col, val in zip(LIVE_COLUMNS, self._cells(c)):
                    table.update_cell(str(c.run_dir), col, val)
        counts = suite.counts()
        frac, left = suite.progress(self.app.run_workers or state.workers_default())
        width = 20
        bar = "█" * int(frac * width) + "░" * (width - int(frac * width))
        run = "running" if runner is not None and runner.running else "stopped" if any(counts[s] for s in ("queued", "stopped", "running")) else "finished"
        parts = [f"[b]{escape(suite.name)}[/b] {bar} {100 * frac:3.0f}%", f"done {counts['done']}/{len(suite.cells)}"]
        if counts["running"]:
            parts.append(f"[yellow]running {counts['running']}[/]")
        if counts["failed"]:
            parts.append(f"[red]failed {counts['failed']}[/]")
        if run == "running":
            parts.append(f"ETA {state.fmt_seconds(left)}")
        else:
            parts.append(f"[dim]{run}[/]")
        self.query_one("#live-progress", Static).update(Text.from_markup("  ".join(parts)))
        self.show_selected(suite, runner)

    def _cells(self, c: state.CellView):
        step = f"{c.step}/{c.total}" if c.total else str(c.step)
        return (Text(c.status, STATUS_STYLE[c.status]), c.variant, c.task, str(c.seed), step, _num(c.reward), _num(c.accuracy, pct=True),
                state.sparkline(c.accuracies))

    def selected(self, suite):
        table = self.query_one("#live-cells", DataTable)
        if suite is None or not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((c for c in suite.cells if str(c.run_dir) == key), None)

    @on(DataTable.RowHighlighted, "#live-cells")
    def _highlighted(self, event) -> None:
        self.show_selected(self.app.suite, self.app.runner, force=True)

    def show_selected(self, suite, runner, force: bool = False) -> None:
        log = self.query_one("#live-log", RichLog)
        if self.show_log and runner is not None:
            lines = runner.log_tail(200)
            metrics = "[b]suite process[/b]\n" + escape(" ".join(runner.command()[3:])) if runner.suite.file else ""
            c = None
        else:
            c = self.selected(suite)
            if c is None:
                return
            lines = c.log_tail()
            m = c.last
            rows = [f"[b]{escape(c.name)}[/b]", f"{c.status}  step {c.step}/{c.total or '?'}"]
            for key in ("rollout/reward", "eval/accuracy", "loss/policy", "actor/entropy", "actor/clipfrac", "actor/approx_kl", "time/step"):
                val = c.accuracy if key == "eval/accuracy" else m.get(key)
                if val is not None:
                    rows.append(f"{key:<16} {_num(val)}")
            if c.error:
                rows.append(f"[red]{escape(c.error)}[/]")
            metrics = "\n".join(rows)
            self.query_one("#live-spark", Sparkline).data = c.rewards[-60:] or [0.0]
        self.query_one("#live-metrics", Static).update(Text.from_markup(metrics))
        key = (id(c), len(lines), lines[-1] if lines else "")
        if force or getattr(self, "_log_key", None) != key:
            self._log_key = key
            log.clear()
            for line in lines:
                log.write(Text(line))

    def action_start(self) -> None:
        self.app.start_suite()

    def action_stop(self) -> None:
        self.app.stop_suite()

    def action_retry(self) -> None:
        suite = self.app.suite
        if suite is None:
            return
        failed = [c for c in suite.cells if c.status == "failed"]
        if not failed:
            self.app.notify("no failed cell to retry")
            return
        self.app.notify(f"retrying {len(failed)} failed cell(s)")
        self.app.start_suite(restart=True)

    def action_add_seed(self) -> None:
        self.app.add_seed()

    def action_suite_log(self) -> None:
        self.show_log = not self.show_log
        self.show_selected(self.app.suite, self.app.runner, force=True)


class ResultsPane(Vertical):
    BINDINGS = [Binding("o", "sort", "sort"), Binding("O", "reverse", "reverse"), Binding("e", "export", "export")]
    COLUMNS = (("task", lambda r: r["task"]),) + tuple(report.COLUMNS)

    def compose(self) -> ComposeResult:
        yield Static("no results yet", id="res-head")
        yield DataTable(id="res-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="res-overall-box"):
            yield Static("", id="res-overall")

    def on_mount(self) -> None:
        self.sort_col, self.reverse, self.summary = 0, False, None
        table = self.query_one("#res-table", DataTable)
        for name, _ in self.COLUMNS:
            table.add_column(name, key=name)

    def show(self, summary: dict | None, identical: list) -> None:
        self.summary, self.identical = summary, identical
        if summary is None:
            return
        table = self.query_one("#res-table", DataTable)
        table.clear()
        name, fn = self.COLUMNS[self.sort_col]
        rows = sorted(summary["rows"], key=lambda r: _sort_key(fn(r)), reverse=self.reverse)
        for r in rows:
            table.add_row(*[fn(r) for _, fn in self.COLUMNS])
        self.query_one("#res-head", Static).update(Text.from_markup(
            f"sorted by [b]{escape(name)}[/b] {'↓' if self.reverse else '↑'} · {len(summary['rows'])} rows · mean over seeds, "
            f"{int(100 * summary['confidence'])}% bootstrap CI"
        ))
        t = Table(title="over tasks: final accuracy", expand=False, title_justify="left")
        for col in ("variant", "runs", "IQM % [95% CI]", f"P(> {summary['baseline']})" if summary["baseline"] else "P(improvement)"):
            t.add_column(col, justify="left" if col == "variant" else "right")
        for o in summary["overall"]:
            t.add_row(o["variant"], str(o["runs"]), report._pct(o["iqm_final_accuracy"]),
                      "baseline" if o["variant"] == summary["baseline"] else report._prob(o["p_improvement"]))
        from rich.console import Group

        notes = [Text(n, "red" if n.startswith(("FAILED", "NO SIGNAL")) else "yellow" if n.startswith("IDENTICAL") else "dim")
                 for n in report.notes(summary, identical)]
        self.query_one("#res-overall", Static).update(Group(t, *notes))

    def action_sort(self) -> None:
        self.sort_col = (self.sort_col + 1) % len(self.COLUMNS)
        self.show(self.summary, self.identical)

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self.show(self.summary, self.identical)

    def action_export(self) -> None:
        if self.app.suite is None:
            self.app.notify("no suite open", severity="warning")
            return
        self.app.notify("exporting the report…")
        self._export()

    @work(thread=True, exclusive=True, group="export")
    def _export(self) -> None:
        suite = self.app.suite
        try:
            suite.export()
        except Exception as e:
            self.app.call_from_thread(self.app.notify, f"export failed: {type(e).__name__}: {e}", severity="error")
            return
        made = [n for n in ("report.md", "summary.csv", "runs.csv", "curves.png", "final.png") if (suite.directory / n).is_file()]
        self.app.call_from_thread(self.app.notify, f"wrote {', '.join(made)} to {suite.directory}")


def _sort_key(text: str):
    head = text.split(" ", 1)[0]
    try:
        return (0, float(head), "")
    except ValueError:
        return (1 if head != "—" else 2, 0.0, text)


class SuiteApp(App):
    """``rllab tui``: registry · grid · live · results."""

    TITLE = "rllab tui"
    CSS = """
    Screen { layout: vertical; }
    TabbedContent, ContentSwitcher, TabPane { height: 1fr; }
    TabPane { padding: 0; }
    #reg-tree { width: 34; border-right: solid $primary 30%; }
    #reg-scroll { height: 1fr; padding: 0 1; }
    #reg-contract { height: auto; max-height: 10; display: none; }
    #grid-form { width: 1fr; }
    .row { height: 1; }
    .row Label.field { width: 10; padding: 0 1 0 0; text-align: right; color: $text-muted; }
    .row Input { height: 1; border: none; padding: 0 1; width: 1fr; background: $boost; }
    .row Input:focus { border: none; background: $primary 25%; }
    #grid-axes { height: 5; margin-top: 1; }
    #grid-error { height: auto; max-height: 6; }
    #grid-preview-box { width: 34; border-left: solid $primary 30%; padding: 0 1; }
    #live-progress { height: 1; padding: 0 1; }
    #live-cells { height: 1fr; }
    #live-detail { height: 8; border-top: solid $primary 30%; }
    #live-left { width: 36; padding: 0 1; }
    #live-metrics { height: 1fr; }
    #live-spark { height: 1; }
    #live-log { width: 1fr; }
    #res-head { height: 1; padding: 0 1; }
    #res-table { height: 1fr; }
    #res-overall-box { height: auto; max-height: 9; border-top: solid $primary 30%; }
    """
    BINDINGS = [
        Binding("question_mark,f1", "help", "help"),
        Binding("q,ctrl+q", "quit", "quit"),
        Binding("t", "toggle_theme", "theme", show=False),
        Binding("1,f2", "tab('registry')", "registry", show=False),
        Binding("2,f3", "tab('grid')", "grid", show=False),
        Binding("3,f4", "tab('live')", "live", show=False),
        Binding("4,f5", "tab('results')", "results", show=False),
    ]
    TABS = ("registry", "grid", "live", "results")

    def __init__(self, *, lab=None, plugins: list[str] = (), target: Path | None = None, directory: str | None = None,
                 workers: int | None = None, identical_check: bool = True, theme_name: str = "dark", poll: float = 1.0):
        super().__init__()
        self.lab = lab or Lab(plugins=list(plugins))
        self.plugins, self.run_workers, self.identical_check, self.poll = list(plugins), workers, identical_check, poll
        self.target, self.directory = target, directory
        self.suite: state.SuiteDir | None = None
        self.runner: state.Runner | None = None
        self.restart_pending = False
        self._was_running = False
        self._theme_name = "textual-light" if theme_name == "light" else "textual-dark"

    def compose(self) -> ComposeResult:
        with TabbedContent(initial="registry", id="tabs"):
            with TabPane("1 registry", id="registry"):
                yield RegistryPane()
            with TabPane("2 grid", id="grid"):
                yield GridPane()
            with TabPane("3 live", id="live"):
                yield LivePane()
            with TabPane("4 results", id="results"):
                yield ResultsPane()
        yield Footer()

    @property
    def main(self):
        """The screen with the tabs (``query_one`` on the app searches the help screen when it is open)."""
        return self.screen_stack[0]

    def on_mount(self) -> None:
        self.theme = self._theme_name
        self.main.query_one(RegistryPane).fill(self.lab)
        self.main.query_one(GridPane).load(state.Grid(), None)
        if self.target is not None:
            self.open_target(self.target, directory=self.directory)
        else:
            self.show_tab("registry")
        self.set_interval(self.poll, self.tick)

    # ------------------------------------------------------------------ navigation

    def show_tab(self, tab: str) -> None:
        self.main.query_one(TabbedContent).active = tab
        focus = {"registry": "#reg-tree", "grid": "#f-name", "live": "#live-cells", "results": "#res-table"}[tab]
        self.call_after_refresh(self.main.query_one(focus).focus)

    def action_tab(self, tab: str) -> None:
        self.show_tab(tab)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"

    async def action_quit(self) -> None:
        if self.runner is not None and self.runner.running:
            self.notify("stopping the suite (it resumes with rllab suite)…")
            self.runner.stop()
        self.exit()

    def reload_lab(self) -> None:
        try:
            self.lab = Lab(plugins=self.plugins)
        except RllabError as e:
            self.notify(str(e), severity="error")
            return
        self.main.query_one(RegistryPane).fill(self.lab)
        self.notify(f"plugins reloaded: {len(self.lab.specs())} components")

    # ------------------------------------------------------------------ suites

    def open_target(self, target: Path, *, directory=None, start: bool = False) -> None:
        target = Path(target)
        if self.runner is not None and self.runner.running:
            self.notify("stop the running suite first (x in the live view)", severity="warning")
            return
        try:
            if target.is_dir():
                suite = state.SuiteDir(self.lab, directory=target)
            else:
                suite = state.SuiteDir(self.lab, file=target, directory=directory)
        except (RllabError, OSError) as e:
            self.notify(str(e), severity="error", timeout=10)
            if target.is_file():
                self._load_grid(target)
                self.show_tab("grid")
            return
        self.suite = suite
        self.runner = state.Runner(suite, workers=self.run_workers, plugins=self.plugins, identical_check=self.identical_check)
        if suite.file is not None:
            self._load_grid(suite.file)
        self.refresh_views(results=True)
        self.show_tab("live")
        self.notify(f"opened {suite.name}: {len(suite.cells)} cells in {suite.directory}")
        if start:
            self.start_suite()

    def _load_grid(self, path: Path) -> None:
        try:
            self.main.query_one(GridPane).load(state.Grid.from_file(path), path)
        except (RllabError, OSError) as e:
            self.notify(str(e), severity="error")

    def start_suite(self, restart: bool = False) -> None:
        if self.runner is None:
            self.notify("no suite open", severity="warning")
            return
        if self.runner.running:
            self.restart_pending = restart
            self.notify("the suite is running" + ("; it runs again when this pass ends" if restart else ""))
            return
        try:
            self.runner.start()
        except RllabError as e:
            self.notify(str(e), severity="error")
            return
        self._was_running = True
        self.notify(f"suite started: {len(self.suite.cells)} cells → {self.suite.directory}")
        self.refresh_views()

    def stop_suite(self) -> None:
        if self.runner is None or not self.runner.running:
            self.notify("the suite is not running")
            return
        self.runner.stop()
        self.restart_pending = False
        self.notify("suite stopped; s resumes it (so does rllab suite)")
        self.refresh_views()

    def add_seed(self) -> None:
        if self.suite is None:
            return
        try:
            seeds = self.suite.add_seeds(1)
        except RllabError as e:
            self.notify(str(e), severity="error")
            return
        self._load_grid(self.suite.file)
        self.notify(f"seeds now {seeds}; the new cells run on the next start" + (" (queued after this pass)" if self.runner.running else ""))
        if self.runner.running:
            self.restart_pending = True
        self.refresh_views(results=True)

    def tick(self) -> None:
        if self.suite is None:
            return
        running = self.runner is not None and self.runner.running
        if self._was_running and not running:
            code = self.runner.returncode
            self.notify(f"suite process ended (exit {code})", severity="information" if code == 0 else "warning")
            if self.restart_pending:
                self.restart_pending = False
                self.start_suite()
                running = True
        self._was_running = running
        try:
            self.refresh_views()
        except NoMatches:  # the app is closing: its widgets are being removed
            pass

    def refresh_views(self, results: bool = False) -> None:
        if self.suite is None or not self.main.is_attached:
            return
        running = self.runner is not None and self.runner.running
        changed = self.suite.refresh(running)
        self.main.query_one(LivePane).show(self.suite, self.runner)
        if changed or results:
            self._results(self.suite)

    @work(thread=True, exclusive=True, group="results")
    def _results(self, suite) -> None:
        try:
            summary, identical = suite.summary(), suite.identical()
        except Exception as e:
            self.call_from_thread(self.notify, f"statistics failed: {type(e).__name__}: {e}", severity="error")
            return
        self.call_from_thread(self.main.query_one(ResultsPane).show, summary, identical)
