"""A sample's tokens, decoded: sampled tokens (loss mask 1) coloured by probability, inserted ones shaded grey,
every other token a shade darker (so neighbours of one colour still read as separate tokens), call boundaries
marked, a legend on top; the cursor's token shows its id, logprob, mask and call below the legend."""

from __future__ import annotations

import bisect
import math

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Static

from forgetui.tui.rows import SampleView
from forgetui.tui.widgets.call_inspector import prob_colour, prob_rgb

WINDOW = 400  # tokens rendered at once around the cursor: a 50k-token sample costs the same few ms per key
INSERTED = ("rgb(150,150,150) on rgb(40,40,40)", "rgb(150,150,150) on rgb(62,62,62)")  # even, odd token
ODD_SHADE = 0.72  # an odd token's colour, darkened: the boundary between two tokens of one colour


def sampled_style(logprob: float, odd: bool) -> str:
    red, green, blue = prob_rgb(logprob)
    if odd:
        red, green, blue = (int(c * ODD_SHADE) for c in (red, green, blue))
    return f"black on rgb({red},{green},{blue})"


def legend_text() -> Text:
    """What the colours and marks mean."""
    text = Text("sampled, by p: ", style="dim")
    for p in (0.05, 0.25, 0.5, 0.75, 0.99):
        text.append(f"{p:g}", style=f"black on {prob_colour(math.log(p))}")
        text.append(" ")
    text.append(" inserted (mask 0) ", style=INSERTED[0])
    text.append("  ")
    text.append("│call N▸", style="bold magenta")
    text.append(" a call's completion · every other token darker · ↵ newline", style="dim")
    return text


def piece_text(sample: SampleView, i: int) -> str:
    """What token `i` shows: its decoded text (control characters visible) or its id."""
    if sample.pieces is None:
        return f"{sample.token_ids[i]} "
    piece = sample.pieces[i]
    return piece.replace("\n", "↵\n").replace("\t", "→") or "∅"


