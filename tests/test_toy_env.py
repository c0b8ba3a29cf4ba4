"""The toy environment: deterministic disjoint splits, and verifiers run against real sandboxes."""

from __future__ import annotations

import difflib
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from core.env import Task, is_held_out
from core.errors import ConfigError
from core.registry import load_env
from core.runtime import make_runtime
from core.runtime.base import SandboxSpec
from envs.toy import ToyEnv, solution_script
from envs.toy.families import (
    COUNT_FILES,
    DIR_LEAVES,
    DIR_ROOTS,
    EXTENSIONS,
    FAMILIES,
    FILENAMES,
    LOG_FILES,
    NUMBER_FILES,
    PHRASINGS,
    SUM_FILES,
    WORDS,
    pool,
    template_indices,
)

WORKDIR = "/workspace"


def by_id(tasks: list[Task]) -> dict[str, Task]:
    return {t.id: t for t in tasks}


def test_registered_and_hello_task_in_train_only() -> None:
    env = load_env("toy")
    assert isinstance(env, ToyEnv) and env.name == "toy" and env.version == "1"
    for split in ("train", "all"):
        hello = by_id(ToyEnv(split=split).tasks())["hello"]
        assert hello.instruction == "Create a file hello.txt containing hi in the workspace"
        assert hello.meta["family"] == "hello" and hello.meta["split"] == "train"
    for split in ("eval", "eval-phrasing"):  # a train task: never part of a held-out pass rate
        assert "hello" not in by_id(ToyEnv(split=split).tasks())


def test_deterministic_for_a_seed() -> None:
    a = [(t.id, t.content_hash) for t in ToyEnv(seed=7, split="all", n=6).tasks()]
    b = [(t.id, t.content_hash) for t in ToyEnv(seed=7, split="all", n=6).tasks()]
    c = [(t.id, t.content_hash) for t in ToyEnv(seed=8, split="all", n=6).tasks()]
    assert a == b
    assert a != c


def params_of(tasks: list[Task]) -> set[tuple[str, str]]:
    """(family, parameters without the template) of each non-hello task."""
    return {(t.meta["family"], repr({k: v for k, v in t.meta["params"].items() if k != "template"})) for t in tasks if t.id != "hello"}


def test_splits_disjoint_ids_unique_and_all_is_union() -> None:
    train = ToyEnv(seed=3, split="train", n=8).tasks()
    evals = ToyEnv(seed=3, split="eval", n=8).tasks()
    phrasing = ToyEnv(seed=3, split="eval-phrasing", n=8).tasks()
    both = ToyEnv(seed=3, split="all", n=8).tasks()
    for tasks in (train, evals, phrasing, both):
        assert len({t.id for t in tasks}) == len(tasks)
    ids = lambda ts: {t.id for t in ts}  # noqa: E731
    assert not ids(train) & ids(evals) and not ids(train) & ids(phrasing) and not ids(evals) & ids(phrasing)
    assert not params_of(train) & params_of(evals) and not params_of(train) & params_of(phrasing)
    assert ids(both) == ids(train) | ids(evals) | ids(phrasing)
    assert all(t.meta["split"] == "train" for t in train)
    assert all(t.meta["split"] == "eval" and t.meta["phrasing"] == "seen" for t in evals)
    assert all(t.meta["split"] == "eval-phrasing" and t.meta["phrasing"] == "unseen" for t in phrasing)
    families = {t.meta["family"] for t in train} - {"hello"}
    assert families == {"write-file", "sum-numbers", "rename", "count-lines", "make-dirs"}
    for tasks in (train, evals, phrasing):
        assert sum(t.meta["family"] == "rename" for t in tasks) == 8


def test_both_eval_splits_are_held_out_from_training() -> None:
    assert not any(is_held_out(t) for t in ToyEnv(split="train").tasks())
    assert all(is_held_out(t) for t in ToyEnv(split="eval").tasks() + ToyEnv(split="eval-phrasing").tasks())


