"""The run config: one typed object, loaded from TOML, overridable with `--set a.b=c`, stored with every run."""

from __future__ import annotations

import logging
import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from core.backends.spec import PolicySpec
from core.errors import ConfigError
from core.models.precision import DTYPES
from core.options import validated
from core.runtime.docker.egress import EgressPolicy
from core.runtime.k8s.config import KubernetesConfig, migrate_legacy
from core.secrets import redact

log = logging.getLogger(__name__)


# Bounds every numeric field carries (issue 44): integers fit a store's BIGINT, floats are finite (allow_inf_nan=False
# on every section), and each field has a range it can work in (tests/test_bounds.py walks the models for a field without one)
INT64_MAX = 2**63 - 1
WEEK_S = 7 * 24 * 3600.0


# The allowed values of the config's choices, declared once (core.train.local takes its tuples from these).
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
RolloutCorrection = Literal["auto", "token", "sequence", "off"]
Dtype = Literal[DTYPES]  # what a model computes in: core.models.precision names the choices, policy.dtype and train.dtype take them


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class EnvConfig(_Section):
    name: str = Field("toy", description="the environment by registry name (toy, claw-bench, harbor, miniwob, desktop, or a plugin's)")
    tasks: list[str] | None = Field(None, description="task ids or globs (comma-separated with --set)")
    limit: int | None = Field(None, ge=1, le=INT64_MAX, description="at most this many tasks (after filtering)")
    path: str | None = Field(None, description="a folder of tasks, for envs that load one (harbor)")
    options: dict[str, Any] = Field(default_factory=dict, description="passed to the environment as keyword arguments (an option the env does not take is an error)")
    strict: bool = Field(False, description="fail on any task that does not load (harbor), instead of skipping it with a warning")

    @field_validator("tasks", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


class HarnessConfig(_Section):
    name: str = Field("react", description="the harness by registry name (react, codex, claude-code, gemini-cli, opencode, openclaw, pi, mini-swe-agent, zeroclaw, or a plugin's)")
    binary: str | None = Field(None, description="a harness binary the user provides (zeroclaw)")
    version: str | None = Field(None, description="install this published release of an npm/PyPI harness instead of the pinned one (harnesses/versions.py)")
    options: dict[str, Any] = Field(default_factory=dict, description="passed to the harness adapter, checked against its Options (an option it does not take is an error)")

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_text(cls, value: Any) -> Any:
        """`--set harness.version=1.10` parses as the number 1.1: ask for quotes instead of installing the wrong release."""
        if value is not None and not isinstance(value, str):
            raise ValueError(f"got the number {value!r}: write the version quoted, as in TOML harness.version = \"1.10.0\" or --set 'harness.version=\"1.10.0\"'")
        return value

    def adapter_options(self) -> dict[str, Any]:
        """What the harness adapter is built with: `options`, plus `binary` and `version` when set."""
        given = {"binary": self.binary, "version": self.version}
        return {**{k: v for k, v in given.items() if v is not None}, **self.options}


class PolicyConfig(_Section):
    backend: str = Field("builtin:tiny", description="builtin:MODEL | scripted:FILE | vllm:URL (a server you run) | vllm:MODEL (a vLLM server the run starts) | litellm:MODEL")
    tokenizer: str | None = Field(None, description="the policy's model for tokenization (vllm:URL needs it)")
    parser: str = Field("hermes", description="how tool calls are read from the sampled text (a backend spec's ?parser= wins)")
    model_name: str = Field("policy", description="the model name harnesses are told to request")
    max_tokens: int | None = Field(None, ge=1, le=1 << 31, description="default completion cap when a harness asks for none")
    dtype: Dtype = Field("auto", description="builtin: what the sampler computes in (auto: train.dtype when that is set, else bfloat16 on a CUDA GPU and float32 on a CPU)")
    _spec: PolicySpec = PrivateAttr()

    @model_validator(mode="after")
    def _parse_backend(self) -> PolicyConfig:
        """`backend` is parsed here, once (again whenever it is assigned): every caller reads `spec`."""
        try:
            self._spec = PolicySpec.parse(self.backend)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if self.dtype != "auto" and self._spec.kind == "builtin":
            given = self._spec.options.get("dtype")
            if given is None:
                self._spec = self._spec.with_option("dtype", self.dtype)
            elif given != self.dtype:  # a spec's own `?dtype=` wins
                log.warning("policy.dtype = %s is overridden by the backend spec's dtype=%s", self.dtype, given)
        return self

    @property
    def spec(self) -> PolicySpec:
        """The parsed `backend`."""
        return self._spec


class RuntimeConfig(_Section):
    kind: Literal["auto", "docker", "kubernetes", "local"] = Field("auto", description="where sandboxes run (auto: docker when an engine answers, else local processes, with a warning)")
    base_image: str = Field("forgetui/base:bookworm", description="the image env and harness layers build on (forgetui images bootstrap makes the default)")
    cpus: float = Field(1.0, gt=0, le=4096, description="CPU limit per sandbox")
    memory: str = Field("2g", description="memory limit per sandbox (Docker's units: 512m, 2g)")
    pids_limit: int = Field(512, ge=16, le=1 << 22, description="processes per sandbox at most")
    network: Literal["isolated", "host", "bridge"] = Field("isolated", description="docker: isolated = the sandbox reaches the proxy and nothing else; host = the host's network (a warning); bridge = Docker's bridge")
    egress_allow: list[str] = Field(default_factory=list, description="docker, isolated: names a sandbox may reach through forgetui's egress proxy (host, host:port, *.domain; empty = nothing); Kubernetes pods take CIDRs in runtime.kubernetes.egress_allow")
    egress_allow_private: list[str] = Field(default_factory=list, description="exact names of egress_allow that may resolve to loopback/private addresses (link-local and metadata never)")
    workdir: str = Field("/workspace", description="the task's working folder inside the sandbox")
    ca_bundle: str | None = Field(None, description="CA bundle for image build steps behind a TLS-intercepting proxy")
    shared_harness: bool = Field(True, description="the harness is installed once and mounted read-only (docker: a volume, for tasks with their own image; kubernetes: from its own image, for every task) instead of a copy baked into each task image")
    registry: str | None = Field(None, description="kubernetes: the registry pods pull from (`forgetui images build CONFIG --push` pushes there)")
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)

    @model_validator(mode="before")
    @classmethod
    def _kubernetes_keys(cls, values: Any) -> Any:
        """The old runtime.namespace/kubeconfig/image_pull_policy move into runtime.kubernetes."""
        return migrate_legacy(values)

    @field_validator("egress_allow", "egress_allow_private", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        if isinstance(value, str):  # --set runtime.egress_allow=a.example,b.example
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _egress(self) -> RuntimeConfig:
        """Egress patterns parse, and apply where a named destination means something (docker, isolated)."""
        if not (self.egress_allow or self.egress_allow_private):
            return self
        if self.kind == "kubernetes":
            raise ValueError("runtime.egress_allow names hosts for Docker sandboxes; a Kubernetes NetworkPolicy matches addresses only: put CIDRs in runtime.kubernetes.egress_allow")
        if self.network != "isolated":
            raise ValueError(f"runtime.egress_allow applies to runtime.network = \"isolated\" only (a {self.network} network already reaches everything)")
        try:
            EgressPolicy(self.egress_allow, self.egress_allow_private)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self


class ProxyConfig(_Section):
    host: str = Field("127.0.0.1", description="the address the proxy listens on (0.0.0.0 for pods that reach it over the network)")
    port: int = Field(0, ge=0, le=65535, description="0 = any free port")
    public_url: str | None = Field(None, description="the proxy's address as sandboxes see it (bridge networks, Kubernetes pods)")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, le=1 << 40, description="the largest request body the proxy accepts (larger: HTTP 413 in the caller's protocol)")


