"""Training metrics where researchers already look: TensorBoard event files (and W&B offline), from the store's rows."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def train_step_rows(cursor: Any, run_id: str, steps: list[int] | None = None) -> list[dict[str, Any]]:
    """The run's `train_steps` rows (metrics parsed), in step order."""
    sql = "SELECT step, loss, reward_mean, metrics FROM train_steps WHERE run_id = ?"
    params: list[Any] = [run_id]
    if steps is not None:
        sql += " AND list_contains(?, step)"
        params.append(steps)
    out = []
    for step, loss, reward_mean, metrics in cursor.execute(sql + " ORDER BY step", params).fetchall():
        parsed = json.loads(metrics) if isinstance(metrics, str) else (metrics or {})
        out.append({"step": step, "loss": loss, "reward_mean": reward_mean, **parsed})
    return out


class MetricsMirror:
    """Copies `train_steps` rows into TensorBoard event files under the run's folder (and W&B offline, if installed)."""

    def __init__(self, logdir: Path, run_id: str, config: dict[str, Any]) -> None:
        self.logdir = logdir
        self._tb = None
        self._wandb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(logdir))
        except Exception:  # noqa: BLE001 - the store keeps every metric either way
            log.warning("TensorBoard is not available: metrics stay in the store only", exc_info=True)
        if os.environ.get("FORGETUI_WANDB", "1") != "0":
            try:
                import wandb  # optional: only when the user installed it

                os.environ.setdefault("WANDB_SILENT", "true")  # stderr is the progress display's
                self._wandb = wandb.init(
                    project="forgetui", name=run_id, dir=str(logdir), mode="offline", config=config, reinit=True,
                    settings=wandb.Settings(console="off", silent=True),
                )
            except ImportError:
                pass
            except Exception:  # noqa: BLE001
                log.warning("could not start W&B offline logging", exc_info=True)

    def write(self, rows: list[dict[str, Any]]) -> None:
        """One point per numeric metric per row (`train/<name>` at the row's step)."""
        for row in rows:
            step = int(row["step"])
            scalars = {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)}
            if self._tb is not None:
                for name, value in scalars.items():
                    self._tb.add_scalar(f"train/{name}", value, step)
                self._tb.flush()
            if self._wandb is not None:
                self._wandb.log({f"train/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
