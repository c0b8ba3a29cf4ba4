"""The new-run form's model: which config keys it edits, and validation errors mapped back to them."""

from __future__ import annotations

import datetime as dt
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

# the form sets keys exactly as `--set key=value` does: core.config's own parsing, not a copy of it
from core.config import RunConfig, _parse_value, _set_path, dump_toml, load_config
from core.errors import ConfigError

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
BASE = "base"  # the form's field for a config file to start from


def form_data(base: str, values: dict[str, str]) -> dict[str, Any]:
    """The config dict: the base TOML (if any) with every non-empty field set (TOML scalars where they parse)."""
    data: dict[str, Any] = {}
    if base.strip():
        path = Path(base.strip()).expanduser()
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"no config file at {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    for key, raw in values.items():
        if raw.strip():
            _set_path(data, key, _parse_value(raw.strip()))
    return data


def field_errors(base: str, values: dict[str, str]) -> dict[str, str]:
    """Pydantic's complaints per form key (BASE for the file, or for keys the form does not show); {} when valid."""
    try:
        data = form_data(base, values)
    except ConfigError as exc:
        return {BASE: str(exc)}
    try:
        RunConfig.model_validate(data)
    except ValidationError as exc:
        out: dict[str, str] = {}
        shown = {key for key, _, _ in FIELDS}
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            key = next((k for k in shown if loc == k or loc.startswith(k + ".")), BASE)
            out[key] = (out.get(key, "") + "; " if key in out else "") + (f"{loc}: " if key == BASE else "") + err["msg"]
        return out
    return {}


def save_config(base: str, values: dict[str, str], folder: Path) -> Path:
    """Validate and write the resolved config as TOML under `folder`; ConfigError when it is not valid."""
    base_dir = Path(base.strip()).expanduser().parent if base.strip() else None
    tmp = folder / f"new-{dt.datetime.now():%Y%m%d-%H%M%S-%f}.toml"
    folder.mkdir(parents=True, exist_ok=True)
    overrides = [f"{k}={v.strip()}" for k, v in values.items() if v.strip()]
    config = load_config(base.strip() or None, overrides, base_dir=base_dir)  # the same checks as the CLI
    tmp.write_text(dump_toml(config))
    return tmp
