"""GRPO made steadier: dynamic sampling's refill size, eval-split checkpoint selection, seeds, KL/entropy terms, stage events."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from core.train.advantages import compute_advantages
from core.train.dynamic_sampling import plan_refill
from core.train.selection import BestCheckpoint
from core.train.types import Sample
from forgetui.learning import (
    Plan,
    base_config,
    grpo,
    grpo_config,
    reusable,
    select_steps,
    split_result,
)
from forgetui.learning_events import EventLog, LearningState, load_state, read_new


def rollouts(rewards_by_task: dict[str, list[float]], step: int = 0) -> list[Sample]:
    """One sample per rollout, as `samples_for_run` gives them: a group per task, its rollouts' rewards."""
    return [Sample(sample_id=f"{task}/{i}", run_id="run", rollout_id=f"run/{task}/{i}/s{step}", task_id=task, branch=0, step=step,
                   token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -2.0], prompt_tokens=1, reward=r)
            for task, rewards in rewards_by_task.items() for i, r in enumerate(rewards)]


MIXED, FLAT_PASS, FLAT_FAIL = [1.0, 0.0, 1.0, 0.0], [1.0] * 4, [0.0] * 4


def groups(mixed: int, flat: int) -> dict[str, list[float]]:
    return {**{f"m{i}": MIXED for i in range(mixed)}, **{f"f{i}": FLAT_PASS if i % 2 else FLAT_FAIL for i in range(flat)}}


def test_a_refill_is_sized_by_the_share_of_groups_with_signal() -> None:
    samples = rollouts(groups(2, 4))
    stats = compute_advantages(samples)
    assert sum(1 for s in samples if s.advantage != 0.0) == 8  # the two mixed groups train, the four flat ones do not
    refill = plan_refill(stats, target=6, cap=12)
    assert (refill.informative, refill.scored, refill.tasks) == (2, 6, 11)  # ⌈4 / (3/8)⌉
    assert plan_refill(compute_advantages(rollouts(groups(5, 1))), 6, 12).tasks == 2  # ⌈1 / (6/8)⌉
    assert plan_refill(compute_advantages(rollouts(groups(0, 6))), 6, 12).tasks == 12  # none yet: the cap
    assert plan_refill(compute_advantages(rollouts(groups(6, 0))), 6, 12).tasks == 0  # reached
    assert plan_refill(compute_advantages(rollouts(groups(2, 4))), 6, 0).tasks == 0


def test_a_step_that_already_has_its_groups_with_signal_stops_refilling() -> None:
    """After one refill, 6 of 10 groups have signal: DAPO's target (the batch's 6 tasks) is met; the old rule asked for 4 more."""
    stats = compute_advantages(rollouts(groups(6, 4)))
    assert plan_refill(stats, target=6, cap=12).tasks == 0


def test_singleton_groups_are_not_counted_as_scored() -> None:
    stats = compute_advantages(rollouts({"a": [1.0], "b": MIXED, "c": FLAT_FAIL}))
    refill = plan_refill(stats, target=2, cap=8)
    assert (refill.informative, refill.scored, refill.tasks) == (1, 2, 2)  # ⌈1 / (2/4)⌉
    with pytest.raises(ValueError, match="target"):
        plan_refill(stats, target=0, cap=8)


def test_the_best_checkpoint_is_kept_ties_keep_the_earlier_and_patience_stops() -> None:
    best = BestCheckpoint(patience=2)
    assert best.offer(3, "/ck/3", 0.60) and not best.offer(7, "/ck/7", 0.60)  # a tie: the earlier stays
    assert best.offer(11, "/ck/11", 0.72) and best.best.step == 11 and not best.stop
    assert not best.offer(15, "/ck/15", 0.70) and not best.offer(19, "/ck/19", 0.71) and best.stop
    assert best.as_dict()["best_step"] == 11 and [c["step"] for c in best.as_dict()["scores"]] == [3, 7, 11, 15, 19]
    with pytest.raises(ValueError, match="pass rate"):
        best.offer(1, "/ck/1", 1.5)


