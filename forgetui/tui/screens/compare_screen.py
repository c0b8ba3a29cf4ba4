"""Two runs side by side, as `forgetui compare A B` prints them: the tasks that flipped, pass@k and pass^k and
every behaviour metric with B − A and its paired bootstrap interval (first here), and each task's passes and reward."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import ScrollableContainer
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, Static

from core.errors import ForgetuiError
from forgetui.tui.closing import dropped_once_closed
from forgetui.tui.rows import RunInfo
from forgetui.tui.widgets.key_footer import KeyFooter

FLIP_STYLES = {"fixed": "bold green", "broken": "bold red"}


def _side(d: dict[str, Any]) -> str:
    return f"{d['passed']}/{d['n']} ({d['reward']:.2f})"


def _delta_style(est: dict[str, Any]) -> str:
    """Green or red when the interval of B − A excludes 0, plain otherwise."""
    low, high = est.get("low"), est.get("high")
    if low is not None and low > 0:
        return "green"
    if high is not None and high < 0:
        return "red"
    return ""


def _estimates(title: str, first: str, rows: list[dict[str, Any]], narrow: bool = False) -> Table:
    """Metric, B − A with its interval, then A and B (narrow: their point values only, so B fits 80 columns)."""
    from core.analytics.metrics import (
        format_estimate,  # the analytics import on the worker, not at the TUI's start
    )
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column(first, max_width=26, overflow="ellipsis", no_wrap=True)
    # the difference first (what a comparison is for: on screen at 80 columns), then each side; an estimate
    # and its interval always on one line
    for name in ("B − A [95% CI]", "A", "B"):
        table.add_column(name, no_wrap=True, justify="right" if narrow and name in ("A", "B") else "left")

    def side(est: dict[str, Any]) -> str:
        return format_estimate(est) if not narrow else format_estimate(est).split(" [")[0]

    for row in rows:
        table.add_row(row.get("label") or row["metric"], Text(format_estimate(row["delta"]), style=_delta_style(row["delta"])),
                      side(row["a"]), side(row["b"]))
    return table


def comparison(result: dict[str, Any], a: RunInfo, b: RunInfo, narrow: bool = False) -> RenderableType:
    """`core.analytics.compare.compare_runs`' result as the screen shows it (narrow: A's and B's intervals left
    out, the per-task table's headers shortened, so run B fits 80 columns)."""
    head = Text()
    head.append("A ", style="bold magenta")
    head.append(f"{a.run_id}  {a.env} × {a.harness} × {a.model}\n")
    head.append("B ", style="bold cyan")
    head.append(f"{b.run_id}  {b.env} × {b.harness} × {b.model}\n")
    flipped = result["flipped"]
    head.append(f"\n{len(result['tasks'])} tasks in both runs · flipped {len(flipped)}: ", style="bold")
    for n, t in enumerate(flipped):
        head.append(", " if n else "")
        head.append(f"{t['task']} {t['flip']}", style=FLIP_STYLES.get(t["flip"], ""))
    if not flipped:
        head.append("none", style="dim")
    if result["only_a"] or result["only_b"]:
        head.append(f"\ntasks in one run only (left out): A {len(result['only_a'])}, B {len(result['only_b'])}", style="dim")
    headers = (("task", "A passed (reward)", "B passed (reward)", "Δ pass rate", "Δ reward", "flip") if not narrow
               else ("task", "A (reward)", "B (reward)", "Δ pass", "Δ rew", "flip"))
    tasks = Table(*headers, title="per task", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for t in result["tasks"]:
        tasks.add_row(t["task"], _side(t["a"]), _side(t["b"]), f"{t['delta_pass_rate']:+.2f}", f"{t['delta_reward']:+.2f}",
                      Text(t["flip"] or "", style=FLIP_STYLES.get(t["flip"] or "", "")))
    return Group(head, Text(""), _estimates("pass@k / pass^k over the tasks both ran", "metric", result["pass_k"], narrow),
                 _estimates("behaviour", "metric", result["metrics"], narrow), tasks)


class CompareScreen(Screen):
    """Run B against run A (A is the baseline); `s` swaps them."""

    class Compared(Message):
        """The comparison, rendered in full and narrow (the screen shows the one that fits)."""

        def __init__(self, shown: RenderableType, result: dict[str, Any] | None, narrow: RenderableType | None = None) -> None:
            super().__init__()
            self.shown = shown
            self.result = result
            self.narrow = narrow if narrow is not None else shown

    CSS_PATH = "compare_screen.tcss"
    AUTO_FOCUS = "#compare"
    BINDINGS = [Binding("escape", "app.pop_screen", "Back", key_display="esc/q"),
                Binding("q", "app.pop_screen", "Back", show=False), Binding("s", "swap", "Swap A/B"),
                Binding("w", "toggle_wide", "Wide/narrow")]

    def __init__(self, a: RunInfo, b: RunInfo) -> None:
        super().__init__()
        self.a, self.b = a, b
        self.result: dict[str, Any] | None = None
        self.shown: CompareScreen.Compared | None = None
        self.wide: bool | None = None  # None: whichever fits the screen; w forces the full form or the narrow one

    def compose(self) -> ComposeResult:
        yield Header()
        with ScrollableContainer(id="compare"):  # wider than 80 columns: ←/→ scroll it
            yield Static(Text("comparing…", style="dim"), id="compare-body")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.sub_title = f"compare {self.a.run_id} → {self.b.run_id}"
        self.compare()

    @work(thread=True, exclusive=True, group="compare", exit_on_error=False)
    def compare(self) -> None:
        from core.analytics.compare import compare_runs  # ~50 ms to import: when a comparison is asked for

        a, b = self.a, self.b
        try:
            result = compare_runs(a.path, b.path)
        except ForgetuiError as exc:
            self.post_message(self.Compared(Text(str(exc), style="bold red"), None))
        else:
            self.post_message(self.Compared(comparison(result, a, b), result, comparison(result, a, b, narrow=True)))

    @on(Compared)
    @dropped_once_closed
    def _compared(self, message: Compared) -> None:
        self.result = message.result
        self.shown = message
        self._show()

    def on_resize(self) -> None:
        self._show()

    def _show(self) -> None:
        """The full comparison where it fits (or w asked for it), else the narrow one; the pane scrolls sideways."""
        message = self.shown
        if message is None:
            return
        body = self.query_one("#compare-body", Static)
        console = self.app.console
        full = Measurement.get(console, console.options.update_width(400), message.shown).maximum
        room = self.query_one("#compare").scrollable_content_region.width or self.size.width
        wide = self.wide if self.wide is not None else full <= room
        shown = message.shown if wide else message.narrow
        # as wide as the tables want (an estimate and its interval on one line)
        body.styles.width = Measurement.get(console, console.options.update_width(400), shown).maximum
        body.update(shown)

    def action_toggle_wide(self) -> None:
        room = self.query_one("#compare").scrollable_content_region.width or self.size.width
        console = self.app.console
        fits = self.shown is not None and Measurement.get(console, console.options.update_width(400),
                                                          self.shown.shown).maximum <= room
        current = self.wide if self.wide is not None else fits
        self.wide = not current
        self._show()

    def action_swap(self) -> None:
        self.a, self.b = self.b, self.a
        self.sub_title = f"compare {self.a.run_id} → {self.b.run_id}"
        self.query_one("#compare-body", Static).update(Text("comparing…", style="dim"))
        self.compare()
