"""The reward curve: mean reward of the finished rollouts after each one, as a small block chart on a fixed 0..1 axis."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

BLOCKS = " ▁▂▃▄▅▆▇█"
CHART_HEIGHT = 4


def curve_label(curve: list[float], rewards: list[float]) -> Text:
    """'mean reward 0.750 over 4 rollouts (last 1, ...)' or a hint while nothing finished."""
    if not curve:
        return Text("mean reward: no rollout finished yet", style="dim")
    text = Text("mean reward ", style="bold")
    text.append(f"{curve[-1]:.3f}", style="bold green" if curve[-1] >= 0.5 else "bold yellow")
    text.append(f" over {len(rewards)} rollouts  (last reward {rewards[-1]:.3g}; running mean between "
                f"{min(curve):.3g} and {max(curve):.3g})", style="dim")
    return text


def bucket(values: list[float], width: int) -> list[float]:
    """At most `width` points: each the last value of its slice (a running mean's value at that time)."""
    if len(values) <= width:
        return list(values)
    step = len(values) / width
    return [values[min(len(values) - 1, int((i + 1) * step) - 1)] for i in range(width)]


def block_chart(values: list[float], width: int, height: int = CHART_HEIGHT) -> Text:
    """Columns of block characters, 0 at the bottom and 1 at the top (values clamped to [0, 1])."""
    points = bucket(values, max(1, width))
    eighths = [round(min(max(v, 0.0), 1.0) * height * 8) for v in points]
    lines = []
    for row in range(height - 1, -1, -1):
        line = "".join(BLOCKS[min(8, max(0, e - row * 8))] for e in eighths)
        lines.append(line.ljust(width))
    return Text("\n".join(lines), style="green")


class RewardChart(Vertical):
    """A label and the running mean reward (one point per finished rollout, squeezed to the width)."""

    BORDER_TITLE = "Reward (running mean, 0..1)"
    DEFAULT_CSS = """
    RewardChart { border: round $primary-darken-1; height: 7; padding: 0 1; }
    RewardChart #reward-label { height: 1; }
    RewardChart #reward-bars { height: 4; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.curve: list[float] = []

    def compose(self) -> ComposeResult:
        yield Static(curve_label([], []), id="reward-label")
        yield Static("", id="reward-bars")

    def show_curve(self, curve: list[float], rewards: list[float]) -> None:
        self.curve = list(curve)
        self.query_one("#reward-label", Static).update(curve_label(curve, rewards))
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        bars = self.query_one("#reward-bars", Static)
        bars.update(block_chart(self.curve, max(1, bars.size.width or 60)) if self.curve else "")
