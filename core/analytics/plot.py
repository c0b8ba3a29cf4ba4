"""A PNG comparing groups of rollouts (runs, harnesses, checkpoints) on the behaviour rates, with their intervals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

RATE_METRICS = ("pass_rate", "coverage", "verify_rate", "tool_error_rate", "recovery_rate", "plan_completion")


def group_label(row: dict[str, Any], keys: tuple[str, ...]) -> str:
    """A group's name from its key columns (run ids shortened to their tail)."""
    parts = []
    for key in keys:
        value = row.get(key)
        parts.append(f"step {value}" if key == "step" else str(value)[-24:])
    return " · ".join(parts)


def write_behaviour_plot(table: list[dict[str, Any]], keys: tuple[str, ...], path: Path) -> Path:
    """Grouped bars: one cluster per rate metric, one bar per group, 95% bootstrap intervals as error bars."""
    # a bare Figure on the Agg canvas, as core.eval.report does (no pyplot backend machinery)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    n = max(len(table), 1)
    width = 0.8 / n
    for i, row in enumerate(table):
        xs, ys, lo, hi = [], [], [], []
        for j, metric in enumerate(RATE_METRICS):
            est = row[metric]
            if est["value"] is None:
                continue
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(est["value"])
            lo.append(est["value"] - (est["low"] if est["low"] is not None else est["value"]))
            hi.append((est["high"] if est["high"] is not None else est["value"]) - est["value"])
        ax.bar(xs, ys, width=width, yerr=[lo, hi], capsize=2, label=f"{group_label(row, keys)} (n={row['rollouts']})")
    ax.set_xticks(range(len(RATE_METRICS)))
    ax.set_xticklabels([m.replace("_", " ") for m in RATE_METRICS], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share of rollouts (95% bootstrap CI)")
    ax.set_title("agent behaviour")
    ax.grid(True, axis="y", alpha=0.3)
    if table:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no scored rollouts", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
