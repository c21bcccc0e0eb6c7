"""The live and results panes: every cell's state and curve while a suite runs, then
rllab_suite's statistics, sortable and exportable.
"""

from __future__ import annotations


from rich.markup import escape
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, RichLog, Sparkline, Static

from rllab_tui import state
from rllab_loggers import trace_panels
from rllab_suite import REPORT_COLUMNS, format_percent, format_probability, notes

from rllab_tui.widgets import LIVE_COLUMNS, STATUS_STYLE, _num


class LivePane(Vertical):
    BINDINGS = [
        Binding("s", "start", "start"), Binding("x", "stop", "stop"), Binding("r", "retry", "retry failed"),
        Binding("plus", "add_seed", "add seed"), Binding("l", "suite_log", "suite log"),
        Binding("v", "traces", "traces"),
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
        self.show_traces = False

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
                    table.update_cell(str(c.run_dir), col, val, update_width=True)
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
        if self.show_traces and c is not None:  # the cell's last traced step (the traces logger), as rllab traces shows it
            self._show_traces(c, log, force)
            return
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

    def _show_traces(self, c, log, force: bool) -> None:
        path = c.run_dir / "traces.jsonl"
        size = path.stat().st_size if path.is_file() else 0
        key = ("traces", id(c), size)
        if not force and getattr(self, "_log_key", None) == key:
            return
        self._log_key = key
        log.clear()
        try:
            panels = trace_panels(c.run_dir, limit=8)
        except Exception as e:  # noqa: BLE001  (a file being written, or not a traces file: say so, keep the TUI up)
            log.write(Text(f"cannot read {path}: {e}", "red"))
            return
        if not panels:
            log.write(Text(f"no traces for {c.name}: add the traces logger to the suite, "
                           f'e.g. loggers = ["jsonl", {{ name = "traces", per_step = 4 }}] in [overrides]', "yellow"))
        for p in panels:
            log.write(p)

    def action_traces(self) -> None:
        self.show_traces = not self.show_traces
        self.show_selected(self.app.suite, self.app.runner, force=True)

    def action_suite_log(self) -> None:
        self.show_log = not self.show_log
        self.show_selected(self.app.suite, self.app.runner, force=True)


class ResultsPane(Vertical):
    BINDINGS = [Binding("o", "sort", "sort"), Binding("O", "reverse", "reverse"), Binding("e", "export", "export")]
    COLUMNS = (("task", lambda r: r["task"]),) + tuple(REPORT_COLUMNS)

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
            t.add_row(o["variant"], str(o["runs"]), format_percent(o["iqm_final_accuracy"]),
                      "baseline" if o["variant"] == summary["baseline"] else format_probability(o["p_improvement"]))
        from rich.console import Group

        lines = [Text(n, "red" if n.startswith(("FAILED", "NO SIGNAL")) else "yellow" if n.startswith("IDENTICAL") else "dim")
                 for n in notes(summary, identical)]
        self.query_one("#res-overall", Static).update(Group(t, *lines))

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


