"""`forgetui train --trainer verl`: the dataset, the agent-loop YAML, Hydra overrides and veRL's PPO entry point.

Everything goes under runs/<run_id>/verl/: train.parquet, val.parquet, forgetui.toml (the resolved run
config the agent-loop workers load), agent_loop.yaml, overrides.txt (one override a line) and
command.sh (the command line). veRL itself needs GPUs (vLLM rollout, FSDP actor): without one the
launch stops with a clear error after writing those files. While veRL runs, the launcher writes one
`train_steps` row per trainer step into runs/<run_id>/store.duckdb from veRL's `file` logger
(`core.train.verl.metrics_sink`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import (
    GroupSettings,
    PolicyLossSettings,
    RunConfig,
    RunTrainingSettings,
    UpdateSettings,
    dump_toml,
)
from core.errors import ConfigError
from core.eval.summary import RunSummary, summarize
from core.models.resolve import resolve_model
from core.paths import home, runs_dir
from core.session.setup import new_run_id
from core.status import RunStatus
from core.store.writer import Store
from core.train.trainers import RunHooks
from core.train.verl.dataset import AGENT_NAME, write_dataset
from core.train.verl.metrics_sink import FILE_LOGGER_ENV, MetricsSink, metrics_path, run_recording_metrics
from core.train.verl.worker import CONFIG_ENV, RUN_ID_ENV

log = logging.getLogger(__name__)

ENTRY_POINT = "verl.trainer.main_ppo"
AGENT_LOOP_TARGET = "core.train.verl.agent_loop.ForgetuiAgentLoop"


@dataclass
class ClusterOptions:
    """What the run config does not say about the cluster and veRL's budgets."""

    nnodes: int = 1
    n_gpus_per_node: int = 8
    model: str | None = None  # the policy's HF folder or hub id (default: from policy.backend)
    max_prompt_length: int = 4096
    max_response_length: int = 8192
    tensor_parallel: int = 1
    agent_workers: int | None = None
    extra: list[str] = field(default_factory=list)  # raw Hydra overrides, appended last


@dataclass
class VerlPlan:
    """The files written for one veRL run and the command that trains on them."""

    run_id: str
    folder: Path
    train_file: Path
    val_file: Path
    agent_loop_yaml: Path
    overrides_file: Path
    overrides: list[str]
    n_train: int
    n_val: int
    config: RunConfig | None = None  # the run config the plan was made from (the runs row's)

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", ENTRY_POINT, *self.overrides]

    def command_line(self) -> str:
        return shlex.join(self.command)


def model_path(config: RunConfig, override: str | None) -> str:
    """The policy's weights as veRL loads them: --model, or the HF folder behind builtin:MODEL / vllm's tokenizer."""
    if override:
        return override
    spec = config.policy.spec
    source = spec.weights_source(config.policy.tokenizer) if spec.declared.trainable != "no" else None
    if source:
        return str(resolve_model(source)) if spec.declared.trainable == "weights" else source
    raise ConfigError(f"policy.backend {config.policy.backend!r} names no weights veRL can train: pass --model HF_FOLDER_OR_HUB_ID")


