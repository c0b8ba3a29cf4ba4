"""The built-in `toy` environment: small deterministic shell/file tasks with programmatic checks.

Tasks come from a seed. Each family draws parameter sets in a fixed order; duplicates are
dropped and every fourth distinct one is held out for the eval split, so train and eval never
share a task id or parameters. The fixed task ``hello`` is in every split.
"""

from __future__ import annotations

import json
import random
from typing import Any

from core.env import Environment, Score, Task
from core.errors import ConfigError
from core.runtime.base import Sandbox
from envs.toy.families import FAMILIES, HELLO, Family
from envs.toy.workspace import Workspace

SPLITS = ("train", "eval", "all")
DEFAULT_N = 5
EVAL_EVERY = 4  # distinct parameter set j goes to eval when j % EVAL_EVERY == EVAL_EVERY - 1
MAX_DRAWS = 5000


def _split_of(index: int) -> str:
    return "eval" if index % EVAL_EVERY == EVAL_EVERY - 1 else "train"


def family_tasks(family: Family, seed: int, split: str, n: int) -> list[Task]:
    """Up to ``n`` tasks of one family per requested split (both for ``all``), deterministic in ``seed``."""
    rng = random.Random(f"toy:{seed}:{family.name}")
    wanted = ("train", "eval") if split == "all" else (split,)
    got: dict[str, list[Task]] = {s: [] for s in wanted}
    seen: set[str] = set()
    index = 0
    for _ in range(MAX_DRAWS):
        if all(len(v) >= n for v in got.values()):
            break
        params = family.params(rng)
        key = json.dumps(params, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        which = _split_of(index)
        if which in got and len(got[which]) < n:
            got[which].append(make_task(family, f"{family.name}-{index:03d}", params, which))
        index += 1
    return [t for s in wanted for t in got[s]]


def make_task(family: Family, task_id: str, params: dict[str, Any], split: str) -> Task:
    return Task(
        id=task_id,
        instruction=family.instruction(params),
        files=dict(family.files(params)),
        meta={"family": family.name, "split": split, "params": params},
    )


def hello_task(split: str) -> Task:
    return make_task(HELLO, "hello", {}, split)


def solution_script(task: Task) -> str:
    """A shell script that solves a toy task in its workspace (reference solution)."""
    return _family(task).solution(task.meta.get("params", {}))


def _family(task: Task) -> Family:
    name = task.meta.get("family")
    if name == HELLO.name:
        return HELLO
    if name not in FAMILIES:
        raise ConfigError(
            f"task {task.id!r} is not a toy task (family {name!r}; known: {', '.join(FAMILIES)})"
        )
    return FAMILIES[name]


class ToyEnv(Environment):
    """Options: ``seed`` (0), ``split`` (train | eval | all), ``n`` tasks per family (5), ``families``."""

    name = "toy"
    version = "1"
    accepted_options = frozenset({"seed", "split", "n", "families"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.seed = int(options.get("seed", 0))
        self.split = str(options.get("split", "train"))
        self.n = int(options.get("n", DEFAULT_N))
        families = options.get("families") or list(FAMILIES)
        if isinstance(families, str):
            families = [f.strip() for f in families.split(",") if f.strip()]
        if self.split not in SPLITS:
            raise ConfigError(f"toy env: split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if self.n < 0:
            raise ConfigError(f"toy env: n must be >= 0, got {self.n}")
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise ConfigError(f"toy env: unknown families {unknown}; known: {', '.join(FAMILIES)}")
        self.families = list(families)

    def tasks(self) -> list[Task]:
        out = [hello_task(self.split)]
        for name in self.families:
            out.extend(family_tasks(FAMILIES[name], self.seed, self.split, self.n))
        return out

    async def verify(self, sandbox: Sandbox, task: Task, workdir: str) -> Score:
        try:
            family = _family(task)
        except ConfigError as exc:
            return self.score(0.0, str(exc))
        value, detail, checks = await family.check(Workspace(sandbox, workdir), task.meta.get("params", {}))
        score = self.score(value, detail)
        score.checks = checks
        return score


__all__ = ["ToyEnv", "solution_script"]
