"""The built-in `toy` environment: small deterministic shell/file tasks with programmatic checks.

Tasks come from a seed. Splits:
- ``train`` and ``eval``: each family draws parameter sets in a fixed order, worded with the *seen*
  templates and names (`envs.toy.families`); duplicates are dropped and every fourth distinct one
  is held out for ``eval``, so train and eval never share a task id or parameters.
- ``eval-phrasing``: tasks worded with the *unseen* templates and drawn from the unseen names and
  words (a stream of its own; ids ``<family>-pNNN``), none of which any train task uses.
- ``all``: the three together.
The fixed smoke task ``hello`` is in ``train`` (and ``all``) only.

With ``wording = "practice"`` the train and eval splits hold the same tasks worded instead with a
practice template (`envs.toy.families`: more wordings, none a train or eval-phrasing template), each
picked from the task's own seeded draw; ids ``<family>-rNNN``, no ``hello``. It words no eval-phrasing
task: the held-out wordings stay held out. ``practice_held_out = k`` keeps k of each family's practice
templates (a seeded pick) for the eval split alone: train tasks are worded with the others, so an eval
score measures wordings training never showed, as eval-phrasing does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from core.adapter import AdapterOptions, ConfigError, Environment, Names, Sandbox, Score, Task
from envs.toy.families import FAMILIES, HELLO, Family, Phrasing, most_practice_held_out
from envs.toy.workspace import Workspace

Split = Literal["train", "eval", "eval-phrasing", "all"]
Wording = Literal["templates", "practice"]
SPLITS: tuple[str, ...] = get_args(Split)
HELD_OUT = ("eval", "eval-phrasing")
DEFAULT_N = 5
EVAL_EVERY = 4  # distinct parameter set j goes to eval when j % EVAL_EVERY == EVAL_EVERY - 1
MAX_DRAWS = 5000


def _split_of(index: int) -> str:
    return "eval" if index % EVAL_EVERY == EVAL_EVERY - 1 else "train"


def family_tasks(family: Family, seed: int, split: str, n: int, wording: str = "templates", held_out: int = 0) -> list[Task]:
    """Up to ``n`` tasks of one family per requested split (each of them for ``all``), deterministic in ``seed``."""
    wanted = ("train", "eval", "eval-phrasing") if split == "all" else (split,)
    out: list[Task] = []
    if "train" in wanted or "eval" in wanted:
        seen = _seen_tasks(family, seed, [s for s in wanted if s != "eval-phrasing"], n)
        out += practice_tasks(family, seed, seen, held_out) if wording == "practice" else seen
    if "eval-phrasing" in wanted:
        out += _unseen_tasks(family, seed, n)
    return out


def _distinct_params(family: Family, rng: random.Random, phrasing: Phrasing) -> Iterator[dict[str, Any]]:
    """Parameter sets in draw order, each one's non-template part distinct from every earlier one's."""
    seen: set[str] = set()
    for _ in range(MAX_DRAWS):
        params = family.params(rng, phrasing)
        key = json.dumps({k: v for k, v in params.items() if k != "template"}, sort_keys=True)
        if key not in seen:
            seen.add(key)
            yield params


def _seen_tasks(family: Family, seed: int, wanted: list[str], n: int) -> list[Task]:
    got: dict[str, list[Task]] = {s: [] for s in wanted}
    rng = random.Random(f"toy:{seed}:{family.name}")
    for index, params in enumerate(_distinct_params(family, rng, "seen")):
        if all(len(v) >= n for v in got.values()):
            break
        which = _split_of(index)
        if which in got and len(got[which]) < n:
            got[which].append(make_task(family, f"{family.name}-{index:03d}", params, which))
    return [t for s in wanted for t in got[s]]


def _unseen_tasks(family: Family, seed: int, n: int) -> list[Task]:
    rng = random.Random(f"toy:{seed}:{family.name}:unseen")
    return [make_task(family, f"{family.name}-p{index:03d}", params, "eval-phrasing")
            for index, params in zip(range(n), _distinct_params(family, rng, "unseen"), strict=False)]


def practice_tasks(family: Family, seed: int, tasks: list[Task], held_out: int = 0) -> list[Task]:
    """`tasks` (one split's) worded with their family's practice templates in turn, in an order seeded per split, so a
    split of at least as many tasks as templates uses every one; ids ``<family>-rNNN``. With ``held_out`` k > 0 the eval
    split uses only k templates (`held_out_practice`) and the train split only the others."""
    orders: dict[str, list[int]] = {}  # per split: its seeded template order
    placed: dict[str, int] = {}  # tasks reworded so far, per split
    out: list[Task] = []
    for task in tasks:
        split = task.meta["split"]
        if split not in orders:
            usable = practice_templates_of(family, seed, split, held_out)
            orders[split] = random.Random(f"toy:{seed}:{family.name}:{split}:practice").sample(usable, len(usable))
        order = orders[split]
        placed[split] = placed.get(split, -1) + 1
        params = {**task.meta["params"], "practice": order[placed[split] % len(order)]}
        reworded = make_task(family, practice_id(task.id), params, split)
        reworded.meta["phrasing"] = "practice"
        out.append(reworded)
    return out


def held_out_practice(family: Family, seed: int, k: int) -> list[int]:
    """The k practice templates (indices, a pick seeded per family) that word only eval tasks; [] for k = 0."""
    count = len(family.practice_templates)
    return sorted(random.Random(f"toy:{seed}:{family.name}:practice-held-out").sample(range(count), k)) if k else []


def practice_templates_of(family: Family, seed: int, split: str, held_out: int) -> list[int]:
    """The practice templates that may word a `split` task: all, or with `held_out` k > 0 the held-out k (eval) or the rest (train)."""
    every = range(len(family.practice_templates))
    held = held_out_practice(family, seed, held_out)
    if not held:
        return list(every)
    return held if split == "eval" else [i for i in every if i not in held]


def practice_id(task_id: str) -> str:
    """The id a train or eval task's practice wording gets: ``<family>-NNN`` → ``<family>-rNNN``."""
    family, _, number = task_id.rpartition("-")
    return f"{family}-r{number}"


def make_task(family: Family, task_id: str, params: dict[str, Any], split: str) -> Task:
    return Task(
        id=task_id,
        instruction=family.instruction(params),
        files=dict(family.files(params)),
        meta={"family": family.name, "split": split, "params": params,
              "phrasing": "unseen" if split == "eval-phrasing" else "seen"},
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
    """Options: ``seed`` (0), ``split`` (train | eval | eval-phrasing | all), ``n`` tasks per family and split (5), ``families``,
    ``wording`` (templates | practice), ``practice_held_out``."""

    name = "toy"
    version = "1"

    class Options(AdapterOptions):
        seed: int = Field(0, description="fixes every task's parameters")
        split: Split = Field(
            "train", description="train; eval (train's wording, held-out parameters); eval-phrasing (unseen wording); all")
        n: int = Field(DEFAULT_N, ge=0, description="tasks per family and split")
        families: Names = Field(list(FAMILIES), description="the task families, a list or one comma-separated string (unset: all)")
        wording: Wording = Field(
            "templates", description="practice: train and eval tasks worded with the practice templates instead (no hello; "
            "never eval-phrasing)")
        practice_held_out: int = Field(
            0, ge=0, description="with wording practice: this many of each family's practice templates word only eval tasks, "
            "the rest only train tasks (0: both splits use all)")

        @model_validator(mode="after")
        def _practice_words_seen_splits(self) -> ToyEnv.Options:
            if self.wording == "practice" and self.split not in ("train", "eval"):
                raise ValueError(f"wording 'practice' rewords the train and eval splits only, not {self.split!r}: "
                                 "eval-phrasing keeps its held-out wordings")
            if self.practice_held_out and self.wording != "practice":
                raise ValueError("practice_held_out holds out practice templates: it needs wording 'practice'")
            most = most_practice_held_out(self.families or tuple(FAMILIES))
            if self.practice_held_out > most:
                raise ValueError(f"practice_held_out {self.practice_held_out}: at most {most}, so train tasks keep a practice template")
            return self

        @field_validator("families")
        @classmethod
        def _known(cls, families: list[str]) -> list[str]:
            unknown = [f for f in families if f not in FAMILIES]
            if unknown:
                raise ValueError(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
            return families or list(FAMILIES)

    opts: Options

    def tasks(self) -> list[Task]:
        out = [] if self.opts.split in HELD_OUT or self.opts.wording == "practice" else [hello_task("train")]
        for name in self.opts.families:
            out.extend(family_tasks(FAMILIES[name], self.opts.seed, self.opts.split, self.opts.n, self.opts.wording,
                                    self.opts.practice_held_out))
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