def verl_overrides(config: RunConfig, plan_files: dict[str, Path], run_id: str, n_train: int, opts: ClusterOptions) -> list[str]:
    """Hydra overrides of veRL's ppo_trainer for this run config."""
    train = config.train
    batch = min(train.tasks_per_step or n_train, n_train)
    micro = train.micro_batch_size
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    out = [
        f"data.train_files={plan_files['train']}",
        f"data.val_files={plan_files['val']}",
        f"data.train_batch_size={batch}",
        f"data.max_prompt_length={opts.max_prompt_length}",
        f"data.max_response_length={opts.max_response_length}",
        "data.return_raw_chat=True",
        f"actor_rollout_ref.model.path={model_path(config, opts.model)}",
        f"{actor}.optim.lr={train.lr}",
        f"{actor}.optim.clip_grad={train.max_grad_norm}",
        f"{actor}.ppo_mini_batch_size={batch}",
        f"{actor}.ppo_micro_batch_size_per_gpu={micro}",
        f"{actor}.policy_loss.loss_mode={train.policy_loss}",
        f"{actor}.clip_ratio={train.clip_ratio}",
        f"{actor}.loss_agg_mode={train.loss_agg_mode}",
        f"{actor}.entropy_coeff={train.entropy_coef}",
        f"{actor}.use_kl_loss={train.kl_coef > 0}",
        f"{actor}.kl_loss_coef={train.kl_coef}",
        f"{actor}.kl_loss_type={train.kl_type}",
        f"{rollout}.name=vllm",
        f"{rollout}.mode=async",
        f"{rollout}.calculate_log_probs=True",
        f"{rollout}.n={config.run.n_samples}",
        f"{rollout}.temperature={train.temperature}",
        f"{rollout}.tensor_model_parallel_size={opts.tensor_parallel}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={micro}",
        f"{rollout}.agent.agent_loop_config_path={plan_files['agent_loop']}",
        f"{rollout}.agent.default_agent_loop={AGENT_NAME}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        f"algorithm.adv_estimator={train.estimator}",
        f"algorithm.norm_adv_by_std_in_grpo={train.norm_adv_by_std}",
        f"trainer.nnodes={opts.nnodes}",
        f"trainer.n_gpus_per_node={opts.n_gpus_per_node}",
        f"trainer.total_training_steps={train.steps}",
        f"trainer.save_freq={train.save_every or -1}",
        f"trainer.default_local_dir={runs_dir() / run_id / 'checkpoints'}",
        "trainer.project_name=forgetui",
        f"trainer.experiment_name={run_id}",
        "trainer.logger=[console,file]",  # file: veRL's per-step metrics, which the launcher turns into train_steps rows
        f"+ray_kwargs.ray_init.runtime_env.env_vars.FORGETUI_HOME={home()}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{FILE_LOGGER_ENV}={metrics_path(runs_dir() / run_id)}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{CONFIG_ENV}={plan_files['config']}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{RUN_ID_ENV}={run_id}",
    ]
    if train.warmup_steps:
        out.append(f"{actor}.optim.lr_warmup_steps={train.warmup_steps}")
    if train.lora_rank:
        out += [f"actor_rollout_ref.model.lora_rank={train.lora_rank}", f"actor_rollout_ref.model.lora_alpha={train.lora_alpha}"]
    if train.seed is not None:
        out.append(f"data.seed={train.seed}")
    if opts.agent_workers:
        out.append(f"{rollout}.agent.num_workers={opts.agent_workers}")
    return out + list(opts.extra)


def agent_loop_yaml(config_path: Path, run_id: str) -> str:
    """veRL's agent-loop config: the `forgetui` loop, its run config and the run every worker records into."""
    return (
        f"- name: {AGENT_NAME}\n"
        f"  _target_: {AGENT_LOOP_TARGET}\n"
        f"  forgetui_config: {config_path}\n"
        f"  run_id: {run_id}\n"
    )


def prepare(config: RunConfig, opts: ClusterOptions, run_id: str | None = None) -> VerlPlan:
    """Write the dataset, the run config, the agent-loop YAML and the overrides under runs/<run_id>/verl/."""
    if config.train.steps <= 0:
        raise ConfigError("forgetui train needs train.steps > 0 (--set train.steps=N)")
    run_id = run_id or new_run_id()
    folder = runs_dir() / run_id / "verl"
    train_file, val_file, n_train, n_val = write_dataset(config, folder)
    files = {"train": train_file, "val": val_file, "config": folder / "forgetui.toml", "agent_loop": folder / "agent_loop.yaml"}
    files["config"].write_text(dump_toml(config))
    files["agent_loop"].write_text(agent_loop_yaml(files["config"], run_id))
    overrides = verl_overrides(config, files, run_id, n_train, opts)
    plan = VerlPlan(run_id, folder, train_file, val_file, files["agent_loop"], folder / "overrides.txt", overrides, n_train, n_val, config)
    plan.overrides_file.write_text("\n".join(overrides) + "\n")
    (folder / "command.sh").write_text("#!/bin/sh\n" + plan.command_line() + "\n")
    return plan


