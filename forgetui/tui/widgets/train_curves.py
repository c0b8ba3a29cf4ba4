"""Per-step training curves from `train_steps`: reward, pass rate, loss, KL and logprob agreement, one plot each."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Grid
from textual_plotext import PlotextPlot

from forgetui.tui.rows import CURVES, curve


class TrainCurves(Grid, can_focus=True):
    """One plotext plot per metric in CURVES; `show_steps` redraws them all from train_steps rows."""

    BORDER_TITLE = "Training (per step)"

    def compose(self) -> ComposeResult:
        for key, _ in CURVES:
            yield PlotextPlot(id=f"curve-{key}", classes="curve")

    def show_steps(self, steps: list[dict[str, Any]]) -> None:
        self.border_subtitle = f"{len(steps)} steps" if steps else "no training steps"
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
