"""A table drawn line by line (Textual's line API), the base of the Runs, Rollouts and Calls tables.

Each visible row is one strip of plain segments, so a list of 10,000 rows costs only the rows on screen (a
DataTable rendered every visible cell through Rich's console pipeline, again after any change, and measured
every row it held). Column widths are computed afresh on every refresh and resize: each column as wide as
its widest cell (up to its cap), then the columns marked `shrink` give up width, their cells cut with "…",
until the table fits the screen — the columns before them (scores, statuses) stay on screen at 80 columns.
`/` filters the rows (any column, every word); the cursor stays on the same row through refreshes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

GAP = 2
WIDTH_SAMPLE = 500  # rows whose cells size the columns (the first and last ones), measured on the event loop: 2 × 2,000 took 50-140 ms of CPU there

Cell = tuple[str, Style | None]


@dataclass(frozen=True)
class Column:
    """A column: its header, its widest (`max_width`), and whether it shrinks to fit (never under `min_width`);
    `short`: the header where the table does not fit (a count's header must not take a name's width)."""

    name: str
    max_width: int = 40
    shrink: bool = False
    min_width: int = 6
    short: str | None = None


def fit_widths(natural: list[int], columns: Sequence[Column], room: int) -> list[int]:
    """Widths that fit `room` cells (gaps included): the widest shrinkable column gives up a cell at a time."""
    widths = list(natural)
    excess = sum(widths) + GAP * len(widths) + 1 - room
    while excess > 0:
        candidates = [i for i, c in enumerate(columns) if c.shrink and widths[i] > min(c.min_width, natural[i])]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return widths


def cut(text: str, width: int) -> str:
    """`text` in `width` cells: cut with an ellipsis when longer."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


class _RowMessage(Message):
    """A LineTable's message about one of its rows."""

    def __init__(self, table: LineTable, row: Any | None) -> None:
        super().__init__()
        self.table = table
        self.row = row

    @property
    def control(self) -> LineTable:
        return self.table


