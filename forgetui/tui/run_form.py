"""The new-run form's model: which config keys it edits, and the config checked exactly as `forgetui run` loads it.

The form's values are `--set key=value` overrides on an optional base file, given to core's own loader
(`core.config.load_config`, as `forgetui run BASE --set ...` does, which also parses the backend spec); then
the names a run resolves only when it starts — env and harness (and their options, through
`core.registry.check_options`, which builds nothing), trainer, a scripted backend's file — are looked up in
core's registries, so a typo is an error under its field before anything launches.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Literal

from core.config import RunConfig, dump_toml, load_config
from core.errors import ConfigError, InvalidConfigError
from core.registry import check_options
from core.train.trainers import trainer_for

# (dotted key, label, placeholder): what a new run most often sets; everything else comes from the base config
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("env.name", "env", "toy"),
    ("env.tasks", "tasks (ids or globs)", '["hello"]'),
    ("env.limit", "task limit", "all"),
    ("harness.name", "harness", "react"),
    ("policy.backend", "policy backend", "builtin:tiny"),
    ("runtime.kind", "runtime", "auto | docker | kubernetes | local"),
    ("run.n_samples", "samples per task", "1"),
    ("run.concurrency", "concurrency", "4"),
    ("run.timeout_s", "timeout per rollout (s)", "600"),
    ("train.steps", "training steps", "0 = evaluate only"),
    ("train.trainer", "trainer", "local | sft"),
    ("train.tasks_per_step", "tasks per step", "all"),
    ("train.estimator", "advantage estimator", "grpo | rloo | reinforce_plus_plus"),
    ("train.lr", "learning rate", "1e-6"),
    ("train.lora_rank", "LoRA rank", "0 = full fine-tuning"),
    ("train.kl_coef", "KL coefficient", "0"),
    ("train.save_every", "checkpoint every N steps", "0 = at the end"),
    ("train.from_runs", "SFT: teacher runs", '["RUN_ID"]'),
)
KEYS = tuple(key for key, _, _ in FIELDS)
BASE = "base"  # the form's field for a config file to start from


def overrides(values: dict[str, str]) -> list[str]:
    """The form's non-empty fields as `--set` overrides."""
    return [f"{key}={raw.strip()}" for key, raw in values.items() if raw.strip()]


# a section-wide validator's problem that is about one field: the policy section parses `backend` as a whole
SECTION_FIELD = {"policy": "policy.backend"}


def field_of(loc: str) -> str:
    """The form field a config key's problem belongs under (BASE for keys the form does not show)."""
    return SECTION_FIELD.get(loc) or next((key for key in KEYS if loc == key or loc.startswith(key + ".")), BASE)


def _add(errors: dict[str, str], key: str, message: str) -> None:
    errors[key] = f"{errors[key]}; {message}" if key in errors else message


def load(base: str, values: dict[str, str]) -> tuple[RunConfig | None, dict[str, str]]:
    """The config as `forgetui run BASE --set ...` loads it, or the errors per form field ({} when it loaded)."""
    try:
        return load_config(base.strip() or None, overrides(values)), {}
    except InvalidConfigError as exc:
        errors: dict[str, str] = {}
        for loc, message in exc.problems:
            key = field_of(loc)
            message = message.removeprefix("Value error, ")  # pydantic's prefix on a validator's own words
            _add(errors, key, f"{loc}: {message}" if key == BASE else message)
        return None, errors
    except ConfigError as exc:  # the base file (missing, not TOML) or an override that is no key=value
        return None, {BASE: str(exc)}


def name_errors(config: RunConfig) -> dict[str, str]:
    """What a run of `config` would fail on as it starts: an env (or env option), harness or trainer that is not
    registered, a scripted backend's missing file, a config the trainer refuses (the backend spec itself was
    parsed when the config loaded)."""
    from core.session.setup import env_kwargs  # ~350 ms to import (the runtimes): only when a form is checked

    errors = adapter_errors("env", config.env.name, env_kwargs(config))
    errors |= adapter_errors("harness", config.harness.name, config.harness.adapter_options())
    spec = config.policy.spec
    if spec.declared.config_relative and not Path(spec.target).expanduser().is_file():
        errors["policy.backend"] = f"no file at {spec.target} (a relative path is relative to the base config)"
    try:
        trainer = trainer_for(config)
        if trainer.trains(config):
            trainer.check(config)
    except ConfigError as exc:
        errors["train.trainer"] = str(exc)
    return errors


def adapter_errors(kind: Literal["env", "harness"], name: str, options: dict[str, Any]) -> dict[str, str]:
    """The env's (or harness's) name and options as building it would check them, building nothing; a problem goes
    under the field that names the adapter (its options come from the base config: the form shows none)."""
    try:
        check_options(kind, name, options)
    except ConfigError as exc:  # no such adapter, an option it does not take, a bad value (naming the option)
        return {f"{kind}.name": str(exc)}
    return {}


def check(base: str, values: dict[str, str]) -> tuple[RunConfig | None, dict[str, str]]:
    """The config and {} when a run of it would start; else None and the errors per form field."""
    config, errors = load(base, values)
    if config is None:
        return None, errors
    errors = name_errors(config)
    return (None, errors) if errors else (config, {})


def save_config(config: RunConfig, folder: Path) -> Path:
    """Write the resolved config as TOML under `folder`, then check that file as `forgetui run FILE` will load it;
    ConfigError with what is wrong when it would not start."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"new-{dt.datetime.now():%Y%m%d-%H%M%S-%f}.toml"
    path.write_text(dump_toml(config))
    _, errors = check(str(path), {})
    if errors:
        raise ConfigError(f"the saved config {path} would not start: " + "; ".join(errors.values()))
    return path
