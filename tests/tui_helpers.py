"""What the TUI tests share: a Static's text, and waiting (bounded) until the app reaches a state."""

from __future__ import annotations

from collections.abc import Callable

from textual.css.query import NoMatches
from textual.widgets import Static


def text_of(widget: Static) -> str:
    """The plain text a Static shows now."""
    content = widget.content
    return getattr(content, "plain", None) or str(content)


async def until(pilot, cond: Callable[[], object], what: str = "the expected state", tries: int = 400,  # noqa: ANN001
                step: float = 0.02) -> None:
    """Let the app work until `cond()` holds, at most `tries` pauses of `step` s (no wall-clock assertion); a query
    that finds nothing yet (the screen is still composing) counts as not yet."""
    for _ in range(tries):
        try:
            if cond():
                return
        except NoMatches:
            pass
        await pilot.pause(step)
    raise AssertionError(f"the TUI never reached: {what}")
