"""Which tasks each training step runs: a seeded shuffle of the task list, walked `tasks_per_step` at a time.

Each epoch (one pass over the tasks) has its own permutation, so every task runs once per epoch and
a step's batch mixes the env's families instead of taking them in the env's order (which groups a
family's tasks together). Everything is a pure function of (seed, step): a resumed run draws the
same batches and refills it drew before.

With `stratify` (a task meta key, such as the toy env's `family`), a batch deals its slots round-robin over the
key's values instead, each value's tasks walked in their own seeded epochs: every step holds every value (while
it has as many slots), so no family goes a step without the signal that keeps its own answers in place while
the others' advantages move the weights they share. Refills deal the same way over the tasks the step has not run.
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
    stratify: str | None = None  # a task meta key: deal each batch round-robin over its values

    def _order(self, salt: str) -> list[Task]:
        return self._shuffled(self.tasks, salt)

    def _shuffled(self, tasks: tuple[Task, ...] | list[Task], salt: str) -> list[Task]:
        """`tasks` in the seeded order `salt` names (as given when `shuffle` is off)."""
        order = list(tasks)
        if self.shuffle:
            random.Random(f"{self.seed}:{salt}").shuffle(order)
        return order

    def _strata(self, salt: str) -> list[list[Task]]:
        """The tasks by their `stratify` value (a task without it is a value of its own), values in a seeded order."""
        by_value: dict[str, list[Task]] = {}
        for task in self.tasks:
            by_value.setdefault(str(task.meta.get(self.stratify or "", "")), []).append(task)
        values = sorted(by_value)
        if self.shuffle:
            random.Random(f"{self.seed}:{salt}").shuffle(values)
        return [by_value[v] for v in values]

    def _dealt(self, step: int) -> list[Task]:
        """A stratified batch: slot i (counted over all steps) goes to value i mod V, that value's (i div V)-th draw."""
        strata = self._strata("strata")
        out: list[Task] = []
        i = step * (self.per_step or 0)
        while len(out) < (self.per_step or 0):
            group = strata[i % len(strata)]
            draw = i // len(strata)
            epoch = draw // len(group)
            task = self._shuffled(group, f"epoch:{epoch}:{group[0].id}")[draw % len(group)]
            if all(t.id != task.id for t in out):  # a small value dealt twice in one batch holds no task twice
                out.append(task)
            i += 1
        return out

    def batch(self, step: int) -> list[Task]:
        """Step `step`'s `per_step` tasks: positions step·per_step … of the concatenated epoch permutations."""
        n = len(self.tasks)
        if not self.per_step or self.per_step >= n:
            return list(self.tasks)
        if self.stratify:
            return self._dealt(step)
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
        if not self.stratify:
            return [t for t in self._order(f"refill:{step}") if t.id not in taken][:n]
        left = [[t for t in self._shuffled(group, f"refill:{step}:{group[0].id}") if t.id not in taken] for group in self._strata(f"refill:{step}")]
        dealt = [group[k] for k in range(max(map(len, left), default=0)) for group in left if k < len(group)]  # round-robin
        return dealt[:n]
