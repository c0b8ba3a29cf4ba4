"""Which tasks each training step runs: a seeded shuffle of the task list, walked `tasks_per_step` at a time.

Each epoch (one pass over the tasks) has its own permutation, so every task runs once per epoch and
a step's batch mixes the env's families instead of taking them in the env's order (which groups a
family's tasks together). Everything is a pure function of (seed, step): a resumed run draws the
same batches and refills it drew before.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from core.env import Task


@dataclass(frozen=True)
class TaskSchedule:
    """The step batches and dynamic-sampling refills of one training run."""

    tasks: tuple[Task, ...]
    per_step: int | None = None  # None: every task, every step
    seed: int = 0
    shuffle: bool = True

    def _order(self, salt: str) -> list[Task]:
        order = list(self.tasks)
        if self.shuffle:
            random.Random(f"{self.seed}:{salt}").shuffle(order)
        return order

    def batch(self, step: int) -> list[Task]:
        """Step `step`'s `per_step` tasks: positions step·per_step … of the concatenated epoch permutations."""
        n = len(self.tasks)
        if not self.per_step or self.per_step >= n:
            return list(self.tasks)
        epochs: dict[int, list[Task]] = {}
        out: list[Task] = []
        i = step * self.per_step
        while len(out) < self.per_step:  # a batch across an epoch's end skips a task it already holds
            epoch = i // n
            if epoch not in epochs:
                epochs[epoch] = self._order(f"epoch:{epoch}")
            task = epochs[epoch][i % n]
            if all(t.id != task.id for t in out):
                out.append(task)
            i += 1
        return out

    def refill(self, step: int, used: list[Task], n: int) -> list[Task]:
        """Up to `n` tasks not yet run in this step (dynamic sampling), in a per-step shuffled order."""
        taken = {t.id for t in used}
        return [t for t in self._order(f"refill:{step}") if t.id not in taken][:n]