def test_template_sets_and_name_pools_are_disjoint() -> None:
    for family in FAMILIES.values():
        seen, unseen = (template_indices(family.templates, p) for p in PHRASINGS)
        assert len(seen) >= 8 and len(unseen) >= 4, family.name
        assert not {family.templates[i] for i in seen} & {family.templates[i] for i in unseen}
        assert set(seen) | set(unseen) == set(range(len(family.templates)))
    for items in (WORDS, FILENAMES, NUMBER_FILES, SUM_FILES, LOG_FILES, COUNT_FILES, EXTENSIONS, DIR_ROOTS, DIR_LEAVES):
        seen, unseen = pool(items, "seen"), pool(items, "unseen")
        assert seen and unseen and not set(seen) & set(unseen)
    # input and output names never collide, so a task's answer never overwrites its input
    assert not set(NUMBER_FILES) & set(SUM_FILES) and not set(LOG_FILES) & set(COUNT_FILES)


def template_pattern(template: str) -> re.Pattern[str]:
    """A regex that matches every instruction `template` can render, whatever its fields hold."""
    parts = re.split(r"\{[a-z_]+\}", template)
    return re.compile(".+".join(re.escape(p) for p in parts), re.DOTALL)


def test_every_eval_phrasing_instruction_shares_no_template_with_train() -> None:
    train = ToyEnv(seed=0, split="train", n=60).tasks()
    phrasing = ToyEnv(seed=0, split="eval-phrasing", n=30).tasks()
    for family in FAMILIES.values():
        used_in_train = {t.meta["params"]["template"] for t in train if t.meta["family"] == family.name}
        assert used_in_train == set(template_indices(family.templates, "seen")), family.name
        seen_patterns = [template_pattern(family.templates[i]) for i in used_in_train]
        mine = [t for t in phrasing if t.meta["family"] == family.name]
        assert len(mine) == 30
        assert {t.meta["params"]["template"] for t in mine} == set(template_indices(family.templates, "unseen"))
        for task in mine:
            # no train template could have produced this sentence, whatever its fields
            assert not [p.pattern for p in seen_patterns if p.fullmatch(task.instruction)], task.instruction
            assert template_pattern(family.templates[task.meta["params"]["template"]]).fullmatch(task.instruction)
    # and the other way round: the held-out sentences never word a train task
    for task in train:
        if task.id != "hello":
            family = FAMILIES[task.meta["family"]]
            unseen = [template_pattern(family.templates[i]) for i in template_indices(family.templates, "unseen")]
            assert not [p for p in unseen if p.fullmatch(task.instruction)], task.instruction


NAME_POOLS = {"path": FILENAMES, "src": NUMBER_FILES + LOG_FILES, "dst": SUM_FILES + COUNT_FILES}


def test_eval_phrasing_names_and_words_come_from_the_unseen_pools() -> None:
    names = FILENAMES + NUMBER_FILES + SUM_FILES + LOG_FILES + COUNT_FILES
    assert len(set(names)) == len(names)  # one name, one pool: an unseen name is unseen in every family
    unseen_words = set(pool(WORDS, "unseen"))
    for task in ToyEnv(seed=0, split="eval-phrasing", n=20).tasks():
        p = task.meta["params"]
        assert {p[k] for k in ("content", "word") if k in p} | set(p.get("stems", [])) <= unseen_words
        for key, items in NAME_POOLS.items():
            if key in p:
                assert p[key] in pool(items, "unseen"), (task.id, key)
        if "from" in p:
            assert (p["from"], p["to"]) in pool(EXTENSIONS, "unseen")
        for d in p.get("dirs", []):
            root, leaf = d.split("/")
            assert root in pool(DIR_ROOTS, "unseen") and leaf in pool(DIR_LEAVES, "unseen")


def test_options_validated_and_families_filter() -> None:
    with pytest.raises(ConfigError, match="split"):
        ToyEnv(split="test")
    with pytest.raises(ConfigError, match="unknown families"):
        ToyEnv(families=["nope"])
    tasks = ToyEnv(families="rename,make-dirs", n=2).tasks()
    assert [t.meta["family"] for t in tasks] == ["hello", "rename", "rename", "make-dirs", "make-dirs"]
    assert [t.meta["family"] for t in ToyEnv(families="rename", n=2, split="eval-phrasing").tasks()] == ["rename", "rename"]
    # an option meant for another env (harbor's path, a typo) is an error naming the ones toy takes
    with pytest.raises(ConfigError, match=r"env 'toy' has no option 'path', 'splits'; it accepts: families, n, practice_held_out, seed, split, wording"):
        load_env("toy", path="/tmp/suite", splits="eval")
    with pytest.raises(ConfigError, match="eval-phrasing"):  # the error lists every split
        ToyEnv(split="phrasing")
    with pytest.raises(ConfigError, match=r"env 'claw-bench' has no option 'split'; it accepts: domains, ids, levels, tasks_dir, workdir"):
        load_env("claw-bench", split="eval")


