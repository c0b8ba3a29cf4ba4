"""A learning recipe: one harness's schedule (teacher, SFT, GRPO, checkpoint selection) as a TOML file, validated on load.

    harness = "react"
    seed = 0
    [sft]
    epochs = 1
    lr = 5e-5
    [grpo]
    steps = 12
    temperature = 1.5

`examples/learn/<harness>.toml` ship one per harness; `benchmarks/learning_curve.py --recipe FILE` reads
one and its flags override single fields. A recipe says only what differs from the learning plan's
defaults (`forgetui.learning.Plan`); `plan_fields` maps it onto the plan's field names.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.errors import ConfigError
from core.options import validated
from envs.toy.families import FAMILIES, most_practice_held_out, template_indices

# the fewest seen (train) templates of any toy family: teacher.templates is at most that (8 today)
SEEN_TEMPLATES = min(len(template_indices(f.templates, "seen")) for f in FAMILIES.values())


Wordings = Literal["all", "untaught", "practice"]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SftPart(_Part):
    """SFT on the teacher's passing rollouts."""

    epochs: int = Field(3, ge=1, description="passes over the teacher's examples")
    lr: float = Field(1e-4, gt=0, lt=1)


class TeacherPart(_Part):
    """What the scripted teacher records (and so what SFT sees)."""

    templates: int | None = Field(None, ge=1, le=SEEN_TEMPLATES, description="only train tasks worded with each family's first K seen templates (unset: all)")
    samples: int = Field(1, ge=1, description="teacher rollouts per train task")


