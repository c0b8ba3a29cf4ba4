"""What the learning benchmark prints and draws: pass rates with intervals over tasks, per family, and the plot."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

BOOTSTRAP_RESAMPLES = 2000
LEVEL = 0.95


def bootstrap_interval(items: Sequence[T], statistic: Callable[[list[T]], float], *, resamples: int = BOOTSTRAP_RESAMPLES,
                       level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of `statistic` over `items` resampled with replacement (each resample as large)."""
    rng = random.Random(seed)
    values = sorted(statistic([items[rng.randrange(len(items))] for _ in items]) for _ in range(resamples))
    cut = (1 - level) / 2
    return values[int(cut * (resamples - 1))], values[int(round((1 - cut) * (resamples - 1)))]


def pass_interval(per_task: dict[str, tuple[int, int]], *, resamples: int = BOOTSTRAP_RESAMPLES, level: float = LEVEL,
                  seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the pass rate, resampling *tasks* (their rollouts stay together).

    `per_task` maps a task id to (passed, scored) rollouts. Samples of one task are not independent
    (the same instruction, the same policy), so resampling rollouts one by one (or a Wilson interval
    over them) would be too narrow; the task is the unit that was drawn.
    """
    tasks = [per_task[k] for k in sorted(per_task) if per_task[k][1]]  # sorted: the interval is a function of the data, not of arrival order
    if not tasks:
        return 0.0, 0.0
    return bootstrap_interval(tasks, lambda pick: sum(p for p, _ in pick) / sum(n for _, n in pick), resamples=resamples, level=level, seed=seed)


def paired_gain(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], *, resamples: int = BOOTSTRAP_RESAMPLES,
                level: float = LEVEL, seed: int = 0) -> dict[str, Any]:
    """The change of pass rate between two stages on the same tasks, with a bootstrap interval resampling tasks.

    Pairing removes what the tasks themselves contribute (an easy task passes in both stages), so the
    interval of the difference is narrower than the two stages' intervals suggest. `up`/`down` count
    tasks whose pass rate rose or fell.
    """
    common = sorted(t for t in before if t in after and before[t][1] and after[t][1])
    diffs = [after[t][0] / after[t][1] - before[t][0] / before[t][1] for t in common]
    if not diffs:
        return {"gain": 0.0, "ci": [0.0, 0.0], "tasks": 0, "up": 0, "down": 0}
    lo, hi = bootstrap_interval(diffs, lambda pick: sum(pick) / len(pick), resamples=resamples, level=level, seed=seed)
    return {"gain": sum(diffs) / len(diffs), "ci": [lo, hi], "tasks": len(diffs), "up": sum(d > 0 for d in diffs), "down": sum(d < 0 for d in diffs)}


def paired_line(label: str, p: dict[str, Any]) -> str:
    return (f"{label} = {p['gain']:+.3f} [{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}] paired over {p['tasks']} tasks "
            f"({p['up']} up, {p['down']} down)")


def split_line(stage: str, split: str, r: dict[str, Any]) -> str:
    """One line for a stage's result on one eval split: pass rate, interval, tasks, per family."""
    families = " ".join(f"{f} {p}/{n}" for f, (p, n) in sorted(r["by_family"].items()))
    lo, hi = r["ci"]
    timeouts = f", {r['timeouts']} timed out" if r.get("timeouts") else ""  # scored as fails: a busy machine's share
    return (f"  {stage} · {split}: pass {r['passed']}/{r['scored']} = {r['pass_rate']:.3f} [{lo:.3f}, {hi:.3f}] "
            f"({r['tasks']} tasks{timeouts}), mean reward {r['mean_reward']:.3f}  [{families}]")


def table(results: dict[str, dict[str, Any]], splits: list[str]) -> str:
    """Markdown: harness × stage, one column per eval split (pass rate and 95% interval)."""
    head = "| harness | stage | " + " | ".join(f"{s} (95% CI over tasks)" for s in splits) + " |"
    lines = [head, "|" + "---|" * (2 + len(splits))]
    for harness, result in results.items():
        for stage in result["stages"]:
            cells = []
            for split in splits:
                r = stage["splits"].get(split)
                cells.append("-" if r is None else f"{r['pass_rate']:.3f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] ({r['passed']}/{r['scored']})")
            lines.append(f"| {harness} | {stage['stage']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Held-out pass rate per stage and split (95% intervals as error bars), and GRPO's train reward per step."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    stages = result["stages"]
    splits = list(result["plan"]["eval_splits"])
    fig = Figure(figsize=(10, 3.8), dpi=120)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    width = 0.8 / max(1, len(splits))
    colors = ["#37c", "#e83", "#4a7"]
    for j, split in enumerate(splits):
        xs, ys, lows, highs = [], [], [], []
        for i, stage in enumerate(stages):
            r = stage["splits"].get(split)
            if r is None:
                continue
            xs.append(i + (j - (len(splits) - 1) / 2) * width)
            ys.append(r["pass_rate"])
            lows.append(r["pass_rate"] - r["ci"][0])
            highs.append(r["ci"][1] - r["pass_rate"])
        left.bar(xs, ys, width=width, color=colors[j % len(colors)], label=split, yerr=[lows, highs], capsize=3)
    left.set_xticks(range(len(stages)), [s["stage"] for s in stages])
    left.set_ylim(0, 1)
    left.set_title(f"{result['plan']['harness']}: held-out pass rate (95% CI over tasks)")
    left.legend(loc="upper left", fontsize=8)
    steps = result.get("grpo_steps") or []
    right.plot([m["step"] for m in steps], [m["reward_mean"] for m in steps], marker="o")
    right.set_ylim(0, 1)
    right.set_xlabel("GRPO step")
    right.set_title("train reward per step")
    fig.tight_layout()
    fig.savefig(path)
