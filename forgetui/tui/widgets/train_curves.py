"""Per-step training curves from `train_steps`: reward, pass rate, loss, KL and logprob agreement, one plot each;
where the plots would be too small to read (80×24), one line per metric instead: a sparkline and its numbers."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from forgetui.tui.rows import CURVES, curve

# a plot needs its title, frame, tick labels and at least 4 rows of data to be read honestly
MIN_PLOT_ROWS = 9
MIN_PLOT_COLS = 24
GRID = (3, 2)  # columns, rows of plots
SPARKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 24


def sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """One block character per value (the last `width` values), the lowest ▁ and the highest █; all ▄ when flat."""
    values = values[-width:]
    low, high = min(values), max(values)
    if high == low:
        return SPARKS[3] * len(values)
    return "".join(SPARKS[round((v - low) / (high - low) * (len(SPARKS) - 1))] for v in values)


def curves_text(steps: list[dict[str, Any]]) -> Text:
    """One line per metric: its name, a sparkline (the last SPARK_WIDTH steps), first → last value and the
    min/max the sparkline spans."""
    text = Text()
    name_w = max(len(title) for _, title in CURVES)
    spark_w = min(SPARK_WIDTH, max(len(curve(steps, key)[1]) for key, _ in CURVES) or 1)
    for key, title in CURVES:
        ys = curve(steps, key)[1]
        text.append(f"{title:<{name_w}}  ", style="bold")
        if not ys:
            text.append("no values\n", style="dim")
            continue
        text.append(f"{sparkline(ys, spark_w):<{spark_w}}", style="green")
        text.append(f"  {ys[0]:.3g} → {ys[-1]:.3g}", style="bold")
        text.append(f"  min {min(ys):.3g} · max {max(ys):.3g}\n", style="dim")
    text.append("(too small for plots: widen or heighten the terminal to see them)", style="dim italic")
    return text


class TrainCurves(Vertical, can_focus=True):
    """One plotext plot per metric in CURVES, or one line per metric when the plots would not fit;
    `show_steps` redraws them from train_steps rows."""

    BORDER_TITLE = "Training (per step)"
    DEFAULT_CSS = """
    TrainCurves { border: round $primary-darken-1; height: 1fr; }
    TrainCurves:focus { border: round $accent; }
    TrainCurves #curve-grid { grid-size: 3 2; grid-gutter: 0 1; height: 1fr; }
    TrainCurves #curve-lines { height: auto; padding: 0 1; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        with Grid(id="curve-grid"):
            for key, _ in CURVES:
                yield PlotextPlot(id=f"curve-{key}", classes="curve")
        yield Static("", id="curve-lines")

    @property
    def compact(self) -> bool:
        """Whether the plots would be too small to read: then the lines show instead."""
        width, height = self.content_region.width, self.content_region.height
        return width // GRID[0] < MIN_PLOT_COLS or height // GRID[1] < MIN_PLOT_ROWS

    def on_resize(self) -> None:
        self._show_form()

    def _show_form(self) -> None:
        compact = self.compact
        self.query_one("#curve-grid").display = not compact
        self.query_one("#curve-lines").display = compact

    def show_steps(self, steps: list[dict[str, Any]]) -> None:
        self.steps = steps
        self.border_subtitle = f"{len(steps)} steps" if steps else "no training steps"
        self.query_one("#curve-lines", Static).update(curves_text(steps) if steps else Text("no training steps", style="dim"))
        self._show_form()
        for key, title in CURVES:
            widget = self.query_one(f"#curve-{key}", PlotextPlot)
            xs, ys = curve(steps, key)
            plt = widget.plt
            plt.clear_data()
            plt.clear_figure()
            plt.title(f"{title} {ys[-1]:.3g}" if ys else f"{title}: -")
            if xs:
                plt.plot(xs, ys, marker="braille")
                if len(xs) < 8:
                    plt.xticks(xs)
            widget.refresh()