def test_practice_wording_rewords_the_same_train_and_eval_tasks_with_templates_no_split_uses() -> None:
    for split in ("train", "eval"):
        plain = [t for t in ToyEnv(seed=4, split=split, n=40).tasks() if t.id != "hello"]
        practice = ToyEnv(seed=4, split=split, n=40, wording="practice").tasks()
        assert [t.id for t in practice] == [t.id.rsplit("-", 1)[0] + "-r" + t.id.rsplit("-", 1)[1] for t in plain]  # no hello
        assert [(t.meta["family"], t.meta["split"], is_held_out(t)) for t in practice] == [(t.meta["family"], split, split == "eval") for t in plain]
        assert all(t.meta["phrasing"] == "practice" for t in practice)
        assert [{k: v for k, v in t.meta["params"].items() if k != "practice"} for t in practice] == [t.meta["params"] for t in plain]
        assert [t.files for t in practice] == [t.files for t in plain]  # the same task
        assert [(t.id, t.instruction) for t in practice] == [(t.id, t.instruction) for t in ToyEnv(seed=4, split=split, n=40, wording="practice").tasks()]
        for task in practice:
            family = FAMILIES[task.meta["family"]]
            assert template_pattern(family.practice_templates[task.meta["params"]["practice"]]).fullmatch(task.instruction)
            # no train, eval or eval-phrasing template could have produced it
            assert not [t for t in family.templates if template_pattern(t).fullmatch(task.instruction)], task.instruction
        for family in FAMILIES.values():
            used = {t.meta["params"]["practice"] for t in practice if t.meta["family"] == family.name}
            assert split == "eval" or used == set(range(len(family.practice_templates))), family.name
    for family in FAMILIES.values():
        assert len(family.practice_templates) >= 8 and not set(family.practice_templates) & set(family.templates)
    for split in ("eval-phrasing", "all"):  # the held-out wordings are never reworded
        with pytest.raises(ConfigError, match="rewords the train and eval splits only"):
            ToyEnv(split=split, wording="practice")
    with pytest.raises(ConfigError, match="wording"):
        ToyEnv(wording="paraphrase")


def test_no_practice_wording_is_a_near_copy_of_an_eval_phrasing_template() -> None:
    """GRPO trains on practice wordings and eval-phrasing measures transfer: a practice sentence one word away from a
    held-out template would measure memory. The bound sits above the closest pair today (0.82)."""
    for family in FAMILIES.values():
        held_out = [family.templates[i] for i in template_indices(family.templates, "unseen")]
        for practice in family.practice_templates:
            closest = max(difflib.SequenceMatcher(None, practice.lower(), t.lower()).ratio() for t in held_out)
            assert closest < 0.85, (family.name, practice)
    assert len(set(FAMILIES["write-file"].practice_templates)) == len(FAMILIES["write-file"].practice_templates) >= 20


