"""A run's rollouts (status, task, sample, step, reward, calls, tokens, duration, error); Enter opens one.

Drawn line by line (Textual's line API): each visible row is one strip of plain segments, so a run of
10,000 rollouts costs only the rows on screen. A DataTable rendered every visible cell through Rich's
console pipeline, again after any change, and measured every row it held; on the Run screen that was
the largest share of the TUI benchmark's worst stall.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from forgetui.tui.messages import RolloutOpened
from forgetui.tui.run_data import ROLLOUT_LINE_COLUMNS, RolloutLine, RunSource
from forgetui.tui.widgets.rollouts_table import styled

MAX_WIDTH = {"task": 40, "error": 80}  # a column is as wide as its widest cell, these at most
WIDTH_SAMPLE = 2000  # rows whose cells size the columns (the first and last ones): widths need no pass over 10,000 rows
GAP = 2


class RolloutLines(ScrollView, can_focus=True):
    """The rollouts of a run, a header line on top; `show_lines` keeps the cursor on the same row."""

    BORDER_TITLE = "Rollouts"
    BINDINGS: ClassVar[list[Any]] = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home,ctrl+home", "to_start", "First", show=False),
        Binding("end,ctrl+end", "to_end", "Last", show=False),
        Binding("enter", "open", "Open", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {"rollout-lines--header", "rollout-lines--cursor", "rollout-lines--even"}
    DEFAULT_CSS = """
    RolloutLines {
        background: $surface;
        color: $foreground;
        & > .rollout-lines--header { text-style: bold; background: $panel; color: $foreground; }
        & > .rollout-lines--even { background: $surface-lighten-1 50%; }
        & > .rollout-lines--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        &:focus > .rollout-lines--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
        &:dark > .rollout-lines--even { background: $surface-darken-1 40%; }
    }
    """

    cursor = reactive(0, init=False)

    def __init__(self, source: RunSource, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source
        self.lines: list[RolloutLine] = []
        self.widths = {name: len(name) for name in ROLLOUT_LINE_COLUMNS}
        self._cells: dict[int, list[tuple[str, Style | None]]] = {}  # row → its cells, for the rows drawn so far

    # -- what callers read
    @property
    def total(self) -> int:
        return len(self.lines)

    @property
    def row_count(self) -> int:
        return len(self.lines)

    @property
    def absolute_row(self) -> int:
        """The cursor's row in the whole list."""
        return self.cursor

    def row_cells(self, index: int) -> list[str]:
        """The texts row `index` shows, one per column."""
        return [text for text, _ in self._row_cells(index)]

    # -- data
    def show_lines(self, lines: list[RolloutLine]) -> None:
        """Show `lines`; the cursor stays on the same row number (clamped), the columns widen to fit."""
        self.lines = list(lines)
        self._cells.clear()
        sample = self.lines[:WIDTH_SAMPLE] + self.lines[-WIDTH_SAMPLE:] if len(self.lines) > 2 * WIDTH_SAMPLE else self.lines
        for line in sample:
            for name, value in line.cells().items():
                if len(value) > self.widths[name]:
                    self.widths[name] = min(len(value), MAX_WIDTH.get(name, 1000))
        width = sum(self.widths.values()) + GAP * len(self.widths)
        self.virtual_size = Size(width, len(self.lines) + 1)
        self.cursor = max(0, min(self.cursor, len(self.lines) - 1))
        self.border_subtitle = f"{len(self.lines)} rollouts · Enter opens one"
        self.refresh()

    def _row_cells(self, index: int) -> list[tuple[str, Style | None]]:
        cells = self._cells.get(index)
        if cells is None:
            line = self.lines[index]
            values = line.cells()
            cells = []
            for name in ROLLOUT_LINE_COLUMNS:
                cell = styled(name, values[name], line)
                if isinstance(cell, Text):
                    style = cell.style if isinstance(cell.style, Style) else Style.parse(cell.style) if cell.style else None
                    cells.append((cell.plain, style))
                else:
                    cells.append((cell, None))
            self._cells[index] = cells
        return cells

    # -- drawing
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        if y == 0:
            base = self.get_component_rich_style("rollout-lines--header")
            cells = [(name, None) for name in ROLLOUT_LINE_COLUMNS]
        else:
            index = scroll_y + y - 1
            if index >= len(self.lines):
                return Strip.blank(width, self.rich_style)
            base = self.rich_style
            if index == self.cursor:
                base = base + self.get_component_rich_style("rollout-lines--cursor")
            elif index % 2:
                base = base + self.get_component_rich_style("rollout-lines--even")
            cells = self._row_cells(index)
        segments = [Segment(" ", base)]
        for (text, style), name in zip(cells, ROLLOUT_LINE_COLUMNS, strict=True):
            size = self.widths[name]
            shown = text if len(text) <= size else text[: size - 1] + "…"
            segments.append(Segment(shown.ljust(size + GAP), base + style if style is not None else base))
        return Strip(segments).crop(scroll_x, scroll_x + width).extend_cell_length(width, base)

    def watch_cursor(self, old: int, new: int) -> None:
        self._refresh_row(old)
        self._refresh_row(new)
        self._scroll_to_cursor()

    def _refresh_row(self, index: int) -> None:
        y = index - self.scroll_offset.y + 1
        if 1 <= y < self.size.height:
            self.refresh_line(y)

    def _scroll_to_cursor(self) -> None:
        rows = max(1, self.scrollable_content_region.height - 1)  # below the header
        top = self.scroll_offset.y
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, immediate=True)
        elif self.cursor >= top + rows:
            self.scroll_to(y=self.cursor - rows + 1, animate=False, immediate=True)

    # -- keys and mouse
    def action_cursor(self, delta: int) -> None:
        if self.lines:
            self.cursor = max(0, min(self.cursor + delta, len(self.lines) - 1))

    def action_page(self, direction: int) -> None:
        self.action_cursor(direction * max(1, self.scrollable_content_region.height - 2))

    def action_to_start(self) -> None:
        self.action_cursor(-len(self.lines))

    def action_to_end(self) -> None:
        self.action_cursor(len(self.lines))

    def action_open(self) -> None:
        if 0 <= self.cursor < len(self.lines):
            self.post_message(RolloutOpened(self.source, self.lines[self.cursor].rollout_id))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)  # inside the border and padding; None on them
        if offset is None:
            return
        index = self.scroll_offset.y + offset.y - 1
        if offset.y >= 1 and 0 <= index < len(self.lines):
            if index == self.cursor:  # a click on the highlighted row opens it, as in the other tables
                self.action_open()
            self.cursor = index
