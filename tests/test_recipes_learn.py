"""Learning recipes: every shipped file loads, names a real harness and valid values; flags override single fields."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.registry import HARNESS_GROUP, available
from forgetui.learning import HARNESSES, Plan, grpo_config, teacher_tasks
from forgetui.learning_recipe import Recipe, load_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "examples" / "learn").glob("*.toml"))


def script():
    spec = importlib.util.spec_from_file_location("learning_curve_script", ROOT / "benchmarks" / "learning_curve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_recipe_ships_per_learning_harness() -> None:
    assert sorted(p.stem for p in RECIPES) == sorted(HARNESSES)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_names_a_real_harness_and_valid_values(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.harness == path.stem and recipe.harness in available(HARNESS_GROUP)
    plan = Plan(harness=recipe.harness)
    script().apply_recipe(plan, path)
    fields = recipe.plan_fields()
    assert {k: getattr(plan, k) for k in fields if hasattr(plan, k)} == {k: v for k, v in fields.items() if hasattr(plan, k)}
    assert teacher_tasks(plan)  # the teacher has tasks to record
    config = grpo_config(plan, "/ck/sft")  # the GRPO run's config validates with the recipe's values
    assert config.train.seed == recipe.seed and config.run.seed == recipe.seed
    assert config.run.n_samples == recipe.grpo.group_size >= 2 and config.train.temperature == recipe.grpo.temperature
    assert config.train.save_every == recipe.select.every and config.env.options["split"] == "train"
    assert (config.train.kl_coef, config.train.entropy_coef, config.train.call_discount, config.train.stratify_by) == (
        recipe.grpo.kl_coef, recipe.grpo.entropy_coef, recipe.grpo.call_discount, recipe.grpo.stratify_by)
    assert config.train.warmup_steps == recipe.grpo.warmup_steps and config.train.lr == recipe.grpo.lr
    assert recipe.sampler == "builtin"  # what the measured runs used


def test_the_shipped_recipes_encode_the_readmes_best_runs() -> None:
    react, mini, pi = (load_recipe(ROOT / "examples" / "learn" / f"{h}.toml") for h in ("react", "mini-swe-agent", "pi"))
    assert (react.sft.epochs, react.sft.lr, react.grpo.temperature, react.grpo.lr, react.grpo.steps, react.concurrency) == (1, 5e-5, 1.0, 2e-5, 12, 32)
    assert (react.grpo.warmup_steps, react.grpo.wordings, react.select.wordings, react.select.start) == (4, "practice", "practice", True)
    assert (mini.teacher.templates, mini.sft.epochs, mini.grpo.lr, mini.concurrency) == (6, 2, 2e-5, 16)
    assert (mini.grpo.wordings, mini.grpo.kl_coef, mini.select.every, mini.dtype) == ("practice", 0.1, 0, "fast")
    assert (pi.sft.epochs, pi.sft.lr, pi.grpo.steps, pi.grpo.lr) == (1, 5e-5, 4, 2e-5)
    assert (pi.grpo.wordings, pi.grpo.kl_coef, pi.concurrency) == ("practice", 0.1, 32)


def test_a_recipes_unset_fields_are_the_plans_defaults() -> None:
    plan = dataclasses.asdict(Plan())
    for name, value in Recipe(harness="react").plan_fields().items():
        if name in plan:
            assert plan[name] == value, name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('harness = "codex"\n', "harness"),
        ('harness = "react"\n[grpo]\nsteps = 4\ngroup_size = 1\n', "grpo.group_size"),
        ('harness = "react"\n[grpo]\ntemprature = 1.5\n', "grpo.temprature"),
        ('harness = "react"\n[sft]\nlr = -1\n', "sft.lr"),
        ('harness = "react"\n[teacher]\ntemplates = 9\n', "teacher.templates"),
        ('harness = "react"\n[grpo]\nsteps = 4\n[select]\nevery = 5\n', "select.every"),
        ('harness = "react"\nsampler = "sglang"\n', "sampler"),
        ('harness = "react"\n[grpo]\ncall_discount = 1.5\n', "grpo.call_discount"),
        ('harness = "react"\n[sft\n', "not valid TOML"),
        ('harness = "react"\n[grpo]\nwordings = "untaught"\n', "grpo.wordings .* needs teacher.templates"),
        ('harness = "react"\n[select]\nevery = 1\nwordings = "untaught"\n', "select.wordings .* needs teacher.templates"),
        ('harness = "react"\n[select]\nwordings = "new"\n', "select.wordings"),
        ('harness = "react"\n[select]\nstart = true\n', "select.start needs select.every"),
    ],
)
def test_a_wrong_recipe_is_refused_naming_the_file_and_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_recipe(path)
    assert str(path) in str(err.value)


def test_practice_wordings_need_no_teacher_templates(tmp_path: Path) -> None:
    path = tmp_path / "practice.toml"
    path.write_text('harness = "react"\n[grpo]\nwordings = "practice"\n[select]\nevery = 2\nwordings = "practice"\n')
    plan = load_recipe(path).plan_fields()
    assert (plan["grpo_wordings"], plan["select_wordings"], plan.get("teacher_templates")) == ("practice", "practice", None)


def test_select_held_out_reaches_the_plan_and_needs_practice_wordings(tmp_path: Path) -> None:
    path = tmp_path / "held.toml"
    path.write_text('harness = "react"\n[grpo]\nwordings = "practice"\n[select]\nevery = 2\nwordings = "practice"\nheld_out = 4\n')
    assert load_recipe(path).plan_fields()["select_held_out"] == 4
    path.write_text('harness = "react"\n[select]\nevery = 2\nheld_out = 4\n')
    with pytest.raises(ConfigError, match="select.held_out.*needs select.wordings"):
        load_recipe(path)


def test_a_missing_recipe_says_where_the_shipped_ones_are(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="examples/learn"):
        load_recipe(tmp_path / "nope.toml")


def test_flags_override_single_fields_of_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    lc = script()
    monkeypatch.setattr("sys.argv", ["learning_curve.py", "--recipe", str(ROOT / "examples/learn/react.toml"), "--split", "eval-phrasing",
                                     "--grpo-steps", "8", "--seed", "3", "--grpo-kl-coef", "0.01", "--teacher-templates", "6",
                                     "--grpo-wordings", "untaught", "--select-start", "--grpo-warmup", "3"])
    args = lc.parse_args()
    args.harness = lc.resolve_harness(args)
    plan = lc.make_plan(args, args.harness)
    assert (plan.harness, plan.grpo_steps, plan.seed, plan.grpo_kl_coef, plan.grpo_warmup) == ("react", 8, 3, 0.01, 3)  # the flags
    assert (plan.teacher_templates, plan.grpo_wordings, plan.select_wordings, plan.select_start) == (6, "untaught", "practice", True)
    assert (plan.sft_lr, plan.grpo_temperature, plan.concurrency, plan.select_every) == (5e-5, 1.0, 32, 4)  # the recipe
    assert plan.eval_splits == ("eval-phrasing",)
    monkeypatch.setattr("sys.argv", ["learning_curve.py", "--recipe", str(ROOT / "examples/learn/react.toml"), "--harness", "pi"])
    args = lc.parse_args()
    with pytest.raises(SystemExit, match="is for react, not pi"):
        lc.make_plan(args, lc.resolve_harness(args))


def test_the_sampler_passes_through_to_a_plan_that_has_one_and_is_refused_by_one_that_has_not(tmp_path: Path) -> None:
    @dataclasses.dataclass
    class SamplerPlan(Plan):
        sampler: str = "builtin"

    path = tmp_path / "vllm.toml"
    path.write_text('harness = "react"\nsampler = "vllm"\n')
    plan = SamplerPlan(harness="react")
    script().apply_recipe(plan, path)
    assert plan.sampler == "vllm"
    real = Plan(harness="react")  # the learning plan's own sampler (--sampler): the recipe's value reaches it
    script().apply_recipe(real, path)
    assert real.sampler == "vllm"

    @dataclasses.dataclass
    class OlderPlan:  # a plan without a sampler field: a recipe asking for vllm is refused, one at the default is not
        harness: str = "react"

    with pytest.raises(SystemExit, match="sampler = 'vllm' needs a learning plan that has sampler"):
        script().apply_recipe(OlderPlan(), path)
    plain = tmp_path / "plain.toml"
    plain.write_text('harness = "react"\nsampler = "builtin"\n')
    script().apply_recipe(OlderPlan(), plain)


def test_a_recipes_stratified_grpo_reaches_the_runs_task_schedule(tmp_path: Path) -> None:
    """grpo.stratify_by = "family" → train.stratify_by: every GRPO step of the run holds every family."""
    from core.registry import load_env
    from core.session.setup import select_tasks
    from core.train.batches import TaskSchedule

    path = tmp_path / "react.toml"
    path.write_text((Path(__file__).resolve().parents[1] / "examples" / "learn" / "react.toml").read_text().replace(
        "[grpo]\n", '[grpo]\nstratify_by = "family"\n', 1))
    plan = Plan(harness="react")
    script().apply_recipe(plan, path)
    config = grpo_config(plan, "/ck/sft")
    assert plan.grpo_stratify_by == config.train.stratify_by == "family"
    env = load_env("toy", **config.env.options)
    tasks = tuple(select_tasks(env, config.env.tasks, None))
    schedule = TaskSchedule(tasks, config.train.tasks_per_step, config.train.seed, config.train.shuffle, config.train.stratify_by)
    families = {t.meta["family"] for t in tasks}
    assert len(families) == 5 and all({t.meta["family"] for t in schedule.batch(step)} == families for step in range(plan.grpo_steps))
