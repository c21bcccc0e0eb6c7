"""The Textual application: registry, grid builder, live view and results, on four tabs.

Every screen is usable from the keyboard alone (``?`` lists the keys) and fits 80×24. What the
screens show is computed in :mod:`rllab_tui.state`; the panes lay it out and map keys
(:mod:`rllab_tui.builder`: registry and grid; :mod:`rllab_tui.progress`: live and results;
:mod:`rllab_tui.widgets`: what they share); this module ties them into one app.
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widgets import Footer, TabbedContent, TabPane

from rllab import Lab, RllabError
from rllab_tui import state

from rllab_tui.builder import GridPane, RegistryPane
from rllab_tui.progress import LivePane, ResultsPane
from rllab_tui.widgets import HelpScreen


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
        # the grid opens on its axes table, not a text field: a digit typed next switches tabs
        # instead of renaming the suite
        focus = {"registry": "#reg-tree", "grid": "#grid-axes", "live": "#live-cells", "results": "#res-table"}[tab]
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
        if self.suite is None or not self.screen_stack or not self.main.is_attached:  # no screen: the app is closing
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