class GrpoPart(_Part):
    """GRPO from the SFT checkpoint on the train split."""

    steps: int = Field(4, ge=1)
    lr: float = Field(5e-6, gt=0, lt=1)
    temperature: float = Field(1.0, gt=0, le=4, description="GRPO's sampling temperature (the trainer recomputes logprobs at it)")
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warm-up (AdamW's first steps move every weight by about lr)")
    group_size: int = Field(4, ge=2, description="rollouts per task in a step: a GRPO group (one rollout has no baseline)")
    tasks_per_step: int = Field(6, ge=1)
    extra_batches: int = Field(2, ge=0, description="dynamic sampling: refill batches a step may add while too few groups have signal")
    kl_coef: float = Field(0.0, ge=0, description="KL to the SFT weights (veRL's low_var_kl); 0: none")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus; 0: none")
    call_discount: float = Field(1.0, gt=0, le=1, description="per-call credit: call t of T gets the advantage × γ^(T−1−t); 1: every call alike")
    stratify_by: str | None = Field(None, description="each step's tasks dealt round-robin over this task meta key's values "
                                    "(family: every step holds every family); none: one shuffle of all tasks")
    wordings: Wordings = Field("all", description="untaught: train only on the train tasks worded with the seen templates the teacher "
                               "did not show (needs teacher.templates); practice: the train tasks worded with the toy families' "
                               "practice templates (no teacher shows them); all: every train task")
    merge: float = Field(1.0, ge=0, le=1, description="the checkpoint GRPO keeps, moved back towards the SFT weights: "
                         "SFT + merge × (GRPO − SFT), WiSE-FT's remedy for drift on inputs GRPO never trained on; 1: GRPO's as is")


class SelectPart(_Part):
    """Keep the GRPO checkpoint with the best pass rate on the `eval` split (never `eval-phrasing`: that one is for the final measurement)."""

    every: int = Field(0, ge=0, description="checkpoint and score every N GRPO steps (the last step always counts); 0: keep the last")
    eval_n: int = Field(5, ge=1, description="eval-split tasks per family the selection scores")
    samples: int = Field(2, ge=1, description="rollouts per task in the selection")
    patience: int | None = Field(None, ge=1, description="early stopping: GRPO ends once this many scores in a row have not beaten "
                                 "the best (the steps after are not run); unset: every step runs")
    start: bool = Field(False, description="score GRPO's start (the SFT checkpoint) first on the same tasks: the baseline, kept "
                        "when no GRPO step beats it")
    wordings: Wordings = Field("all", description="untaught: score only eval-split tasks worded with the seen templates the teacher "
                               "did not show (needs teacher.templates); practice: the first eval_n tasks a family worded with the "
                               "practice templates; all: the first eval_n tasks a family")
    held_out: int = Field(0, ge=0, le=most_practice_held_out(), description="with wordings practice: this many of each family's practice templates "
                          "(a seeded pick) word only the selection's tasks, never GRPO's, so the selection scores wordings GRPO "
                          "never trained on; 0: both use all")


class Recipe(_Part):
    """One harness's learning schedule: every field optional except the harness; unset means the plan's default."""

    harness: Literal["react", "mini-swe-agent", "pi"]
    description: str = ""
    seed: int = Field(0, ge=0, description="drives the GRPO task order and refills, SFT's example order and the trainer's init")
    concurrency: int = Field(8, ge=1, le=256)
    sampler: Literal["builtin", "vllm"] = Field("builtin", description="what samples the rollouts (passed through to the learning plan)")
    max_calls: int | None = Field(2, ge=1, description="model calls a rollout may make")
    dtype: Literal["auto", "float32", "bfloat16", "fast"] = Field("auto", description="what every stage computes in, sampling and "
                                                                  "training (auto: float32 on a CPU; fast: bfloat16 where the machine has it "
                                                                  "natively, else float32)")
    sft: SftPart = Field(default_factory=SftPart)
    teacher: TeacherPart = Field(default_factory=TeacherPart)
    grpo: GrpoPart = Field(default_factory=GrpoPart)
    select: SelectPart = Field(default_factory=SelectPart)

    @model_validator(mode="after")
    def _select_within_steps(self) -> Recipe:
        if self.select.every > self.grpo.steps:
            raise ValueError(f"select.every ({self.select.every}) is more than grpo.steps ({self.grpo.steps}): "
                             "no checkpoint before the last would be scored; lower it or set 0")
        if self.select.patience is not None and self.select.every == 0:
            raise ValueError("select.patience needs select.every > 0: early stopping stops on the selection's scores")
        if self.select.start and self.select.every == 0:
            raise ValueError("select.start needs select.every > 0: without a selection there is nothing to compare the start with")
        if self.select.held_out and self.select.wordings != "practice":
            raise ValueError('select.held_out holds out practice templates for the selection: it needs select.wordings = "practice"')
        for part in ("grpo", "select"):
            if getattr(self, part).wordings == "untaught" and self.teacher.templates is None:
                raise ValueError(f'{part}.wordings = "untaught" needs teacher.templates: with every template taught, no wording is untaught')
        return self

    def plan_fields(self) -> dict[str, Any]:
        """The recipe as `forgetui.learning.Plan` field values."""
        return {
            "harness": self.harness, "seed": self.seed, "concurrency": self.concurrency, "sampler": self.sampler,
            "max_calls": self.max_calls, "dtype": self.dtype, "sft_epochs": self.sft.epochs, "sft_lr": self.sft.lr,
            "teacher_templates": self.teacher.templates, "teacher_samples": self.teacher.samples,
            "grpo_steps": self.grpo.steps, "grpo_lr": self.grpo.lr, "grpo_warmup": self.grpo.warmup_steps, "grpo_temperature": self.grpo.temperature,
            "grpo_samples": self.grpo.group_size, "grpo_tasks_per_step": self.grpo.tasks_per_step,
            "grpo_extra_batches": self.grpo.extra_batches, "grpo_kl_coef": self.grpo.kl_coef,
            "grpo_entropy_coef": self.grpo.entropy_coef, "grpo_call_discount": self.grpo.call_discount, "grpo_stratify_by": self.grpo.stratify_by, "grpo_merge": self.grpo.merge, "grpo_wordings": self.grpo.wordings, "select_every": self.select.every,
            "select_eval_n": self.select.eval_n, "select_samples": self.select.samples, "select_patience": self.select.patience,
            "select_wordings": self.select.wordings, "select_start": self.select.start,
            "select_held_out": self.select.held_out,
        }


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe file; ConfigError naming the file and each wrong field."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no recipe file at {path} (the shipped ones: examples/learn/<harness>.toml)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"recipe {path} is not valid TOML: {exc}") from None
    try:
        return validated(Recipe, data)
    except ConfigError as exc:
        raise ConfigError(f"recipe {path}: {str(exc).removeprefix('invalid config: ')}") from None