class FakeEngine:
    """`forgetui.learning.run` for GRPO: each call trains from where run `resume` stopped up to `config.train.steps`."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, str | None]] = []  # (first step, train.steps, resumed run)
        self.done = 0

    def __call__(self, config, label, plan, on_step=None, resume=None):
        from types import SimpleNamespace

        assert label == "grpo-train" and (resume is None) == (self.done == 0)
        first = self.done
        self.calls.append((first, config.train.steps, resume))
        for step in range(first, config.train.steps):
            on_step({"step": step, "reward_mean": 0.5, "samples": 24, "samples_trained": 16})
        self.done = config.train.steps
        return SimpleNamespace(run_id="g", extra={"checkpoint": f"/runs/g/checkpoints/step-{config.train.steps - 1:05d}"})


def scored_at(rates: dict[int, float], seen: list) -> object:
    """`forgetui.learning.evaluate` scoring each checkpoint by its step; records what it was asked."""

    def fake_evaluate(plan: Plan, backend: str, label: str, report=print, events=None, wording: str = "templates") -> dict:
        assert wording == ("practice" if plan.select_wordings == "practice" else "templates")
        seen.append((plan.eval_splits, plan.eval_n, plan.eval_samples, backend))
        name = Path(backend.split(":", 1)[1].split("?")[0]).name
        step = -1 if name == "sft" else int(name.removeprefix("step-"))  # the start, /ck/sft: START_STEP
        passed = round(rates[step] * 20)
        per_task = {f"t{i}": {"family": "write-file", "passed": 2 if i < passed // 2 else 0, "scored": 2, "reward": 0.0} for i in range(10)}
        return {"splits": {"eval": split_result(per_task, "r")}}

    return fake_evaluate


def test_selection_scores_every_kth_and_the_last_checkpoint_on_the_eval_split_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training pauses at steps 3, 7, 11, each checkpoint scored on `eval` (never eval-phrasing), the best kept; one run resumed."""
    import forgetui.learning as learning

    assert select_steps(Plan(grpo_steps=12, select_every=4)) == [3, 7, 11]
    assert select_steps(Plan(grpo_steps=4, select_every=3)) == [2, 3] and select_steps(Plan(select_every=0)) == []
    seen: list = []
    engine = FakeEngine()
    monkeypatch.setattr(learning, "evaluate", scored_at({3: 0.4, 7: 0.7, 11: 0.6}, seen))
    monkeypatch.setattr(learning, "run", engine)
    events: list[dict] = []
    plan = Plan(grpo_steps=12, select_every=4, select_eval_n=2, select_samples=2, eval_splits=("eval-phrasing",))
    path, steps, selection = grpo(plan, "/ck/sft", lambda _: None, events.append)
    assert path == "/runs/g/checkpoints/step-00007" and selection["best_step"] == 7 and not selection["early_stop"]
    assert engine.calls == [(0, 4, None), (4, 8, "g"), (8, 12, "g")] and [m["step"] for m in steps] == list(range(12))
    assert {s[:3] for s in seen} == {(("eval",), 2, 2)}  # the eval split, never eval-phrasing
    assert [s[3] for s in seen] == [f"builtin:/runs/g/checkpoints/step-{n:05d}" for n in (3, 7, 11)]
    assert [(e["step"], e["best"]) for e in events if e["event"] == "select"] == [(3, True), (7, True), (11, False)]
    assert plan.eval_splits == ("eval-phrasing",)  # the plan itself is left as it was