class RunSettings(_Section):
    n_samples: int = Field(1, ge=1, le=1 << 20, description="rollouts per task (a GRPO group)")
    concurrency: int = Field(4, ge=1, le=1 << 16, description="rollouts (sandboxes) in flight at once")
    timeout_s: float | None = Field(None, gt=0, le=WEEK_S, description="a cap on every rollout's wall clock, and the wall clock of tasks that set none (unset: no cap, 600 s for those)")
    timeout_scale: float = Field(1.0, gt=0, le=1e6, description="multiplies a task's own timeout (before the run.timeout_s cap)")
    call_timeout_s: float | None = Field(300.0, gt=0, le=WEEK_S, description="per model call")
    max_calls: int | None = Field(None, ge=1, le=INT64_MAX, description="model calls a rollout may make; the proxy refuses the next (HTTP 403 in the caller's protocol), the harness ends as it ends on a refused call and the verifier scores what it left (unset: no cap)")
    max_retries: int = Field(2, ge=0, le=1000, description="retries of infrastructure failures only")
    seed: int = Field(0, ge=0, le=INT64_MAX, description="the run's seed: the sampler's draws (each rollout's calls seeded from it and the rollout's task, step, sample and attempt: the same seed samples the same tokens), and task order and SFT example order where train.seed is unset")