class LineTable(ScrollView, can_focus=True, inherit_bindings=False):
    """Rows of any kind: subclasses say each row's key and cells; `set_rows` keeps the cursor on its row.

    ←/→ are not bound here (the table fits the screen): they reach the screen, which switches tabs with them."""

    class Highlighted(_RowMessage):
        """The cursor moved to `row` (None: the table is empty)."""

    class Selected(_RowMessage):
        """Enter (or a click on the cursor's row) on `row`."""

    BINDINGS: ClassVar[list[Any]] = [
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("w", "toggle_wide", "Wide/narrow", show=False),
        Binding("shift+right,greater_than_sign", "sideways(1)", "Scroll right", show=False),
        Binding("shift+left,less_than_sign", "sideways(-1)", "Scroll left", show=False),
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home,ctrl+home", "to_start", "First", show=False),
        Binding("end,ctrl+end", "to_end", "Last", show=False),
        Binding("enter", "select", "Open", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {"line-table--header", "line-table--cursor", "line-table--even",
                                             "line-table--empty"}
    DEFAULT_CSS = """
    LineTable {
        border: round $primary-darken-1;
        height: 1fr;
        min-height: 4;
        background: $surface;
        color: $foreground;
        &:focus { border: round $accent; }
        & > .line-table--header { text-style: bold; background: $panel; color: $foreground; }
        & > .line-table--even { background: $surface-lighten-1 50%; }
        & > .line-table--empty { color: $text-muted; }
        & > .line-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        &:focus > .line-table--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
        &:dark > .line-table--even { background: $surface-darken-1 40%; }
    }
    """
    COLUMNS: ClassVar[tuple[Column, ...]] = ()
    NOUN = "rows"  # what the subtitle counts
    EMPTY = "nothing here yet"

    cursor = reactive(0, init=False)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.columns: tuple[Column, ...] = self.COLUMNS
        self.rows: list[Any] = []
        self.shown: list[Any] = []
        self.filter_text = ""
        self.empty_text = self.EMPTY
        self.natural = [len(c.name) for c in self.columns]
        self.widths = list(self.natural)
        self.content_widths = [0] * len(self.columns)  # the widest cell of each column (capped), headers aside
        self.headers = [c.name for c in self.columns]  # the header shown: a column's short one when it does not fit
        self.wide = False  # every column at its natural width (the table scrolls sideways) instead of fitted
        self._cells: dict[int, list[Cell]] = {}  # shown index → its cells, for the rows drawn so far
        self._search: list[str] | None = None  # each row's text the filter looks in, built on the first filter
        self._follow: tuple[Callable[[Any], bool], Callable[[Any], bool]] | None = None  # see follow()
        self._announced: str | None = None  # row_key of the row the last Highlighted message carried

    # -- what subclasses give
    def row_key(self, row: Any) -> str:
        raise NotImplementedError

    def cells_of(self, row: Any) -> list[Cell]:
        """The row's cells (text, style), one per column."""
        raise NotImplementedError

    def subtitle(self) -> str:
        """The border's subtitle: how many rows, the filter, what Enter does."""
        counted = f"{len(self.shown)}/{len(self.rows)}" if self.filter_text else f"{len(self.rows)}"
        text = f"{counted} {self.NOUN}" + (f" · filter “{self.filter_text}”" if self.filter_text else "")
        if self.wide:
            text += " · wide (w: fit; shift+←/→ scroll)"
        elif self.virtual_size.width > (self.scrollable_content_region.width or 10**6) or self.widths != self.natural:
            text += " · w: wide"
        return text

    # -- what callers read
    @property
    def row_count(self) -> int:
        return len(self.shown)

    @property
    def total(self) -> int:
        return len(self.rows)

    @property
    def absolute_row(self) -> int:
        return self.cursor

    @property
    def selected(self) -> Any | None:
        return self.shown[self.cursor] if 0 <= self.cursor < len(self.shown) else None

    def row_cells(self, index: int) -> list[str]:
        """The texts shown row `index` has, one per column (uncut)."""
        return [cell for cell, _ in self._row(index)]

    # -- data
    def follow_row(self, wanted: Callable[[Any], bool], until: Callable[[Any], bool] = lambda row: True) -> None:
        """Move the cursor to the first row `wanted` says yes to, now or in a later `set_rows` (a run that does not
        exist yet); keep following it until `until(row)` holds on it or the user moves the cursor."""
        self._follow = (wanted, until)
        self.set_rows(self.rows)

    def set_rows(self, rows: Sequence[Any]) -> None:
        """Show `rows` (filtered); the cursor stays on the row with the same key, or the same index (or goes to
        the row followed, once it is there)."""
        keep = self.selected
        self.rows = list(rows)
        self._search = None
        if self._follow is not None:
            wanted, until = self._follow
            target = next((r for r in self.rows if wanted(r)), None)
            if target is not None:
                keep = target
                if until(target):
                    self._follow = None
        self._refilter(None if keep is None else self.row_key(keep))

    def set_filter(self, text: str) -> None:
        keep = self.selected
        self.filter_text = text.strip()
        self._refilter(None if keep is None else self.row_key(keep))

    def _refilter(self, keep: str | None) -> None:
        words = self.filter_text.lower().split()
        if words:
            if self._search is None:
                self._search = [" ".join(c for c, _ in self.cells_of(r)).lower() for r in self.rows]
            self.shown = [r for r, s in zip(self.rows, self._search, strict=True) if all(w in s for w in words)]
        else:
            self.shown = list(self.rows)
        self._cells.clear()
        self._measure()
        old = self.cursor
        index = next((i for i, r in enumerate(self.shown) if self.row_key(r) == keep), None) if keep is not None else None
        self.set_reactive(LineTable.cursor, max(0, min(index if index is not None else old, len(self.shown) - 1)))
        self._scroll_to_cursor()
        self.border_subtitle = self.subtitle()
        self.refresh()
        # a different row under the cursor is news even at the same index (the run that took its launch's place)
        now = self.selected
        if keep is None or index is None or index != old or (now is not None and self.row_key(now) != self._announced):
            self._announce()

    def _measure(self) -> None:
        """Natural widths from the rows (a sample of a long list), then widths that fit the screen."""
        n = len(self.shown)
        indices = range(n) if n <= 2 * WIDTH_SAMPLE else [*range(WIDTH_SAMPLE), *range(n - WIDTH_SAMPLE, n)]
        content = [0] * len(self.columns)
        for index in indices:
            for i, (cell, _) in enumerate(self._row(index)):
                if len(cell) > content[i]:
                    content[i] = min(len(cell), self.columns[i].max_width)
        self.content_widths = content
        self.natural = [max(len(c.name), w) for c, w in zip(self.columns, content, strict=True)]
        self._fit()

    def _fit(self) -> None:
        """Widths that fit the screen: full headers when they do; else short headers, then the shrinkable columns
        give up width. Wide (w): every column at its natural width, the table scrolls sideways."""
        room = self.scrollable_content_region.width or self.size.width or 200
        fits = sum(self.natural) + GAP * len(self.natural) + 1 <= room
        if self.wide or fits:
            self.headers = [c.name for c in self.columns]
            self.widths = list(self.natural)
        else:
            self.headers = [c.short or c.name for c in self.columns]
            natural = [max(len(h), w) for h, w in zip(self.headers, self.content_widths, strict=True)]
            self.widths = fit_widths(natural, self.columns, room)
        self.virtual_size = Size(sum(self.widths) + GAP * len(self.widths) + 1, len(self.shown) + 1)
        self.border_subtitle = self.subtitle()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "clear_filter":
            return bool(self.filter_text)  # no filter: Esc goes on to the screen (back, or nothing)
        return True

    def action_clear_filter(self) -> None:
        """Esc in the table (focus moved down from the `/` box): the filter goes, and its box empties and hides."""
        for bar in self.screen.query("FilterBar"):  # by name: filter_bar imports this module
            if getattr(bar, "table_id", None) == self.id:
                bar.action_clear()
        self.set_filter("")

    def action_toggle_wide(self) -> None:
        """Wide: every column whole, ←/→ with shift (or < >) scroll sideways; narrow: the columns fit the screen."""
        self.wide = not self.wide
        self._fit()
        if not self.wide:
            self.scroll_to(x=0, animate=False, immediate=True)
        self.refresh()

    def action_sideways(self, direction: int) -> None:
        """Scroll sideways by about a third of the screen."""
        step = max(8, self.scrollable_content_region.width // 3)
        self.scroll_to(x=max(0, self.scroll_offset.x + direction * step), animate=False, immediate=True)

    def on_resize(self, event: events.Resize) -> None:
        self._fit()
        self.refresh()

    def _row(self, index: int) -> list[Cell]:
        cells = self._cells.get(index)
        if cells is None:
            cells = self._cells[index] = self.cells_of(self.shown[index])
        return cells

    # -- drawing
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        if y == 0:
            base = self.get_component_rich_style("line-table--header")
            cells: list[Cell] = [(h, None) for h in self.headers]
        else:
            index = scroll_y + y - 1
            if index >= len(self.shown):
                if index == 0:
                    style = self.get_component_rich_style("line-table--empty")
                    return Strip([Segment(" " + self.empty_text, style)]).crop(0, width).extend_cell_length(width, self.rich_style)
                return Strip.blank(width, self.rich_style)
            base = self.rich_style
            if index == self.cursor:
                base = base + self.get_component_rich_style("line-table--cursor")
            elif index % 2:
                base = base + self.get_component_rich_style("line-table--even")
            cells = self._row(index)
        segments = [Segment(" ", base)]
        for (cell, style), size in zip(cells, self.widths, strict=True):
            segments.append(Segment(cut(cell, size).ljust(size + GAP), base + style if style is not None else base))
        return Strip(segments).crop(scroll_x, scroll_x + width).extend_cell_length(width, base)

    def watch_cursor(self, old: int, new: int) -> None:
        self.border_subtitle = self.subtitle()
        self._refresh_row(old)
        self._refresh_row(new)
        self._scroll_to_cursor()
        self._announce()

    def _announce(self) -> None:
        row = self.selected
        self._announced = None if row is None else self.row_key(row)
        self.post_message(self.Highlighted(self, row))

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
        self._follow = None  # the user chose a row
        if self.shown:
            self.cursor = max(0, min(self.cursor + delta, len(self.shown) - 1))

    def action_page(self, direction: int) -> None:
        self.action_cursor(direction * max(1, self.scrollable_content_region.height - 2))

    def action_to_start(self) -> None:
        self.action_cursor(-len(self.shown))
        self.scroll_to(x=0, y=0, animate=False, immediate=True)

    def action_to_end(self) -> None:
        self.action_cursor(len(self.shown))

    def action_select(self) -> None:
        row = self.selected
        if row is not None:
            self.post_message(self.Selected(self, row))

    def row_at(self, event: events.MouseEvent) -> int | None:
        """The shown index of the row under the pointer (None on the header, border or below the rows)."""
        offset = event.get_content_offset(self)
        if offset is None or offset.y < 1:
            return None
        index = self.scroll_offset.y + offset.y - 1
        return index if 0 <= index < len(self.shown) else None

    def on_click(self, event: events.Click) -> None:
        index = self.row_at(event)
        if index is None:
            return
        self._follow = None
        if index == self.cursor:  # a click on the highlighted row opens it, as in Textual's tables
            self.action_select()
        self.cursor = index


def styled(text: str | Text, style: str | None = None) -> Cell:
    """A cell from text and a style string (None: the row's own style)."""
    plain = text.plain if isinstance(text, Text) else text
    return plain, Style.parse(style) if style else None
