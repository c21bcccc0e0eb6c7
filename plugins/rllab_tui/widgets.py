"""What the TUI's panes share: the help screen and the keys it lists, cell states' styles and
number formatting."""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


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