def test_practice_held_out_words_eval_tasks_with_templates_no_train_task_uses() -> None:
    picks = {}
    for seed in (0, 1, 2):
        train = ToyEnv(seed=seed, split="train", n=20, wording="practice", practice_held_out=4).tasks()
        held = ToyEnv(seed=seed, split="eval", n=5, wording="practice", practice_held_out=4).tasks()
        plain = ToyEnv(seed=seed, split="train", n=20, wording="practice").tasks()
        assert [t.id for t in train] == [t.id for t in plain]  # the same tasks, only the wording differs
        for family in FAMILIES.values():
            used = {t.meta["params"]["practice"] for t in train if t.meta["family"] == family.name}
            kept = {t.meta["params"]["practice"] for t in held if t.meta["family"] == family.name}
            assert len(kept) == 4 and len(used) == len(family.practice_templates) - 4 and used.isdisjoint(kept), family.name
            train_text = {t.instruction for t in train if t.meta["family"] == family.name}
            for task in (t for t in held if t.meta["family"] == family.name):  # no train task is worded like a held-out one
                pattern = template_pattern(family.practice_templates[task.meta["params"]["practice"]])
                assert not [x for x in train_text if pattern.fullmatch(x)], task.instruction
            picks.setdefault(family.name, set()).add(frozenset(kept))
    assert any(len(p) > 1 for p in picks.values())  # the pick is seeded, not a fixed four
    # 0 changes nothing: the same ids and wordings as without the option
    assert [(t.id, t.instruction) for t in ToyEnv(seed=3, split="eval", n=5, wording="practice", practice_held_out=0).tasks()] == \
        [(t.id, t.instruction) for t in ToyEnv(seed=3, split="eval", n=5, wording="practice").tasks()]
    with pytest.raises(ConfigError, match="needs wording 'practice'"):
        ToyEnv(split="eval", practice_held_out=2)
    most = min(len(f.practice_templates) for f in FAMILIES.values()) - 1  # every train task keeps a wording
    with pytest.raises(ConfigError, match=f"at most {most}"):
        ToyEnv(split="train", wording="practice", practice_held_out=most + 1)
    assert len(ToyEnv(split="train", n=40, wording="practice", practice_held_out=most).tasks()) == 40 * len(FAMILIES)


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


def covering_tasks() -> list[Task]:
    """Few tasks that together use every template of every family and every item of its name pools."""

    def features(task: Task) -> set[tuple[str, str, Any]]:
        p, family = task.meta["params"], task.meta["family"]
        out = {(family, "template", p.get("template"))}
        out |= {(family, key, p[key]) for key in ("path", "src", "dst", "from") if key in p}
        for d in p.get("dirs", []):
            out |= {(family, "root", d.split("/")[0]), (family, "leaf", d.split("/")[1])}
        return out

    candidates = ToyEnv(split="all", n=60).tasks()
    covered: set[tuple[str, str, Any]] = set()
    chosen = []
    while True:  # greedy set cover: each pick adds the most features not yet covered
        best = max(candidates, key=lambda t: len(features(t) - covered))
        if not features(best) - covered:
            return chosen
        chosen.append(best)
        covered |= features(best)


def test_the_covering_set_covers_every_template_and_name() -> None:
    tasks = covering_tasks()
    for family in FAMILIES.values():
        mine = [t.meta["params"] for t in tasks if t.meta["family"] == family.name]
        assert {p["template"] for p in mine} == set(range(len(family.templates))), family.name
    wf = [t.meta["params"]["path"] for t in tasks if t.meta["family"] == "write-file"]
    assert set(wf) == set(FILENAMES)
    assert {(t.meta["params"]["from"], t.meta["params"]["to"]) for t in tasks if t.meta["family"] == "rename"} == set(EXTENSIONS)


@pytest.mark.docker
async def test_reference_solutions_pass_for_every_template_and_pool_in_docker(docker_runtime: Any, base_image: str, run_id: str) -> None:
    """Each family's checker passes its reference solution (and fails before it) for every template and name pool."""
    env = ToyEnv()
    tasks = covering_tasks()
    box = docker_runtime.create(SandboxSpec(image=base_image, run_id=run_id, rollout_id="toy-cover"))
    await box.start()
    try:
        for task in tasks:
            workdir = f"{WORKDIR}/{task.id}"
            await box.exec(["mkdir", "-p", workdir], timeout_s=30)
            for rel, data in task.files.items():
                await box.put_file(f"{workdir}/{rel}", data.encode() if isinstance(data, str) else data)
            before = await env.verify(box, task, workdir)
            assert not before.passed, (task.id, before.detail)
            res = await box.exec(solution_script(task), timeout_s=30, workdir=workdir)
            assert res.exit_code == 0 or task.meta["family"] == "count-lines", (task.id, res.stderr)  # grep -c exits 1 on 0 matches
            after = await env.verify(box, task, workdir)
            assert after.score == 1.0 and after.passed, (task.id, task.instruction, after.detail)
    finally:
        await box.stop()