class TrainSettingsGroup(_Section):
    """A group of [train] settings. Each trainer names the groups it reads (`Trainer.settings`, core.train.trainers),
    and TrainConfig is every group together: one flat table, each key declared in one group."""


class UpdateSettings(TrainSettingsGroup):
    """How the weights are updated."""

    lr: float = Field(1e-6, gt=0, le=1e6, description="AdamW learning rate (LoRA wants ~1e-5 to 1e-4)")
    max_grad_norm: float = Field(1.0, gt=0, le=1e12, description="gradients clipped to this global norm")
    warmup_steps: int = Field(0, ge=0, le=INT64_MAX, description="optimizer steps of linear learning-rate warm-up")
    lora_rank: int = Field(0, ge=0, le=1 << 20, description="0 = full fine-tuning")
    lora_alpha: float = Field(32.0, gt=0, le=1e12, description="LoRA scaling (alpha / rank multiplies the adapter)")
    seed: int | None = Field(None, ge=0, le=INT64_MAX, description="the trainer's seed: task order, refills, example order and initialisation (unset: run.seed)")


class PolicyLossSettings(TrainSettingsGroup):
    """The policy-gradient loss, computed by veRL's functions."""

    temperature: float = Field(1.0, gt=0, le=1e6, description="the sampling temperature the trainer recomputes logprobs at")
    policy_loss: str = Field("vanilla", description="the policy loss by name in veRL's registry (vanilla, gspo, ...)")
    loss_agg_mode: LossAggMode = Field("token-mean", description="how the loss sums over tokens (veRL's agg_loss; token-mean: a rollout weighs its sampled tokens, however many branches)")
    clip_ratio: float = Field(0.2, gt=0, le=1e6, description="PPO/GRPO ratio clip (ε)")
    kl_coef: float = Field(0.0, ge=0, le=1e12, description="> 0: KL to the frozen starting weights")
    kl_type: str = Field("low_var_kl", description="the KL estimator by veRL's kl_penalty name (kl, abs, mse, low_var_kl, with + variants)")
    entropy_coef: float = Field(0.0, ge=0, le=1e12, description="> 0: an entropy bonus in the policy loss")


class InProcessSettings(TrainSettingsGroup):
    """The in-process trainer (core.train.local)."""

    pack_samples: int = Field(32, ge=1, le=1 << 20, description="samples per forward/backward at most (and 8,192 tokens); a GRPO step is one optimizer step over all its forwards, so this sets speed and memory only (samples that begin alike run their common beginning once per forward)")
    dtype: Dtype = Field("auto", description="what the trainer computes in, weights kept float32 (auto: the builtin sampler's dtype when policy.dtype or its spec's dtype= sets one, else bfloat16 on a CUDA GPU and float32 on a CPU: exact logprob agreement)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass: far less memory for long samples, ~30% more time")
    share_prefix: bool = Field(True, description="samples of a micro-batch that begin alike (system prompt, a GRPO group's prompt) run that beginning once: exact, fewer tokens per forward")
    rollout_correction: RolloutCorrection = Field("auto", description="truncated importance sampling of the sampler/trainer mismatch, veRL's (auto: where they disagree by > 1e-3)")