def test_patience_stops_grpo_the_steps_after_never_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """select_patience 1: step 7 does not beat step 3, so steps 8-15 are not trained and step 3's checkpoint is kept."""
    import forgetui.learning as learning

    engine = FakeEngine()
    monkeypatch.setattr(learning, "evaluate", scored_at({3: 0.6, 7: 0.6, 11: 0.9, 15: 0.9}, []))
    monkeypatch.setattr(learning, "run", engine)
    events: list[dict] = []
    lines: list[str] = []
    plan = Plan(grpo_steps=16, select_every=4, select_patience=1)
    path, steps, selection = grpo(plan, "/ck/sft", lines.append, events.append)
    assert engine.calls == [(0, 4, None), (4, 8, "g")] and [m["step"] for m in steps] == list(range(8))
    assert path.endswith("step-00003") and selection["early_stop"] and selection["stopped_after"] == 7
    assert [c["step"] for c in selection["scores"]] == [3, 7]
    assert [e for e in events if e["event"] == "early_stop"] == [{"event": "early_stop", "step": 7, "best_step": 3}]
    assert any("early stop after step 7" in line and "steps 8-15 not run" in line for line in lines)
    # without patience the same scores run every step and keep step 11 (a tie keeps the earlier)
    engine = FakeEngine()
    monkeypatch.setattr(learning, "run", engine)
    path, steps, selection = grpo(Plan(grpo_steps=16, select_every=4), "/ck/sft", lambda _: None)
    assert len(steps) == 16 and path.endswith("step-00011") and not selection["early_stop"]


def test_the_start_scored_first_is_kept_when_no_step_beats_it_and_patience_counts_from_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """select_start: the SFT checkpoint is scored before any training; steps 3 and 7 do not beat it, so with patience 2
    GRPO stops after step 7 and the start is what the stage keeps."""
    import forgetui.learning as learning

    seen: list = []
    engine = FakeEngine()
    monkeypatch.setattr(learning, "evaluate", scored_at({-1: 0.8, 3: 0.8, 7: 0.7, 11: 0.9}, seen))
    monkeypatch.setattr(learning, "run", engine)
    events: list[dict] = []
    lines: list[str] = []
    plan = Plan(grpo_steps=12, select_every=4, select_patience=2, select_start=True)
    path, steps, selection = grpo(plan, "/ck/sft", lines.append, events.append)
    assert [s[3] for s in seen] == ["builtin:/ck/sft", "builtin:/runs/g/checkpoints/step-00003", "builtin:/runs/g/checkpoints/step-00007"]
    assert engine.calls == [(0, 4, None), (4, 8, "g")] and path == "/ck/sft"
    assert selection["best_step"] == -1 and selection["early_stop"] and [c["step"] for c in selection["scores"]] == [-1, 3, 7]
    assert [e for e in events if e["event"] == "early_stop"] == [{"event": "early_stop", "step": 7, "best_step": -1}]
    assert any("without beating SFT's 0.800" in line for line in lines)
    # a step that beats the start is kept, as without it; the start's score stays in the record
    engine = FakeEngine()
    monkeypatch.setattr(learning, "run", engine)
    monkeypatch.setattr(learning, "evaluate", scored_at({-1: 0.5, 3: 0.6, 7: 0.7, 11: 0.6}, []))
    path, _, selection = grpo(replace(plan, select_patience=None), "/ck/sft", lines.append)
    assert path.endswith("step-00007") and [c["pass_rate"] for c in selection["scores"]] == [0.5, 0.6, 0.7, 0.6]
    assert lines[-1].endswith("SFT 0.500, step 3 0.600, step 7 0.700, step 11 0.600; kept step 7")


def test_a_failed_score_trains_to_the_end_and_keeps_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    import forgetui.learning as learning

    def broken(*args, **kwargs):
        raise RuntimeError("sandbox engine gone")

    engine = FakeEngine()
    monkeypatch.setattr(learning, "evaluate", broken)
    monkeypatch.setattr(learning, "run", engine)
    lines: list[str] = []
    path, steps, selection = grpo(Plan(grpo_steps=12, select_every=4, select_patience=1), "/ck/sft", lines.append)
    assert engine.calls == [(0, 4, None), (4, 12, "g")] and len(steps) == 12
    assert path.endswith("step-00011") and selection["error"] == "RuntimeError: sandbox engine gone"
    assert any("selection failed" in line for line in lines)


