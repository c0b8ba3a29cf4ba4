"""The `mini-swe-agent` harness: SWE-agent's minimal bash-only agent (PyPI `mini-swe-agent`) over chat completions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field

from core.adapter import (
    INSTALL_ROOT,
    AdapterOptions,
    Endpoint,
    ExecResult,
    Harness,
    HarnessOutcome,
    ImageLayer,
    LaunchSpec,
    Task,
    pip_layer,
)
from harnesses import versions

RUN_DIR = "/tmp/forgetui-mini"
TRAJECTORY_PATH = f"{RUN_DIR}/traj.json"
CONFIG_DIR = f"{RUN_DIR}/config"  # MSWEA_GLOBAL_CONFIG_DIR: keeps its .env out of the task's way
CLI_MODULE = "minisweagent.run.mini"  # the `mini` console script is minisweagent.run.mini:app
STATUS_MARK = "forgetui-mini-exit-status:"
# mini exits 0 whatever happened; after it ends the launcher prints the trajectory's exit status
LAUNCHER = (
    'mini "$@"; rc=$?; '
    "python3 -c 'import json, sys; print(\"" + STATUS_MARK + " \" + json.load(open(sys.argv[1]))[\"info\"][\"exit_status\"])' "
    + TRAJECTORY_PATH
    + " 2>/dev/null || echo '"
    + STATUS_MARK
    + " NoTrajectory'; exit $rc"
)
_STATUS_RE = re.compile(re.escape(STATUS_MARK) + r" *(\S*)")
# The packages are installed without bytecode and the harness runs with PYTHONDONTWRITEBYTECODE, so
# every fresh container compiled LiteLLM's modules from source before its first model call (an
# `import litellm` took 39–49 s in a fresh container on a busy 2-core host, 12 s with bytecode).
# Compile once in the image layer; a container only reads the .pyc files.
SITE = f"{INSTALL_ROOT}/mini-swe-agent/site"
COMPILE = f"RUN python3 -m compileall -q -j 0 {SITE} > /dev/null || true"
# The model class mini runs with by default (`client = "requests"`): mini's OpenRouter model sent to the proxy,
# without LiteLLM's ~3 CPU-s import in every sandbox (sandbox/forgetui_mini_model.py says why and how)
PROXY_MODEL_FILE = Path(__file__).parent / "sandbox" / "forgetui_mini_model.py"
PROXY_MODEL_CLASS = "forgetui_mini_model.ProxyModel"
PROXY_MODEL_CONTEXT = "mini-swe-agent-model/forgetui_mini_model.py"


class MiniSweAgentHarness(Harness):
    """Options: ``step_limit`` (0: none), ``command_timeout`` (60 s a command), ``retries`` (3 model-call attempts),
    ``client`` (auto | requests | litellm), ``extra_config`` (more `-c key=value` specs)."""

    name = "mini-swe-agent"
    version = versions.version_of(versions.MINI_SWE_AGENT)
    installable = True
    protocols = ("chat",)

    class Options(AdapterOptions):
        step_limit: int = Field(0, description="agent.step_limit (0: none)")
        command_timeout: int = Field(60, description="environment.timeout: seconds one command may run")
        retries: int = Field(3, description="model-call attempts (at least 1)")
        client: Literal["auto", "requests", "litellm"] = Field(
            "auto", description="how mini calls the proxy: requests (forgetui's model class on mini 2.x's OpenRouter model, no LiteLLM import: "
                                "~3 CPU-s less a sandbox), litellm (mini's own default) or auto (requests on mini 2.x, litellm before)")
        extra_config: list[str] = Field(default_factory=list, description="more `-c key=value` specs")

    opts: Options

    def image_layer(self) -> ImageLayer:
        extra = f"COPY {PROXY_MODEL_CONTEXT} {SITE}/forgetui_mini_model.py\n{COMPILE}"
        layer = pip_layer("mini-swe-agent", [versions.spec_at(versions.MINI_SWE_AGENT, self.version)], scripts={"mini": CLI_MODULE}, extra=extra)
        return layer._replace(files={**layer.files, PROXY_MODEL_CONTEXT: PROXY_MODEL_FILE.read_bytes()})

    def client(self) -> str:
        """The model client this run's mini uses: `client`, with auto = requests from mini 2.0 on (its tool-calling models)."""
        if self.opts.client != "auto":
            return self.opts.client
        major = self.version.split(".", 1)[0]
        return "requests" if major.isdigit() and int(major) >= 2 else "litellm"

    def config_specs(self, task: Task, endpoint: Endpoint, workdir: str) -> list[str]:
        """The `-c` specs: the built-in mini.yaml, then our overrides (key=value, values parsed as JSON)."""
        specs = [
            "mini.yaml",
            f"model.model_kwargs.api_base={endpoint.openai_base}",
            f"environment.cwd={workdir}",
            f"environment.timeout={self.opts.command_timeout}",
            f"agent.step_limit={self.opts.step_limit}",
        ]
        if self.client() == "requests":
            specs.append(f"model.model_class={PROXY_MODEL_CLASS}")
        if task.timeout_s:
            specs.append(f"agent.wall_time_limit_seconds={int(task.timeout_s)}")
        return specs + self.opts.extra_config

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        model = endpoint.model if self.client() == "requests" else f"openai/{endpoint.model}"  # LiteLLM's provider prefix
        args = ["-m", model, "-t", task.instruction, "--yolo", "--exit-immediately", "--cost-limit", "0"]
        for spec in self.config_specs(task, endpoint, workdir):
            args += ["-c", spec]
        args += ["-o", TRAJECTORY_PATH]
        env = {
            "OPENAI_API_KEY": endpoint.token,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_GLOBAL_CONFIG_DIR": CONFIG_DIR,
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(max(1, self.opts.retries)),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the model cost map from GitHub
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "TERM": "dumb",
            "NO_COLOR": "1",
        }
        return LaunchSpec(command=["sh", "-c", LAUNCHER, "mini", *args], env=env, workdir=workdir)

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        status = exit_status(result.stdout)
        ok = result.exit_code == 0 and not result.timed_out and status == "Submitted"
        head = "timed out" if result.timed_out else f"exit {result.exit_code}, exit_status {status or 'unknown'}"
        return HarnessOutcome(ok=ok, detail=f"{head}\n{(result.stderr or result.stdout)[-2000:]}".strip())


def exit_status(stdout: str) -> str | None:
    """The trajectory's exit status the launcher printed (Submitted, LimitsExceeded, RepeatedFormatError, ...)."""
    found = _STATUS_RE.findall(stdout or "")
    return found[-1] or None if found else None


__all__ = ["MiniSweAgentHarness", "exit_status"]
