"""Which tasks each training step runs (core/train/batches.py): seeded epochs that mix families, refills, resumability."""

from __future__ import annotations

from collections import Counter

from core.registry import load_env
from core.session.setup import select_tasks
from core.train.batches import TaskSchedule


def toy_train() -> tuple:
    return tuple(select_tasks(load_env("toy", split="train", n=20, families="write-file,sum-numbers,count-lines,make-dirs,rename"), None, None))


def family(task) -> str:
    return task.meta["family"]


def test_each_epoch_runs_every_task_once_in_a_new_order() -> None:
    tasks = toy_train()
    schedule = TaskSchedule(tasks, per_step=6, seed=3)
    n = len(tasks)
    stream = [t.id for step in range(n) for t in schedule.batch(step)]  # 6 epochs' worth
    first, second = stream[:n], stream[n : 2 * n]
    assert sorted(first) == sorted(t.id for t in tasks)
    assert sorted(second) == sorted(first) and second != first
    assert first != [t.id for t in tasks]  # not the env's order
    for step in range(n):
        ids = [t.id for t in schedule.batch(step)]
        assert len(ids) == len(set(ids)) == 6  # a batch across an epoch's end holds no task twice


def test_the_first_steps_mix_the_families_the_env_lists_together() -> None:
    tasks = toy_train()
    assert {family(t) for t in tasks[:24]} == {"hello", "write-file", "sum-numbers"}  # the env lists a family's tasks together
    shuffled = Counter(family(t) for step in range(4) for t in TaskSchedule(tasks, per_step=6, seed=0).batch(step))
    assert len(shuffled) >= 5 and max(shuffled.values()) <= 10
    in_order = Counter(family(t) for step in range(4) for t in TaskSchedule(tasks, per_step=6, shuffle=False).batch(step))
    assert set(in_order) == {"hello", "write-file", "sum-numbers"}


def test_batches_depend_only_on_seed_and_step() -> None:
    tasks = toy_train()
    a, b, c = TaskSchedule(tasks, 6, seed=1), TaskSchedule(tasks, 6, seed=1), TaskSchedule(tasks, 6, seed=2)
    assert [t.id for t in a.batch(7)] == [t.id for t in b.batch(7)]  # a resumed run draws what it drew before
    assert [t.id for t in a.batch(7)] != [t.id for t in c.batch(7)]
    assert [t.id for t in a.refill(7, a.batch(7), 6)] == [t.id for t in b.refill(7, b.batch(7), 6)]


def test_refills_take_tasks_the_step_has_not_run_from_across_the_list() -> None:
    tasks = toy_train()
    schedule = TaskSchedule(tasks, per_step=6, seed=0)
    batch = schedule.batch(0)
    more = schedule.refill(0, batch, 6)
    assert len(more) == 6 and not {t.id for t in more} & {t.id for t in batch}
    assert more != [t for t in tasks if t not in batch][:6]  # not the env's first unused tasks, every step the same ones
    assert sorted(t.id for t in schedule.refill(0, list(tasks)[:-2], 6)) == sorted(t.id for t in tasks[-2:])  # all that is left
    assert TaskSchedule(tasks, per_step=6, shuffle=False).refill(0, batch, 2) == [t for t in tasks if t not in batch][:2]


def test_no_per_step_runs_every_task_every_step_in_the_envs_order() -> None:
    tasks = toy_train()[:5]
    assert TaskSchedule(tasks, per_step=None, seed=9).batch(4) == list(tasks)
    assert TaskSchedule(tasks, per_step=8, seed=9).batch(4) == list(tasks)


def test_a_stratified_batch_holds_every_family_each_step_and_walks_each_familys_tasks_in_epochs() -> None:
    tasks = tuple(t for t in toy_train() if family(t) != "hello")  # 5 families x 20 tasks, as the learning benchmark trains
    schedule = TaskSchedule(tasks, per_step=6, seed=5, stratify="family")
    families = {family(t) for t in tasks}
    for step in range(40):
        batch = schedule.batch(step)
        assert len(batch) == len({t.id for t in batch}) == 6
        assert {family(t) for t in batch} == families, f"step {step} left a family out"
    # each family's tasks: every one once before any repeats, in a seeded order that is not the env's
    drawn: dict[str, list[str]] = {}
    for step in range(40):
        for t in schedule.batch(step):
            drawn.setdefault(family(t), []).append(t.id)
    for name, ids in drawn.items():
        own = [t.id for t in tasks if family(t) == name]
        assert sorted(ids[: len(own)]) == sorted(own) and ids[: len(own)] != own, name
    # unstratified, the same seed leaves some step without some family (the failure this guards against)
    plain = TaskSchedule(tasks, per_step=6, seed=5)
    assert any({family(t) for t in plain.batch(step)} != families for step in range(40))


def test_stratified_refills_deal_over_the_families_and_everything_depends_on_seed_and_step() -> None:
    tasks = tuple(t for t in toy_train() if family(t) != "hello")
    a, b = TaskSchedule(tasks, 6, seed=2, stratify="family"), TaskSchedule(tasks, 6, seed=2, stratify="family")
    batch = a.batch(3)
    more = a.refill(3, batch, 10)
    assert len(more) == 10 and not {t.id for t in more} & {t.id for t in batch}
    assert Counter(family(t) for t in more) == Counter({f: 2 for f in {family(t) for t in tasks}})
    assert [t.id for t in more] == [t.id for t in b.refill(3, b.batch(3), 10)]
    assert [t.id for t in a.batch(3)] != [t.id for t in TaskSchedule(tasks, 6, seed=3, stratify="family").batch(3)]
    # a family with fewer tasks than its share is dealt what it has, never a task twice; tasks without the key form their own group
    few = (*[t for t in tasks if family(t) == "rename"][:1], *[t for t in tasks if family(t) == "write-file"][:9], *[t for t in toy_train() if family(t) == "hello"][:2])
    s = TaskSchedule(few, per_step=6, seed=0, stratify="no-such-key")
    assert len({t.id for t in s.batch(0)}) == 6
    small = TaskSchedule(few, per_step=6, seed=0, stratify="family")
    for step in range(5):
        ids = [t.id for t in small.batch(step)]
        assert len(ids) == len(set(ids)) == 6 and {family(t) for t in small.batch(step)} == {"rename", "write-file", "hello"}