def test_a_recipe_refuses_patience_without_scores(tmp_path: Path) -> None:
    from core.errors import ConfigError
    from forgetui.learning_recipe import load_recipe

    path = tmp_path / "r.toml"
    path.write_text('harness = "react"\n[grpo]\nsteps = 8\n[select]\npatience = 2\n')
    with pytest.raises(ConfigError, match="select.patience needs select.every"):
        load_recipe(path)
    path.write_text('harness = "react"\n[grpo]\nsteps = 8\n[select]\nevery = 2\npatience = 2\n')
    assert load_recipe(path).plan_fields()["select_patience"] == 2


def test_the_seed_drives_every_stage_and_an_old_result_without_one_is_seed_0(tmp_path: Path) -> None:
    plan = Plan(seed=7, grpo_kl_coef=0.02, grpo_entropy_coef=0.001, select_every=4, grpo_steps=12)
    assert base_config(plan, "builtin:tiny", "eval", 5).run.seed == 7
    config = grpo_config(plan, "/ck/sft")
    assert (config.run.seed, config.train.seed, config.train.kl_coef, config.train.entropy_coef, config.train.save_every) == (7, 7, 0.02, 0.001, 4)
    ckpt = tmp_path / "sft"
    ckpt.mkdir()
    old = {k: v for k, v in Plan().describe().items() if k != "seed"}  # a learning_curve.json from before seeds were recorded
    reusable(Plan(), {"plan": old, "checkpoints": {"sft": str(ckpt)}})
    with pytest.raises(ValueError, match=r"seed \(0 ≠ 7\)"):
        reusable(Plan(seed=7), {"plan": old, "checkpoints": {"sft": str(ckpt)}})


def test_a_learning_run_writes_its_stages_as_they_happen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The stages in order, with pass rates and intervals, GRPO's steps and the selection: what the TUI folds."""
    import forgetui.learning as learning

    def result(rate: float) -> dict:
        per_task = {f"t{i}": {"family": "rename", "passed": 4 if i < rate * 10 else 0, "scored": 4, "reward": 0.0} for i in range(10)}
        return split_result(per_task, "r")

    rates = {"builtin:smollm2-135m": 0.0, "builtin:/runs/s/sft": 0.5, "builtin:/runs/g/checkpoints/step-00001": 0.7,
             "builtin:/runs/g/checkpoints/step-00003": 0.6}

    def fake_evaluate(plan, backend, label, report=print, events=learning._quiet, wording="templates"):
        splits = {}
        for split in plan.eval_splits:
            splits[split] = {**result(rates[backend]), "seconds": 1.0}
            events({"event": "stage", "stage": label, "split": split, **{k: splits[split][k] for k in learning.STAGE_KEYS}})
        return {"stage": label, "backend": backend, "harness": plan.harness, "splits": splits}

    monkeypatch.setattr(learning, "evaluate", fake_evaluate)
    monkeypatch.setattr(learning, "teach", lambda plan, out, report=print: ["teacher-run"])
    monkeypatch.setattr(learning, "sft", lambda plan, runs, report=print: "/runs/s/sft")
    monkeypatch.setattr(learning, "run", FakeEngine())
    monkeypatch.setattr(learning, "plot", lambda result, path: None)
    log = EventLog(tmp_path / "learning" / "run.jsonl")
    plan = Plan(eval_splits=("eval-phrasing",), grpo_steps=4, select_every=2, seed=5)
    out = learning.learning_curve(plan, tmp_path / "out", lambda _: None, None, log)
    assert out["seed"] == 5 and out["checkpoints"]["grpo"].endswith("step-00001") and out["selection"]["best_step"] == 1
    state, offset = load_state(log.path)
    assert offset == log.path.stat().st_size and state.status == "done" and state.start["seed"] == 5
    assert [(s["stage"], s["split"], s["pass_rate"]) for s in state.stages] == [
        ("base", "eval-phrasing", 0.0), ("sft", "eval-phrasing", 0.5), ("select step 1", "eval", 0.7), ("select step 3", "eval", 0.6),
        ("grpo", "eval-phrasing", 0.7)]
    assert all(len(s["ci"]) == 2 for s in state.stages) and [m["step"] for m in state.steps] == [0, 1, 2, 3]
    assert [(e["step"], e["best"]) for e in state.selection] == [(1, True), (3, False)]
    assert {"teacher", "SFT", "GRPO"} <= set(state.phases) and all(p["state"] == "done" for p in state.phases.values())
    assert state.done["gains"]["eval-phrasing"]["grpo - sft"]["gain"] == pytest.approx(0.2)
    assert json.loads((tmp_path / "out" / "learning_curve.json").read_text())["seed"] == 5