def window(sample: SampleView, cursor: int, size: int = WINDOW) -> range:
    """The tokens shown: `size` of them holding the cursor, starting on a multiple of size/3 (so most moves
    keep the same window and only restyle it)."""
    step = max(1, size // 3)
    start = max(0, min((cursor // step - 1) * step, len(sample.token_ids) - size))
    return range(start, min(len(sample.token_ids), start + size))


def tokens_text(sample: SampleView, cursor: int, size: int = WINDOW) -> Text:
    """The window of tokens around `cursor` as styled text; a `│c1` marker where each merged call's completion starts."""
    return tokens_and_cursor(sample, cursor, size)[0]


def tokens_and_cursor(sample: SampleView, cursor: int, size: int = WINDOW) -> tuple[Text, int]:
    """`tokens_text` and where the cursor's token ends in it (characters)."""
    text, end = Text(), 0
    starts = {s: n for n, s in enumerate(sample.completion_starts)}
    span = window(sample, cursor, size)
    if span.start:
        text.append(f"… {span.start} tokens before\n", style="dim")
    for i in span:
        if i in starts:
            text.append(f"│call {starts[i] + 1}▸", style="bold magenta")
        sampled = i < len(sample.loss_mask) and sample.loss_mask[i] == 1
        style = sampled_style(sample.logprobs[i], bool(i % 2)) if sampled else INSERTED[i % 2]
        if i == cursor:
            style += " reverse underline"
        text.append(piece_text(sample, i), style=style)
        if i == cursor:
            end = len(text)
    if span.stop < len(sample.token_ids):
        text.append(f"\n… {len(sample.token_ids) - span.stop} tokens after", style="dim")
    return text, end


def cursor_row(plain: str, end: int, width: int) -> int:
    """The line (0-based) where the text's character `end - 1` lands once wrapped to `width` as the body wraps it."""
    return max(0, len(Content(plain[:end].rstrip("\n") or " ").wrap(max(1, width))) - 1)


def cursor_text(sample: SampleView, i: int) -> Text:
    """Token i's id, text, mask, logprob (and probability) and which call it belongs to."""
    if not sample.token_ids:
        return Text("empty sample", style="dim")
    sampled = sample.loss_mask[i] == 1 if i < len(sample.loss_mask) else False
    lp = sample.logprobs[i] if i < len(sample.logprobs) else math.nan
    call = sample.call_at(i)
    text = Text(f"token {i + 1}/{len(sample.token_ids)}  id {sample.token_ids[i]}", style="bold")
    if sample.pieces is not None:
        text.append(f"  {sample.pieces[i]!r}")
    text.append("  sampled" if sampled else "  inserted (mask 0)", style="green" if sampled else "dim")
    if sampled and not math.isnan(lp):
        text.append(f"  logprob {lp:.4f} (p={math.exp(lp):.3f})")
    if call is not None:
        part = "completion" if i >= sample.completion_starts[call] else "prompt"
        text.append(f"  call {call + 1}/{len(sample.call_ids)} {part}", style="magenta")
    return text


class TokenView(Vertical, can_focus=True):
    """←/→ move one token, ↑/↓ a line's worth, PgUp/PgDn 200, Home/End, n/p the next/previous sampled token."""

    BORDER_TITLE = "Tokens"
    DEFAULT_CSS = """
    TokenView { border: round $primary-darken-1; height: 1fr; }
    TokenView:focus { border: round $accent; }
    TokenView #token-legend { height: auto; padding: 0 1; }
    TokenView #token-cursor { height: auto; padding: 0 1; background: $boost; }
    TokenView #token-scroll { height: 1fr; padding: 0 1; }
    """
    BINDINGS = [
        Binding("right,l", "move(1)", "Next token", show=False),
        Binding("left,h", "move(-1)", "Previous token", show=False),
        Binding("down,j", "move(20)", "20 tokens on", show=False),
        Binding("up,k", "move(-20)", "20 tokens back", show=False),
        Binding("pagedown", "move(200)", "200 tokens on", show=False),
        Binding("pageup", "move(-200)", "200 tokens back", show=False),
        Binding("home", "jump(0)", "First token", show=False),
        Binding("end", "jump(-1)", "Last token", show=False),
        Binding("n", "next_sampled(1)", "Next sampled", tooltip="the first token of the next run the policy sampled"),
        Binding("p", "next_sampled(-1)", "Prev sampled", tooltip="the first token of the previous sampled run"),
    ]
    cursor: reactive[int] = reactive(0)

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.sample: SampleView | None = None
        self._window: tuple[str, int] | None = None  # (sample, first token) of the text shown
        self._plain, self._cursor_end = "", 0  # the body's text and where the cursor's token ends in it

    def compose(self) -> ComposeResult:
        yield Static(legend_text(), id="token-legend")
        yield Static("", id="token-cursor")
        with VerticalScroll(id="token-scroll"):
            yield Static("", id="token-body")

    def show_sample(self, sample: SampleView | None, note: str | None = None) -> None:
        self.sample = sample
        if sample is None:
            self.query_one("#token-body", Static).update(Text(note or "no samples", style="dim"))
            self.query_one("#token-cursor", Static).update("")
            return
        self.border_subtitle = (f"{sample.sample_id} · {len(sample.token_ids)} tokens · {sum(sample.loss_mask)} sampled"
                                + (f" · {note}" if note else ""))
        first = next((i for i, m in enumerate(sample.loss_mask) if m), 0)
        if self.cursor == first:
            self._render_cursor()
        self.cursor = first

    def on_resize(self) -> None:
        self.call_after_refresh(self.scroll_to_cursor)  # shown (its tab) or resized: the cursor's line moved

    def watch_cursor(self) -> None:
        self._render_cursor()

    def _render_cursor(self) -> None:
        if self.sample is None:
            return
        # inside the same window only styles change: same lines, so no new layout pass (the costly part)
        span = window(self.sample, self.cursor)
        same = (self.sample.sample_id, span.start) == self._window
        self._window = (self.sample.sample_id, span.start)
        text, self._cursor_end = tokens_and_cursor(self.sample, self.cursor)
        self._plain = text.plain
        self.query_one("#token-body", Static).update(text, layout=not same)
        self.query_one("#token-cursor", Static).update(cursor_text(self.sample, self.cursor))
        if same:
            self.scroll_to_cursor()
        else:
            self.call_after_refresh(self.scroll_to_cursor)

    def scroll_to_cursor(self) -> None:
        """Scroll the body (only as far as needed) so the cursor's line is on screen, a line of context around it."""
        body, scroll = self.query_one("#token-body", Static), self.query_one("#token-scroll", VerticalScroll)
        width, height = body.content_region.width, scroll.scrollable_content_region.height
        if width <= 0 or height <= 0:
            return
        row = cursor_row(self._plain, self._cursor_end, width)
        margin = 1 if height > 3 else 0
        top = scroll.scroll_y
        if row - margin < top:
            scroll.scroll_to(y=max(0, row - margin), animate=False, immediate=True)
        elif row + margin >= top + height:
            scroll.scroll_to(y=row + margin - height + 1, animate=False, immediate=True)

    def _clamp(self, i: int) -> int:
        n = len(self.sample.token_ids) if self.sample else 0
        return max(0, min(i, n - 1)) if n else 0

    def action_move(self, delta: int) -> None:
        self.cursor = self._clamp(self.cursor + delta)

    def action_jump(self, where: int) -> None:
        self.cursor = self._clamp(where if where >= 0 else len(self.sample.token_ids) - 1 if self.sample else 0)

    def find(self, query: str, after: int) -> tuple[int, int, int] | None:
        """The first token at or past `after` (wrapping around) where `query` starts in the decoded text (case
        ignored): (its index, which match it is, how many there are); None without a match."""
        if self.sample is None or not query:
            return None
        pieces = self.sample.pieces or [f"{t} " for t in self.sample.token_ids]
        starts, pos = [], 0
        for piece in pieces:
            starts.append(pos)
            pos += len(piece)
        text, needle = "".join(pieces).lower(), query.lower()
        hits, at = [], text.find(needle)
        while at >= 0:
            hits.append(bisect.bisect_right(starts, at) - 1)
            at = text.find(needle, at + 1)
        hits = sorted(set(hits))
        if not hits:
            return None
        n = next((k for k, i in enumerate(hits) if i >= after), 0)
        return hits[n], n + 1, len(hits)

    def action_next_sampled(self, direction: int) -> None:
        """To the first token of the next (or previous) run of sampled tokens."""
        if self.sample is None:
            return
        mask, i = self.sample.loss_mask, self.cursor
        while 0 <= i + direction < len(mask) and mask[i + direction] == 1:  # leave this sampled run
            i += direction
        while 0 <= i + direction < len(mask):
            i += direction
            if mask[i] == 1:
                break
        self.cursor = self._clamp(i)