class TrainerStateSettings(TrainSettingsGroup):
    """What the in-process trainers keep in their checkpoints besides the weights."""

    keep_states: int = Field(1, ge=1, le=1 << 20, description="checkpoints that keep the trainer state a resume needs (optimizer moments and schedule: twice the weights in float32), the newest N; older ones keep their weights, served and scored as before")


class GroupSettings(TrainSettingsGroup):
    """What each step samples and how its rollouts' advantages are computed."""

    tasks_per_step: int | None = Field(None, ge=1, le=INT64_MAX, description="tasks in each step's batch (each run.n_samples times: a GRPO group); default all")
    estimator: str = Field("grpo", description="advantage estimator by name in veRL's registry (grpo, rloo, reinforce_plus_plus, ...)")
    norm_adv_by_std: bool = Field(True, description="GRPO's std normalisation; false = Dr.GRPO")


class LocalGrpoSettings(TrainSettingsGroup):
    """GRPO on this machine: task order, refills, per-call credit."""

    shuffle: bool = Field(True, description="each epoch walks the tasks in a seeded random order (train.seed, else run.seed); false = the env's order")
    stratify_by: str | None = Field(None, description="a task meta key (the toy env's family; a suite's domain): each step's batch and its refills are dealt round-robin over its values, each value's tasks in their own seeded epochs, so every step holds every value it has room for; none = one shuffle of all tasks")
    max_extra_batches: int = Field(0, ge=0, le=INT64_MAX, description="dynamic sampling (DAPO): while fewer groups than the step's first batch has tasks have rewards that differ, run up to this many refills of unused tasks in the same step, each sized by the share of groups with signal so far (at most twice the batch)")
    call_discount: float = Field(1.0, gt=0, le=1, description="per-call credit: call t of T gets advantage × γ^(T−1−t); 1 = every call shares the rollout's advantage")