def test_a_reader_takes_whole_lines_only_and_skips_torn_ones(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text('{"event": "start", "harness": "react"}\nnot json\n{"event": "phase", "phase": "SFT", "sta')
    events, offset = read_new(path, 0)
    assert [e["event"] for e in events] == ["start"] and offset == len(b'{"event": "start", "harness": "react"}\nnot json\n')
    with path.open("a") as f:
        f.write('te": "running"}\n')
    more, offset2 = read_new(path, offset)
    state = LearningState()
    for e in events + more:
        state.add(e)
    assert state.status == "running SFT" and offset2 == path.stat().st_size
    state.add({"event": "failed", "error": "KeyboardInterrupt: stopped"})
    assert state.status == "failed: KeyboardInterrupt: stopped"
    assert read_new(tmp_path / "missing.jsonl", 0) == ([], 0)


@pytest.fixture(scope="module")
def tiny_group() -> list[Sample]:
    """Two completions of one prompt sampled by the tiny model, one rewarded: a GRPO group with advantages set."""
    import asyncio

    from core.backends.builtin import BuiltinBackend
    from tests.test_local_trainer import _prompt, generate, pair

    backend = BuiltinBackend("tiny", device="cpu")
    try:
        prompt = _prompt(backend)
        return pair(prompt, [generate(backend, prompt, seed) for seed in (1, 2)])
    finally:
        asyncio.run(backend.aclose())


def test_an_entropy_bonus_keeps_the_policy_broader_and_a_kl_term_holds_it_near_its_start(tiny_group: list[Sample]) -> None:
    """The recipe's grpo.entropy_coef and grpo.kl_coef reach the trainer as terms that move its update (the tiny model)."""
    from tests.test_local_trainer import trainer

    samples = tiny_group
    plain, bonus, held = trainer(lr=1e-3), trainer(lr=1e-3, entropy_coef=0.5), trainer(lr=1e-3, kl_coef=1.0)
    for t in (plain, bonus, held):
        t.step(samples)
    second = {name: t.step(samples) for name, t in (("plain", plain), ("bonus", bonus), ("held", held))}
    assert second["bonus"]["entropy"] > second["plain"]["entropy"]
    assert 0 < second["held"]["kl"]
    config = grpo_config(Plan(grpo_entropy_coef=0.5, grpo_kl_coef=1.0), "/ck/sft")
    assert (config.train.entropy_coef, config.train.kl_coef) == (0.5, 1.0)


def test_timed_out_rollouts_are_counted_in_a_stages_result_and_its_line() -> None:
    from forgetui.learning_report import split_line

    per_task = {"t0": {"family": "rename", "passed": 1, "scored": 4, "reward": 1.0, "timeouts": 3},
                "t1": {"family": "rename", "passed": 4, "scored": 4, "reward": 4.0, "timeouts": 0}}
    r = split_result(per_task, "r")
    assert (r["passed"], r["scored"], r["timeouts"]) == (5, 8, 3)  # a timeout is a scored fail, and counted
    assert "(2 tasks, 3 timed out)" in split_line("sft", "eval-phrasing", r)
    assert "timed out" not in split_line("sft", "eval-phrasing", split_result({"t1": per_task["t1"]}, "r"))


@pytest.mark.slow  # ~85 s on 2 busy cores (84 local rollouts, one update); the rule itself is tested above in milliseconds
def test_a_step_refills_until_its_batch_has_as_many_groups_with_signal_as_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real loop (tiny model, the recording proxy, CoinHarness in local sandboxes): `hello`'s group has signal, the
    write-file tasks always score 0. A first batch [hello, write-file-000] has 1 of 2: the first refill asks for
    ⌈1 / (2/4)⌉ = 2 tasks, still 1 with signal, the second for ⌈1 / (2/6)⌉ = 3: 7 tasks in the step (the rule before
    refilled 1, then 2: 5). 12 coin flips in `hello`'s group all alike: 1 in 2,048."""
    import asyncio

    import duckdb

    from core.config import load_config
    from core.run import execute_run

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    flat = ["write-file-000", "write-file-001", "write-file-002", "write-file-004", "write-file-005", "sum-numbers-000", "sum-numbers-001"]
    tasks = ",".join(["hello", *flat])  # the env's order: refills take the next unused (train.shuffle = false)
    sets = {"env.name": "toy", "env.tasks": tasks, "harness.name": "tests.harness_fixtures:CoinHarness", "policy.backend": "builtin:tiny",
            "runtime.kind": "local", "run.n_samples": 12, "run.concurrency": 12, "run.timeout_s": 120, "train.steps": 1,
            "train.tasks_per_step": 2, "train.max_extra_batches": 2, "train.shuffle": False, "train.lr": 1e-5, "train.seed": 0}
    config = load_config(None, [f"{k}={v}" if not isinstance(v, str) else f'{k}="{v}"' for k, v in sets.items()])
    summary = asyncio.run(execute_run(config))
    with duckdb.connect(summary.store, read_only=True) as con:
        ran = [t for (t,) in con.execute("SELECT DISTINCT task_id FROM rollouts WHERE step = 0 ORDER BY task_id").fetchall()]
        extra, informative, groups = con.execute("SELECT CAST(metrics->>'extra_batches' AS INT), CAST(metrics->>'informative_groups' AS INT), "
                                                 "CAST(metrics->>'groups' AS INT) FROM train_steps WHERE step = 0").fetchone()
    assert ran == sorted(["hello", *flat[:6]]), (ran, extra, informative, groups)
    assert (extra, informative, groups) == (2, 1, 7)


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_early_stopping_stops_a_real_grpo_run_resumed_between_scores(docker_client, base_image, tmp_path, monkeypatch) -> None:
    """The tiny model in react, GRPO scored after every step with patience 1: one run, resumed once, never reaching step 2."""

    from core.store.query import run_query
    from forgetui.learning import DEMO

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    plan = replace(DEMO, grpo_steps=3, select_every=1, select_patience=1, select_eval_n=1, select_samples=1, timings={})
    lines: list[str] = []
    events: list[dict] = []
    path, steps, selection = grpo(plan, "tiny", lines.append, events.append)
    scores = [c["pass_rate"] for c in selection["scores"]]
    assert [c["step"] for c in selection["scores"]] == [0, 1] and scores[1] <= scores[0], selection  # step 1 did not beat step 0
    assert selection["early_stop"] and selection["stopped_after"] == 1 and [m["step"] for m in steps] == [0, 1]
    run_dir = Path(path).parents[1]
    assert Path(path).name == "step-00000" and sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-00000", "step-00001"]
    store = str(run_dir / "store.duckdb")
    assert [tuple(r) for r in run_query(store, "SELECT step FROM train_steps ORDER BY step").rows] == [(0,), (1,)]
    # the resumed segment added step 1's rollouts to the same run and did not run step 0's again
    rows = [tuple(r) for r in run_query(store, "SELECT step, count(*), count(DISTINCT run_id) FROM rollouts GROUP BY step ORDER BY step").rows]
    assert rows == [(0, plan.grpo_samples, 1), (1, plan.grpo_samples, 1)], rows
    assert any("early stop after step 1" in line for line in lines)
