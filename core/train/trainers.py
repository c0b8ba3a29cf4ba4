"""The trainers (`train.trainer`): one interface, found by name in a registry a package can extend.

`execute_run` asks the config's trainer whether the config trains at all, and if so hands it the run;
each trainer declares what it needs instead of callers comparing names:

- ``local``: GRPO on this machine through the real harness and proxy (`core.train.loop`), `train.steps` steps;
- ``sft``: fine-tuning on earlier runs' passing rollouts (`core.train.sft`); no rollouts run;
- ``verl``: veRL's PPO trainer on GPU nodes (`core.train.verl.launch`), launched as its own process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from core.errors import ConfigError
from core.plugins import Registry

if TYPE_CHECKING:
    from core.config import RunConfig, TrainSettingsGroup
    from core.eval.summary import RunSummary
    from core.rollout.engine import RolloutEvent


@dataclass(frozen=True)
class RunHooks:
    """What a caller (the TUI, `--no-ui` progress) hears while a run goes on."""

    on_event: Callable[[RolloutEvent], None] | None = None  # each rollout's state changes
    on_start: Callable[[str, int], None] | None = None  # (run id, rollouts planned) once the run exists
    on_step: Callable[[dict[str, Any]], None] | None = None  # each training step's metrics (its train_steps row)


class Trainer(Protocol):
    """One way of training from a run config."""

    name: ClassVar[str]
    runs_rollouts: ClassVar[bool]  # whether it samples rollouts itself (SFT learns from recorded ones)
    settings: ClassVar[tuple[type[TrainSettingsGroup], ...]]  # the [train] settings groups it reads (core.config; the reference lists them)

    def trains(self, config: RunConfig) -> bool:
        """Whether this config trains at all (a `local` config with `train.steps = 0` is an eval)."""
        ...

    def check(self, config: RunConfig) -> None:
        """Refuse, before anything runs, a config this trainer cannot train (ConfigError saying what to change)."""
        ...

    async def train(self, config: RunConfig, *, resume: str | None, hooks: RunHooks, ks: list[int] | None) -> RunSummary:
        """Train (or resume `resume`); the run's summary, with what was trained in `extra`."""
        ...


TRAINERS = Registry(
    "forgetui.trainers",
    "trainer",
    {"local": "core.train.loop:LocalTrainerRun", "sft": "core.train.sft:SftTrainerRun", "verl": "core.train.verl.launch:VerlTrainerRun"},
)


def trainer_for(config: RunConfig, options: Mapping[str, Any] | None = None) -> Trainer:
    """The config's trainer (`train.trainer`), built with its own options (veRL's cluster options, say)."""
    cls = TRAINERS.load(config.train.trainer)
    try:
        return cls(**dict(options or {}))
    except TypeError as exc:
        raise ConfigError(f"trainer {config.train.trainer!r} does not take the options {sorted(options or {})}: {exc}") from None
