"""The `forgetui` veRL agent loop: each `run()` is one real sandbox rollout of the dataset row's task.

The row's `extra_info` names the env, the task id and the env options; the harness, env and runtime
come from a forgetui run config (`forgetui_config` in the agent-loop YAML, or FORGETUI_VERL_CONFIG).
The worker's proxy samples through veRL's inference client; the verifier's reward and the recorded
calls (merged into one sample per branch by `core.train.samples`) become one `AgentLoopOutput` per
branch: veRL's V1 path (`trainer.use_v1`, the default) stores each as its own sample with the
rollout's reward; the legacy path takes one output, so it gets the branch with most sampled tokens.

Register it with an agent-loop YAML (`forgetui train --trainer verl` writes one):

    - name: forgetui
      _target_: core.train.verl.agent_loop.ForgetuiAgentLoop
      forgetui_config: /path/to/run.toml
      run_id: <run id shared by every worker>
"""

from __future__ import annotations

import json
import logging
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from core.errors import ForgetuiError
from core.train.verl.outputs import Limits, branch_fields, pick_single, placeholder_fields
from core.train.verl.worker import RolloutOutcome, worker_run

log = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    """numpy scalars/arrays and 0-d objects from veRL's batch → plain Python."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return value


def rollout_step(kwargs: dict[str, Any]) -> int:
    """forgetui's step of a rollout: veRL's `global_steps` − 1, counted from 0 as `train_steps.step` is.

    veRL's trainer sets `global_steps` to 1 before its first training step and hands it to every rollout
    of that step (V1: as the batch's `global_steps`); it logs the same number as `training/global_step`,
    which the metrics sink records as `train_steps.step` = that − 1. Validation before training (0) and a
    batch without the key (veRL's legacy path keeps it in `meta_info`) are step 0.
    """
    return max(int(_plain(kwargs.get("global_steps", 0)) or 0) - 1, 0)


def row_task(kwargs: dict[str, Any]) -> tuple[str | None, str, dict[str, Any]]:
    """(env name, task id, env options) from a dataset row's extra_info."""
    info = _plain(kwargs.get("extra_info")) or {}
    task_id = info.get("task_id")
    if not task_id:
        raise ForgetuiError(f"dataset row has no extra_info.task_id (got keys {sorted(info)}); write the dataset with `forgetui train --dry-run`")
    options = info.get("env_options") or {}
    if isinstance(options, str):
        options = json.loads(options or "{}")
    return info.get("env"), str(task_id), dict(options)


@register("forgetui")
class ForgetuiAgentLoop(AgentLoopBase):
    """One forgetui rollout (sandbox + harness + proxy + verifier) per veRL rollout."""

    def __init__(self, *args: Any, forgetui_config: str | None = None, run_id: str | None = None, **kwargs: Any) -> None:
        kwargs.pop("name", None)  # the YAML entry's own name, passed along by hydra
        super().__init__(*args, **kwargs)
        self.forgetui_config = forgetui_config
        self.run_id = run_id
        rc = self.rollout_config
        self.limits = Limits(prompt_length=int(rc.prompt_length), response_length=int(rc.response_length))
        self.context_length = int(rc.get("max_model_len") or 0) or self.limits.prompt_length + self.limits.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run the row's task in a sandbox; one output per recorded branch (see the module docstring)."""
        env_name, task_id, options = row_task(kwargs)
        worker = await worker_run(
            self.server_manager, self.tokenizer, config_path=self.forgetui_config, run_id=self.run_id, context_length=self.context_length
        )
        task = worker.find_task(task_id, env_name, options)
        index = int(_plain(kwargs.get("session_id", 0)) or 0)
        outcome = await worker.run_task(task, step=rollout_step(kwargs), sample_index=index, sampling_params=sampling_params)
        outputs = self._outputs(outcome)
        if len(outputs) > 1 and not self.config.trainer.get("use_v1", True):
            log.warning("rollout %s has %d branches; veRL's legacy path takes one output: the branch with most sampled tokens", outcome.rollout_id, len(outputs))
            keep = pick_single(outcome.samples)
            return next(o for o in outputs if o.extra_fields["forgetui_branch"] == keep.branch)
        return outputs if len(outputs) > 1 else outputs[0]

    def _outputs(self, outcome: RolloutOutcome) -> list[AgentLoopOutput]:
        """AgentLoopOutputs of a finished rollout (infra errors raise: they have no score)."""
        result = outcome.result
        status = str(result.status)
        if status == "infra_error":
            raise ForgetuiError(f"rollout {outcome.rollout_id} hit an infrastructure error (no score to learn from): {result.error}")
        metrics = AgentLoopMetrics(generate_sequences=outcome.seconds)
        passed = result.passed
        if not outcome.samples:
            log.info("rollout %s (%s) made no model call: a masked placeholder carries its reward", outcome.rollout_id, status)
            fields = placeholder_fields(self._task_prompt(outcome), self._filler_id(), float(result.reward or 0.0), outcome.rollout_id, passed)
            return [AgentLoopOutput(**fields, metrics=metrics)]
        return [AgentLoopOutput(**branch_fields(s, self.limits, passed=passed), metrics=metrics.model_copy()) for s in outcome.samples]

    def _task_prompt(self, outcome: RolloutOutcome) -> list[int]:
        """The task's instruction under the policy's chat template (the placeholder's prompt)."""
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": outcome.task.instruction}], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return list(ids)[-self.limits.prompt_length :]

    def _filler_id(self) -> int:
        tok = self.tokenizer
        return int(tok.eos_token_id if tok.eos_token_id is not None else (tok.pad_token_id or 0))