def gpu_count() -> int:
    """CUDA devices torch sees here (0 without torch or CUDA)."""
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def launch(plan: VerlPlan) -> int:
    """Run veRL's PPO entry point on the plan (needs GPUs); its exit status."""
    if gpu_count() == 0:
        raise ConfigError(
            "no GPU on this machine: veRL's PPO trainer needs NVIDIA GPUs (vLLM rollout, FSDP actor) and cannot train on CPU. "
            f"The dataset and overrides are written in {plan.folder}; run {plan.folder / 'command.sh'} on a GPU node "
            "(or `forgetui train CONFIG --trainer local` here)"
        )
    run_dir = runs_dir() / plan.run_id
    env = dict(os.environ, FORGETUI_HOME=str(home()), **{CONFIG_ENV: str(plan.folder / "forgetui.toml"), RUN_ID_ENV: plan.run_id, FILE_LOGGER_ENV: str(metrics_path(run_dir))})
    if not logs_to_file(plan.overrides):
        log.warning("trainer.logger has no `file` backend (an --override replaced it): this run gets no train_steps rows")
    log.info("launching veRL: %s", plan.command_line())
    sink = MetricsSink(plan.run_id, run_dir, plan.config.model_dump() if plan.config is not None else None)
    return run_recording_metrics(plan.command, env, sink)


def logs_to_file(overrides: list[str]) -> bool:
    """Whether the last trainer.logger override keeps veRL's `file` backend (what the metrics sink reads)."""
    loggers = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("trainer.logger=")]
    return bool(loggers) and "file" in loggers[-1].strip("[]").replace(" ", "").split(",")


class VerlTrainerRun:
    """`train.trainer = "verl"`: veRL's PPO trainer on GPU nodes, each veRL rollout a forgetui rollout (its own process).

    Options (`forgetui train --trainer verl ...`): the `ClusterOptions` fields, `dry_run` (write the files and
    the command, launch nothing) and `on_plan` (told the plan before the launch). The summary's `extra` has the command line, the files and veRL's exit code.
    """

    name = "verl"
    runs_rollouts = True
    settings = (RunTrainingSettings, UpdateSettings, PolicyLossSettings, GroupSettings)  # not LocalGrpoSettings: check() refuses call_discount

    def __init__(self, dry_run: bool = False, on_plan: Callable[[VerlPlan], None] | None = None, **cluster: Any) -> None:
        self.dry_run = dry_run
        self.on_plan = on_plan  # told the plan (its command line) once the files are written, before the launch
        self.cluster = ClusterOptions(**cluster)

    def trains(self, config: RunConfig) -> bool:
        return config.train.steps > 0

    def check(self, config: RunConfig) -> None:
        if config.train.call_discount != 1.0:
            raise ConfigError(
                f"train.call_discount = {config.train.call_discount} is the local trainer's: veRL's estimators give one "
                "advantage per sample; remove it or use train.trainer = \"local\""
            )
        model_path(config, self.cluster.model)

    async def train(self, config: RunConfig, *, resume: str | None, hooks: RunHooks, ks: list[int] | None) -> RunSummary:
        plan = prepare(config, self.cluster, resume)
        log.info("veRL run %s: %d train / %d val tasks, overrides in %s", plan.run_id, plan.n_train, plan.n_val, plan.overrides_file)
        if hooks.on_start is not None:
            hooks.on_start(plan.run_id, 0)
        if self.on_plan is not None:
            self.on_plan(plan)
        code = None if self.dry_run else await asyncio.to_thread(launch, plan)
        store = runs_dir() / plan.run_id / "store.duckdb"
        summary = _store_summary(plan.run_id, store, ks)
        summary.extra.update({"trainer": "verl", "command": plan.command_line(), "folder": str(plan.folder), "exit_code": code, "dry_run": self.dry_run})
        if code:
            summary.status = RunStatus.FAILED
        return summary


def _store_summary(run_id: str, store_path: Path, ks: list[int] | None) -> RunSummary:
    """The run's summary from the store veRL's metrics sink and agent-loop shards wrote (empty when nothing ran)."""
    if not store_path.exists():
        return RunSummary(run_id, 0, 0, 0, 0, 0, None, {}, {}, str(store_path))
    store = Store.open(store_path)
    try:
        return summarize(store, run_id, store_path, ks)
    finally:
        store.close()
