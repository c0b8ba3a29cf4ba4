"""The learning benchmark's parts that need no model: the teacher in each harness's format, intervals, the plan's configs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from core.backends.scripted import load_task_scripts, resolve_turn
from core.backends.spec import PolicySpec
from core.registry import load_env
from envs.toy import ToyEnv
from envs.toy.families import FAMILIES, template_indices
from forgetui.learning import (
    DEMO,
    HARNESSES,
    MSWEA_SUBMIT,
    Plan,
    base_config,
    floors,
    grpo_config,
    grpo_tasks,
    learning_curve,
    mistaken_turns,
    policy,
    reusable,
    reused_timings,
    select_tasks_of,
    split_result,
    teacher_script,
    teacher_tasks,
    teacher_turns,
)
from forgetui.learning_report import paired_gain, pass_interval, split_line, table

REACT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": p, "required": list(p)}}}
               for n, p in (("bash", {"command": {"type": "string"}}), ("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}))]
PI_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": p, "required": list(p)}}}
            for n, p in (("read", {"path": {"type": "string"}}), ("bash", {"command": {"type": "string"}}),
                         ("write", {"path": {"type": "string"}, "content": {"type": "string"}}))]
MSWEA_TOOLS = REACT_TOOLS[:1]


def task(family: str):
    return next(t for t in ToyEnv(split="train", n=2).tasks() if t.meta["family"] == family)


def test_mini_swe_agent_teacher_reasons_runs_one_command_a_turn_and_submits() -> None:
    t = task("count-lines")
    turns = teacher_turns("mini-swe-agent", t)
    calls = [resolve_turn(turn, MSWEA_TOOLS) for turn in turns]
    assert [len(c) for _, c in calls] == [1, 1]  # one bash tool call every turn (its mini.yaml's rule)
    assert all(text for text, _ in calls)  # with reasoning text
    assert calls[0][1][0]["arguments"]["command"].startswith("grep -cw ")
    assert calls[-1][1][0] == {"name": "bash", "arguments": {"command": MSWEA_SUBMIT}}  # the submit command, alone


def test_pi_teacher_writes_new_files_with_its_write_tool_and_ends_without_a_call() -> None:
    wf = task("write-file")
    (text, calls), (last, none) = (resolve_turn(turn, PI_TOOLS) for turn in teacher_turns("pi", wf))
    assert calls == [{"name": "write", "arguments": {"path": wf.meta["params"]["path"], "content": wf.meta["params"]["content"]}}]
    assert last and none == []
    (_, calls), _ = (resolve_turn(turn, PI_TOOLS) for turn in teacher_turns("pi", task("make-dirs")))
    assert calls[0]["name"] == "bash" and calls[0]["arguments"]["command"].startswith("mkdir -p ")


def test_react_teacher_uses_bash_then_answers() -> None:
    (_, calls), (last, none) = (resolve_turn(turn, REACT_TOOLS) for turn in teacher_turns("react", task("write-file")))
    assert calls[0]["name"] == "bash" and last == "Done." and none == []


def test_the_demos_mistakes_differ_from_the_right_answer_only_in_the_text() -> None:
    hello = next(t for t in ToyEnv().tasks() if t.id == "hello")
    right, wrong = teacher_turns("react", hello)[0]["command"], mistaken_turns("react", hello)[0]["command"]
    assert right == "echo hi > hello.txt" and wrong == "echo hello > hello.txt"
    wf = task("write-file")
    assert mistaken_turns("react", wf)[0]["command"] != teacher_turns("react", wf)[0]["command"]
    with pytest.raises(ValueError, match="no scripted mistake"):
        mistaken_turns("react", task("rename"))


@pytest.mark.parametrize("harness", HARNESSES)
def test_teacher_script_matches_every_train_task_and_no_text_hides_another(harness: str, tmp_path: Path) -> None:
    plan = Plan(harness=harness, train_n=20)
    scripts = load_task_scripts(teacher_script(plan, teacher_tasks(plan), tmp_path / "t.json"))
    tasks = ToyEnv(split="train", n=20).tasks()
    assert len(scripts) == len(tasks)
    for t in tasks:  # the scripted backend plays the first entry whose text the user message contains
        first = next(turns for match, turns in scripts if match in t.instruction)
        assert first == teacher_turns(harness, t), t.id


def test_teacher_templates_keeps_the_teacher_to_the_first_k_seen_wordings_and_grpo_to_all(tmp_path: Path) -> None:
    everything = ToyEnv(split="train", n=20).tasks()
    plan = Plan(harness="mini-swe-agent", train_n=20, teacher_templates=3)
    taught = teacher_tasks(plan)
    allowed = {f: template_indices(fam.templates, "seen")[:3] for f, fam in FAMILIES.items()}
    assert {t.id for t in taught} == {t.id for t in everything
                                      if t.id == "hello" or t.meta["params"]["template"] in allowed[t.meta["family"]]}
    assert 0 < len(taught) < len(everything) and "hello" in {t.id for t in taught}
    assert {match for match, _ in load_task_scripts(teacher_script(plan, taught, tmp_path / "t.json"))} == {t.instruction for t in taught}
    assert grpo_config(plan, "/ck/sft").env.tasks is None  # GRPO trains on every train task, wordings the teacher skipped too
    assert {t.id for t in teacher_tasks(Plan(train_n=20))} == {t.id for t in everything}
    later = next(t for t in everything if t.id != "hello" and t.meta["params"]["template"] not in allowed[t.meta["family"]])
    with pytest.raises(ValueError, match="no train task of this plan is worded with the first 3 seen"):
        teacher_tasks(Plan(train_n=20, train_tasks=[later.id], teacher_templates=3))  # never "the whole split" instead


def test_untaught_wordings_give_grpo_and_the_selection_only_the_templates_the_teacher_skipped() -> None:
    plan = Plan(train_n=20, teacher_templates=6, grpo_wordings="untaught", select_wordings="untaught", select_eval_n=3)
    skipped = {f: set(template_indices(fam.templates, "seen")[6:]) for f, fam in FAMILIES.items()}
    train = {t.id: t for t in ToyEnv(split="train", n=20).tasks()}
    ids = grpo_config(plan, "/ck/sft").env.tasks
    assert ids and set(ids) == {i for i, t in train.items() if t.meta["params"].get("template") in skipped.get(t.meta["family"], ())}
    assert not {t.id for t in teacher_tasks(plan)} & set(ids)  # GRPO meets only wordings SFT never imitated
    n, chosen = select_tasks_of(plan)
    pool = {t.id: t for t in ToyEnv(split="eval", n=n).tasks()}
    assert chosen and all(pool[i].meta["params"]["template"] in skipped[pool[i].meta["family"]] for i in chosen)
    by_family = {f: sum(pool[i].meta["family"] == f for i in chosen) for f in FAMILIES if f != "hello"}
    assert set(by_family.values()) == {3}, by_family  # select_eval_n a family, eval-split tasks only (no train id)
    assert not set(chosen) & set(train)
    assert select_tasks_of(Plan(select_eval_n=4)) == (4, None) and grpo_config(Plan(), "/ck").env.tasks is None  # "all": as before
    with pytest.raises(ValueError, match="needs teacher_templates"):
        grpo_tasks(Plan(grpo_wordings="untaught"))
    with pytest.raises(ValueError, match="select_wordings 'some': one of all, untaught, practice"):
        select_tasks_of(Plan(teacher_templates=6, select_wordings="some"))
    with pytest.raises(ValueError, match="needs teacher_templates"):  # refused before any stage runs
        learning_curve(Plan(select_every=2, select_wordings="untaught"), Path("/nonexistent/never-written"))


def test_practice_wordings_give_grpo_and_the_selection_the_reworded_tasks() -> None:
    plan = Plan(train_n=20, grpo_wordings="practice", select_wordings="practice", select_eval_n=3)
    config = grpo_config(plan, "/ck/sft")
    assert config.env.options["wording"] == "practice" and config.env.tasks is None
    tasks = load_env("toy", **config.env.options).tasks()
    assert len(tasks) == 100 and all(t.meta["phrasing"] == "practice" and t.meta["split"] == "train" for t in tasks)
    assert {t.id for t in teacher_tasks(plan)}.isdisjoint(t.id for t in tasks)  # the teacher shows none of them
    assert "wording" not in base_config(plan, "builtin:x", "eval", 3).env.options  # other stages: the templates, as before
    assert select_tasks_of(plan) == (3, None)
    picked = grpo_config(replace(plan, train_tasks=["hello", "write-file-004", "count-lines-012"]), "/ck").env.tasks
    assert picked == ["write-file-r004", "count-lines-r012"]
    assert {t.id for t in load_env("toy", **config.env.options).tasks()} >= set(picked)
    with pytest.raises(ValueError, match="practice.*skip hello"):
        grpo_tasks(Plan(train_tasks=["hello"], grpo_wordings="practice"))
    held = replace(plan, select_held_out=4)  # the selection's wordings held out of GRPO's
    train = load_env("toy", **grpo_config(held, "/ck").env.options).tasks()
    scored = load_env("toy", **base_config(held, "builtin:x", "eval", 3, wording="practice").env.options).tasks()
    assert [t.id for t in train] == [t.id for t in tasks] and {t.meta["split"] for t in scored} == {"eval"}
    for family in {t.meta["family"] for t in train}:
        trained = {t.meta["params"]["practice"] for t in train if t.meta["family"] == family}
        assert trained and trained.isdisjoint(t.meta["params"]["practice"] for t in scored if t.meta["family"] == family)
    assert "practice_held_out" not in base_config(held, "builtin:x", "eval-phrasing", 3).env.options
    with pytest.raises(ValueError, match="needs select_wordings \"practice\""):
        select_tasks_of(replace(plan, select_wordings="all", select_held_out=4))
    with pytest.raises(ValueError, match="one of all, untaught, practice"):
        grpo_tasks(Plan(grpo_wordings="paraphrase"))


def test_a_reused_result_lends_only_the_times_of_the_stages_it_lends() -> None:
    earlier = {"vllm-start": 90.0, "base/eval-phrasing": 73.0, "teacher": 27.0, "sft-train": 176.0, "sft/eval-phrasing": 76.0,
               "grpo-train": 978.0, "select step 3/eval": 41.0, "select start/eval": 44.0, "grpo/eval-phrasing": 77.0, "vllm-reloads": 4.0}
    assert reused_timings(earlier) == {"base/eval-phrasing": 73.0, "teacher": 27.0, "sft-train": 176.0, "sft/eval-phrasing": 76.0}


def test_base_config_runs_the_plans_harness_with_its_limits() -> None:
    for harness in HARNESSES:
        config = base_config(Plan(harness=harness), "builtin:tiny", "eval-phrasing", 5)
        assert config.harness.name == harness and config.env.options["split"] == "eval-phrasing"
    assert base_config(Plan(harness="pi"), "builtin:tiny", "eval", 5).harness.options["max_tokens"] == 96
    assert base_config(Plan(harness="mini-swe-agent"), "builtin:tiny", "eval", 5).harness.options["step_limit"] == 2
    assert base_config(Plan(harness="pi"), "builtin:tiny", "eval", 5).run.max_calls == 2  # pi has no cap of its own: the proxy's
    assert base_config(Plan(harness="pi", max_calls=None), "builtin:tiny", "eval", 5).run.max_calls is None
    demo = base_config(DEMO, "builtin:tiny", "train", DEMO.train_n, DEMO.train_tasks)
    assert demo.env.tasks == ["hello"]
    assert demo.runtime.kind == "auto"  # the demo runs where Docker is missing, as `forgetui demo` itself does
    assert base_config(Plan(), "builtin:tiny", "eval", 5).runtime.kind == "docker"


def test_grpo_samples_at_the_plans_temperature_and_the_trainer_recomputes_at_it() -> None:
    config = grpo_config(Plan(harness="pi", grpo_temperature=1.3, grpo_samples=6, grpo_lr=2e-5), "/ck/sft")
    assert config.train.temperature == 1.3 and config.run.n_samples == 6 and config.train.lr == 2e-5
    assert config.policy.backend == "builtin:/ck/sft" and config.env.options["split"] == "train"
    assert grpo_config(Plan(), "/ck/sft").train.temperature == 1.0
    evals = base_config(Plan(grpo_temperature=1.3), "builtin:/ck/sft", "eval-phrasing", 5)
    assert evals.train.temperature == 1.0  # the held-out runs are not GRPO's: they sample as the harness asks


def test_the_decode_batch_follows_the_plans_concurrency_unless_the_plan_says() -> None:
    assert policy(Plan(), "smollm2-135m") == "builtin:smollm2-135m"  # concurrency 8: the backend's own 16 rows
    wide = grpo_config(Plan(concurrency=32), "/ck/sft").policy.backend
    assert PolicySpec.parse(str(wide)).options["max_batch"] == "32" and PolicySpec.parse(str(wide)).target == "/ck/sft"
    assert policy(Plan(concurrency=32, max_batch=8), "/ck/x") == "builtin:/ck/x?max_batch=8"


def test_pass_interval_resamples_tasks() -> None:
    assert pass_interval({}) == (0.0, 0.0)
    assert pass_interval({"a": (4, 4), "b": (4, 4)}) == (1.0, 1.0)
    few = {f"t{i}": (2, 4) if i % 2 else (4, 4) for i in range(6)}
    many = {f"t{i}": (2, 4) if i % 2 else (4, 4) for i in range(60)}
    lo, hi = pass_interval(few)
    assert lo < 0.75 < hi
    lo2, hi2 = pass_interval(many)
    assert lo < lo2 < 0.75 < hi2 < hi  # more tasks, a narrower interval
    assert pass_interval(few) == pass_interval(few)  # seeded
    # tasks that pass or fail as a whole: the interval counts 6 tasks, not 24 independent rollouts
    lumpy = {f"t{i}": (4, 4) if i % 2 else (0, 4) for i in range(6)}
    assert pass_interval(lumpy)[1] - pass_interval(lumpy)[0] > 0.4


def test_split_result_lines_and_table() -> None:
    per_task = {"write-file-p000": {"family": "write-file", "passed": 3, "scored": 4, "reward": 3.0},
                "rename-p000": {"family": "rename", "passed": 0, "scored": 4, "reward": 1.0}}
    r = split_result(per_task, "run-1")
    assert (r["passed"], r["scored"], r["tasks"], r["pass_rate"]) == (3, 8, 2, 0.375)
    assert r["by_family"] == {"write-file": (3, 4), "rename": (0, 4)} and r["mean_reward"] == 0.5
    line = split_line("sft", "eval-phrasing", r)
    assert "pass 3/8 = 0.375 [" in line and "rename 0/4" in line
    stages = [{"stage": s, "splits": {"eval-phrasing": {**r, "pass_rate": v}}} for s, v in (("base", 0.0), ("sft", 0.5), ("grpo", 0.65))]
    result = {"stages": stages}
    assert floors(result)[2] and floors(result)[0] == 0.5
    assert not floors({"stages": stages[:2] + [{"stage": "grpo", "splits": {"eval-phrasing": {"pass_rate": 0.55}}}]})[2]
    paired = {"eval-phrasing": {"grpo - sft": {"gain": 0.15, "ci": [-0.03, 0.31]}}}
    assert not floors({**result, "gains": paired})[2]  # +0.15 whose interval reaches below 0 misses the floor
    paired["eval-phrasing"]["grpo - sft"]["ci"] = [0.02, 0.3]
    assert floors({**result, "gains": paired})[2]
    md = table({"react": result}, ["eval-phrasing"])
    assert md.splitlines()[2].startswith("| react | base | 0.000 [") and "(3/8)" in md
    json.dumps(r)  # what learning_curve.json holds


def test_an_earlier_run_lends_its_stages_before_grpo_only_to_the_same_plan(tmp_path: Path) -> None:
    ckpt = tmp_path / "step-00025"
    ckpt.mkdir()
    plan = Plan(harness="mini-swe-agent", sft_epochs=1)
    earlier = {"plan": {**plan.describe(), "grpo_steps": 2, "grpo_lr": 1e-5}, "checkpoints": {"sft": str(ckpt)}}
    reusable(Plan(harness="mini-swe-agent", sft_epochs=1, grpo_steps=6), earlier)  # GRPO's schedule may differ
    with pytest.raises(ValueError, match=r"sft_epochs \(1 ≠ 3\)"):
        reusable(Plan(harness="mini-swe-agent"), earlier)
    with pytest.raises(ValueError, match="harness"):
        reusable(Plan(harness="pi", sft_epochs=1), earlier)
    with pytest.raises(ValueError, match=r"teacher_templates \(None ≠ 5\)"):
        reusable(Plan(harness="mini-swe-agent", sft_epochs=1, teacher_templates=5), earlier)
    with pytest.raises(ValueError, match=r"dtype \('auto' ≠ 'bfloat16'\)"):  # SFT trained, and the evals sampled, in another format
        reusable(Plan(harness="mini-swe-agent", sft_epochs=1, dtype="bfloat16"), earlier)
    older = {**earlier, "plan": {k: v for k, v in earlier["plan"].items() if k != "dtype"}}  # a plan from before the field: auto
    reusable(Plan(harness="mini-swe-agent", sft_epochs=1), older)
    ckpt.rmdir()
    with pytest.raises(ValueError, match="is gone"):
        reusable(plan, earlier)


def test_transfer_runs_each_trained_checkpoint_in_every_listed_harness(monkeypatch: pytest.MonkeyPatch) -> None:
    import forgetui.learning as learning

    ran: list[tuple[str, str]] = []

    def fake_evaluate(plan: Plan, backend: str, label: str, report=print) -> dict:
        ran.append((plan.harness, backend))
        return {"splits": {"eval-phrasing": {"pass_rate": 0.25, "harness": plan.harness}}}

    monkeypatch.setattr(learning, "evaluate", fake_evaluate)
    own = {"pass_rate": 0.55}
    result = {"checkpoints": {"sft": "/ck/sft", "grpo": "/ck/grpo"},
              "stages": [{"stage": "sft", "splits": {"eval-phrasing": {"pass_rate": 0.49}}}, {"stage": "grpo", "splits": {"eval-phrasing": own}}]}
    plan = Plan(eval_splits=("eval-phrasing",))
    table = learning.transfer({"mini-swe-agent": result}, plan, lambda _: None, "grpo", ("react", "mini-swe-agent", "pi"))
    assert ran == [("react", "builtin:/ck/grpo"), ("pi", "builtin:/ck/grpo")]  # pi has no curve of its own: still a column
    assert table["mini-swe-agent"]["mini-swe-agent"] is own and table["mini-swe-agent"]["pi"]["harness"] == "pi"
    ran.clear()
    assert learning.transfer({"mini-swe-agent": result}, plan, lambda _: None, "sft", ("react",))["mini-swe-agent"]["mini-swe-agent"]["pass_rate"] == 0.49
    assert ran == [("react", "builtin:/ck/sft")]


def test_paired_gain_counts_tasks_that_moved_and_is_narrower_than_the_stages() -> None:
    before = {f"t{i}": (i % 4, 4) for i in range(20)}  # the tasks differ a lot in how hard they are
    after = {k: (min(p + (1 if i % 2 else 0), 4), 4) for i, (k, (p, _)) in enumerate(before.items())}
    g = paired_gain(before, after)
    assert g["tasks"] == 20 and g["up"] == 10 and g["down"] == 0  # every odd task (1 or 3 of 4 before) rose by one sample
    assert abs(g["gain"] - 10 * 0.25 / 20) < 1e-9 and 0 <= g["ci"][0] <= g["gain"] <= g["ci"][1]
    lo, hi = pass_interval(after)
    assert g["ci"][1] - g["ci"][0] < (hi - lo) / 2
    assert paired_gain(before, {"other": (1, 4)})["tasks"] == 0


def test_intervals_depend_on_the_data_not_on_the_order_tasks_arrive_in() -> None:
    before = {f"t{i:02d}": (i % 3, 4) for i in range(25)}
    after = {k: (min(p + i % 2, 4), 4) for i, (k, (p, _)) in enumerate(before.items())}
    shuffled_before = dict(reversed(list(before.items())))
    shuffled_after = dict(sorted(after.items(), key=lambda kv: hash(kv[0]) % 7))
    assert pass_interval(after) == pass_interval(shuffled_after)
    assert paired_gain(before, after) == paired_gain(shuffled_before, shuffled_after)


def test_transfer_rows_run_only_the_named_harnesses_and_keep_the_other_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import importlib.util

    import forgetui.learning as learning

    spec = importlib.util.spec_from_file_location("learning_curve_script", Path(__file__).parents[1] / "benchmarks" / "learning_curve.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cell = {"pass_rate": 0.5, "ci": [0.3, 0.7], "passed": 50, "scored": 100}
    for harness in ("react", "pi", "mini-swe-agent"):
        (tmp_path / harness).mkdir()
        (tmp_path / harness / "learning_curve.json").write_text(json.dumps({"plan": {"model": "tiny"}, "checkpoints": {"grpo": f"/ck/{harness}"}}))
    earlier = {"mini-swe-agent": {"mini-swe-agent": cell, "react": cell}, "react": {"react": {**cell, "pass_rate": 0.1}}}
    (tmp_path / "transfer-grpo.json").write_text(json.dumps(earlier))
    ran: list[tuple[str, ...]] = []

    def fake_transfer(results: dict, plan: Plan, report, stage: str, columns: tuple[str, ...]) -> dict:
        ran.append(tuple(results))
        return {h: {c: {**cell, "pass_rate": 0.25} for c in columns} for h in results}

    monkeypatch.setattr(learning, "transfer", fake_transfer)
    args = argparse.Namespace(harness="react,mini-swe-agent,pi", rows="react,pi", out=tmp_path, transfer_stage="grpo", demo=False, split="both",
                              model=None, **{name: None for name in script.TUNABLE})
    assert script.run_transfer(args) == 0
    assert ran == [("react", "pi")]
    table = json.loads((tmp_path / "transfer-grpo.json").read_text())
    assert table["mini-swe-agent"] == earlier["mini-swe-agent"]  # a row not run is kept as it was
    assert table["react"]["react"]["pass_rate"] == 0.25 and set(table["pi"]) == {"react", "mini-swe-agent", "pi"}
    assert "not run" in capsys.readouterr().out  # the kept row has no pi cell
    args.rows = "codex"
    assert script.run_transfer(args) == 2


def test_a_grpo_step_line_names_sampler_counters_only_where_the_backend_keeps_them() -> None:
    from forgetui.learning import grpo_step_line

    step = {"step": 2, "reward_mean": 0.75, "samples": 84, "samples_trained": 32, "logprob_diff_max": 4e-5, "rollout_s": 149.2, "update_s": 57.0}
    served = grpo_step_line(step)  # a vLLM server: no counters, so no zeros that read as measured
    assert "prefill" not in served and "rollouts 149 s, update 57 s" in served and "trained on 32" in served
    builtin = grpo_step_line({**step, "prefill_s": 12.4, "decode_s": 80.0, "reused_tokens": 900, "decode_tokens": 3000, "accepted_tokens": 10})
    assert "rollouts 149 s (prefill 12 s, decode 80 s, 900 prompt tokens reused, 10 of 3000 answer tokens" in builtin
