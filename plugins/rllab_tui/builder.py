"""The registry and grid-builder panes: browse components, run the contract suite on one, and
build a suite file (base preset, axes, seeds) validated as it is typed.
"""

from __future__ import annotations

import copy
from pathlib import Path

from rich.markup import escape
from rich.text import Text
from textual import on, work
from textual.worker import get_current_worker
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.suggester import SuggestFromList
from textual.widgets import DataTable, Input, Label, Static, Tree

from rllab import RllabError
from rllab_tui import state
from rllab.config import preset_names
from rllab.records.tomlio import dump_toml
from rllab_suite import expand, parse_suite


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
    return dump_toml({"x": v}).split("=", 1)[1].strip()


