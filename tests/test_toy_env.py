"""The toy environment: deterministic disjoint splits, and verifiers run against real sandboxes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from core.env import Task
from core.errors import ConfigError
from core.registry import load_env
from core.runtime import make_runtime
from core.runtime.base import SandboxSpec
from envs.toy import ToyEnv, solution_script
from envs.toy.families import WORDS

WORKDIR = "/workspace"


def by_id(tasks: list[Task]) -> dict[str, Task]:
    return {t.id: t for t in tasks}


def test_registered_and_hello_task() -> None:
    env = load_env("toy")
    assert isinstance(env, ToyEnv) and env.name == "toy" and env.version == "1"
    for split in ("train", "eval", "all"):
        hello = by_id(ToyEnv(split=split).tasks())["hello"]
        assert hello.instruction == "Create a file hello.txt containing hi in the workspace"
        assert hello.meta["family"] == "hello"


def test_deterministic_for_a_seed() -> None:
    a = [(t.id, t.content_hash) for t in ToyEnv(seed=7, split="all", n=6).tasks()]
    b = [(t.id, t.content_hash) for t in ToyEnv(seed=7, split="all", n=6).tasks()]
    c = [(t.id, t.content_hash) for t in ToyEnv(seed=8, split="all", n=6).tasks()]
    assert a == b
    assert a != c


def test_splits_disjoint_ids_unique_and_all_is_union() -> None:
    train = ToyEnv(seed=3, split="train", n=8).tasks()
    evals = ToyEnv(seed=3, split="eval", n=8).tasks()
    both = ToyEnv(seed=3, split="all", n=8).tasks()
    for tasks in (train, evals, both):
        assert len({t.id for t in tasks}) == len(tasks)
    assert {t.id for t in train} & {t.id for t in evals} == {"hello"}
    params = lambda ts: {(t.meta["family"], repr(t.meta["params"])) for t in ts if t.id != "hello"}  # noqa: E731
    assert not params(train) & params(evals)
    assert {t.id for t in both} == {t.id for t in train} | {t.id for t in evals}
    assert all(t.meta["split"] == "train" for t in train if t.id != "hello")
    assert all(t.meta["split"] == "eval" for t in evals if t.id != "hello")
    families = {t.meta["family"] for t in train} - {"hello"}
    assert families == {"write-file", "sum-numbers", "rename", "count-lines", "make-dirs"}
    assert sum(t.meta["family"] == "rename" for t in train) == 8


def test_options_validated_and_families_filter() -> None:
    with pytest.raises(ConfigError, match="split"):
        ToyEnv(split="test")
    with pytest.raises(ConfigError, match="unknown families"):
        ToyEnv(families=["nope"])
    tasks = ToyEnv(families="rename,make-dirs", n=2).tasks()
    assert [t.meta["family"] for t in tasks] == ["hello", "rename", "rename", "make-dirs", "make-dirs"]
    # an option meant for another env (harbor's path, a typo) is an error naming the ones toy takes
    with pytest.raises(ConfigError, match=r"env 'toy' has no option 'path', 'splits'; it accepts: families, n, seed, split"):
        load_env("toy", path="/tmp/suite", splits="eval")
    with pytest.raises(ConfigError, match=r"env 'claw-bench' has no option 'split'; it accepts: domains, ids, levels, tasks_dir, workdir"):
        load_env("claw-bench", split="eval")


def test_word_list_has_no_substrings() -> None:
    assert not [(a, b) for a in WORDS for b in WORDS if a != b and a in b]


@pytest_asyncio.fixture
async def local_sandbox(tmp_path) -> AsyncIterator[Any]:
    runtime = make_runtime("local", base_dir=tmp_path / "sandboxes")
    box = runtime.create(SandboxSpec(image="none", run_id="test-toy", rollout_id=uuid.uuid4().hex[:8]))
    await box.start()
    yield box
    await box.stop()


async def prepare(box: Any, task: Task) -> None:
    for rel, data in task.files.items():
        await box.put_file(f"{WORKDIR}/{rel}", data.encode() if isinstance(data, str) else data)


async def run(box: Any, script: str) -> None:
    res = await box.exec(script, timeout_s=30, workdir=WORKDIR)
    assert res.exit_code == 0, res.stderr


@pytest.mark.parametrize("task", ToyEnv(split="all", n=3).tasks(), ids=lambda t: t.id)
async def test_reference_solution_passes_and_nothing_fails(local_sandbox: Any, task: Task) -> None:
    env = ToyEnv()
    await prepare(local_sandbox, task)
    before = await env.verify(local_sandbox, task, WORKDIR)
    assert before.score < 1.0 and not before.passed
    await run(local_sandbox, solution_script(task))
    after = await env.verify(local_sandbox, task, WORKDIR)
    assert after.score == 1.0 and after.passed, after.detail


async def test_hello_by_hand(local_sandbox: Any) -> None:
    env = ToyEnv()
    task = by_id(env.tasks())["hello"]
    await run(local_sandbox, "echo hello > hello.txt")
    wrong = await env.verify(local_sandbox, task, WORKDIR)
    assert (wrong.score, wrong.passed) == (0.0, False) and "'hello'" in wrong.detail
    await run(local_sandbox, "printf 'hi' > hello.txt")
    assert (await env.verify(local_sandbox, task, WORKDIR)).passed


async def test_rename_partial_credit(local_sandbox: Any) -> None:
    env = ToyEnv(families=["rename"], n=10)
    task = next(t for t in env.tasks() if len(t.meta["params"].get("stems", [])) == 4)
    p = task.meta["params"]
    await prepare(local_sandbox, task)
    stems = p["stems"]
    for stem in stems[:3]:
        await run(local_sandbox, f"mv {stem}.{p['from']} {stem}.{p['to']}")
    score = await env.verify(local_sandbox, task, WORKDIR)
    assert score.score == pytest.approx(0.75) and not score.passed
    assert "renamed 3/4" in score.detail
    # copying instead of moving leaves the old file: no credit for that one
    await run(local_sandbox, f"cp {stems[3]}.{p['from']} {stems[3]}.{p['to']}")
    assert (await env.verify(local_sandbox, task, WORKDIR)).score == pytest.approx(0.75)


async def test_make_dirs_partial_and_file_is_not_dir(local_sandbox: Any) -> None:
    env = ToyEnv(families=["make-dirs"], n=10)
    task = next(t for t in env.tasks() if len(t.meta["params"].get("dirs", [])) >= 2)
    dirs = task.meta["params"]["dirs"]
    await run(local_sandbox, f"mkdir -p {dirs[0]} && mkdir -p $(dirname {dirs[1]}) && touch {dirs[1]}")
    score = await env.verify(local_sandbox, task, WORKDIR)
    assert score.score == pytest.approx(1 / len(dirs))
    assert dirs[1] in score.detail


async def test_sum_wrong_answer_fails(local_sandbox: Any) -> None:
    env = ToyEnv(families=["sum-numbers"], n=1)
    task = env.tasks()[1]
    await prepare(local_sandbox, task)
    await run(local_sandbox, f"echo {sum(task.meta['params']['numbers']) + 1} > sum.txt")
    assert not (await env.verify(local_sandbox, task, WORKDIR)).passed


async def test_foreign_task_scores_zero(local_sandbox: Any) -> None:
    score = await ToyEnv().verify(
        local_sandbox, Task(id="x", instruction="?", meta={"family": "other"}), WORKDIR
    )
    assert (score.score, score.passed) == (0.0, False) and "not a toy task" in score.detail


@pytest.mark.docker
async def test_hello_in_docker(docker_runtime: Any, base_image: str, run_id: str) -> None:
    env = ToyEnv()
    task = by_id(env.tasks())["hello"]
    box = docker_runtime.create(SandboxSpec(image=base_image, run_id=run_id, rollout_id="toy-hello"))
    await box.start()
    try:
        assert not (await env.verify(box, task, WORKDIR)).passed
        await run(box, solution_script(task))
        score = await env.verify(box, task, WORKDIR)
        assert score.passed and score.score == 1.0, score.detail
    finally:
        await box.stop()