class SftSettings(TrainSettingsGroup):
    """Fine-tuning on earlier runs' passing rollouts."""

    from_runs: list[str] = Field(default_factory=list, description="earlier runs whose passing rollouts to learn from")
    min_reward: float = Field(1.0, ge=-1e12, le=1e12, description="rollouts with at least this reward are the teacher's examples")
    epochs: int = Field(1, ge=1, le=1 << 20, description="passes over the examples")

    @field_validator("from_runs", mode="before")
    @classmethod
    def _split_runs(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


class RunTrainingSettings(TrainSettingsGroup):
    """Whether a run trains, with which trainer, its checkpoints and micro-batches."""

    steps: int = Field(0, ge=0, le=INT64_MAX, description="0 = evaluate only")
    trainer: str = Field("local", description="a trainer by registry name (core.train.trainers): local GRPO on one node, sft on earlier runs, verl on GPUs")
    save_every: int = Field(0, ge=0, le=INT64_MAX, description="checkpoint every N steps (0 = only at the end)")
    micro_batch_size: int = Field(4, ge=1, le=1 << 20, description="sft: examples per optimizer step; verl: samples per forward per GPU (gradient accumulation); the local trainer packs by pack_samples instead")


class TrainConfig(SftSettings, LocalGrpoSettings, GroupSettings, TrainerStateSettings, InProcessSettings, PolicyLossSettings, UpdateSettings, RunTrainingSettings):
    """Training: `steps` > 0 turns a run into a trainer (see core.train).

    One flat [train] table made of settings groups, each key declared once in one group; each trainer names the
    groups it reads (`Trainer.settings`) and the config reference shows a table per group with its trainers. The
    groups live here rather than in the trainers' modules because the config sits a floor below the trainers
    (pyproject's layers) and most are shared by two or three trainers; the local trainer's own options
    (core.train.local.LocalTrainerConfig) are built from three of them.
    """


class RunConfig(_Section):
    env: EnvConfig = Field(default_factory=EnvConfig)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    run: RunSettings = Field(default_factory=RunSettings)
    train: TrainConfig = Field(default_factory=TrainConfig)

    @model_validator(mode="before")
    @classmethod
    def _storable_input(cls, values: Any) -> Any:
        """An integer past 64 bits is refused as given, before a float field turns it into a float."""
        _check_storable(values)
        return values

    @model_validator(mode="after")
    def _storable_numbers(self) -> RunConfig:
        """Every number anywhere in the config (sections defined elsewhere and free-form options too) is finite and fits
        64 bits: the config is stored as JSON in the run's row, and a value past that lands the row in dead_letters."""
        _check_storable(self.model_dump())
        return self

    @model_validator(mode="after")
    def _one_dtype(self) -> RunConfig:
        """The built-in sampler and the trainer compute in one dtype: one set on either side (policy.dtype,
        the spec's `dtype=`, train.dtype) holds for both; set differently on both, the trainer's rollout
        correction weighs the mismatch (a warning says so)."""
        spec = self.policy.spec
        if spec.kind != "builtin":
            return self
        sampler, trainer = spec.options.get("dtype", "auto"), self.train.dtype
        if sampler != "auto" and trainer == "auto":
            self.train.dtype = sampler
        elif trainer != "auto" and sampler == "auto":
            self.policy.dtype = trainer  # re-parses the spec with dtype= added
        elif sampler != trainer:
            log.warning(
                "the sampler computes in %s and the trainer in %s: their logprobs will differ (the trainer's rollout correction "
                "weighs each token by π_trainer/π_sampler); set one dtype for both (policy.dtype or train.dtype)", sampler, trainer
            )
        return self


def _check_storable(values: Any) -> None:
    """ValueError naming the first number in `values` that is not finite or does not fit 64 bits."""
    bad = _unstorable_number(values, "")
    if bad is not None:
        where, value = bad
        raise ValueError(f"{where} = {value!r}: numbers in a config must be finite and fit 64 bits (between {-INT64_MAX - 1} and {INT64_MAX})")


def _unstorable_number(value: Any, where: str) -> tuple[str, Any] | None:
    """The first (dotted key, value) in `value` that is a non-finite float or an integer past 64 bits; None if none."""
    stack = [(where, value)]
    while stack:
        key, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            return key, item
        elif isinstance(item, int) and not isinstance(item, bool) and not -INT64_MAX - 1 <= item <= INT64_MAX:
            return key, item
    return None


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def _parse_value(raw: str) -> Any:
    """TOML scalars where they parse (numbers, booleans, arrays), else the plain string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), base_dir: Path | None = None) -> RunConfig:
    """Read a TOML config (or the defaults), apply `key=value` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"no config file at {path}") from None
        except IsADirectoryError:
            raise ConfigError(f"{path} is a folder, not a config file: give a run config (TOML), e.g. examples/local.toml") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); save the config as UTF-8 TOML") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
        base_dir = base_dir or path.parent
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        _set_path(data, key.strip(), _parse_value(raw.strip()))
    return _resolve_paths(validated(RunConfig, data), base_dir)


def _resolve_paths(config: RunConfig, base_dir: Path | None) -> RunConfig:
    """A scripted backend's file and env.path are relative to the config file."""
    if base_dir is None:
        return config
    spec = config.policy.spec
    if spec.declared.config_relative:
        target = Path(spec.target)
        if not target.is_absolute() and (base_dir / target).exists():
            config.policy.backend = str(spec.with_target(str((base_dir / target).resolve())))
    if config.env.path and not Path(config.env.path).is_absolute() and (base_dir / config.env.path).exists():
        config.env.path = str((base_dir / config.env.path).resolve())
    return config


def dump_toml(config: RunConfig) -> str:
    """The resolved config as TOML (what each run stores beside its store)."""
    lines: list[str] = []
    for section, model in config:
        lines.append(f"[{section}]")
        for key, value in redact(model.model_dump()).items():  # no key is ever written to disk
            if value is None:
                continue
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        # TOML has no null: a None inside a table is left out (as dump_toml leaves out top-level ones), not "None"
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None) + "}"
    return json.dumps(str(value))
