"""One dtype for the built-in sampler and the trainer: policy.dtype, the spec's `dtype=` and train.dtype
reconciled when the config loads; a bad dtype fails there, naming itself; `serve-model --dtype`."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest

from core.config import load_config
from core.errors import ConfigError


def test_a_bad_dtype_in_the_spec_fails_when_the_config_loads_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"unknown dtype 'bf16' in the backend spec; use one of auto, float32, bfloat16, float16"):
        load_config(None, ['policy.backend="builtin:tiny?dtype=bf16"'])
    with pytest.raises(ConfigError, match="policy.dtype"):  # the config key is checked too
        load_config(None, ["policy.dtype=bf16"])


@pytest.mark.parametrize(
    "overrides",
    [["policy.dtype=bfloat16"], ['policy.backend="builtin:tiny?dtype=bfloat16"']],
    ids=["policy.dtype", "spec"],
)
def test_the_sampler_dtype_holds_for_an_auto_trainer(overrides: list[str]) -> None:
    import torch

    from core.train.local import LocalTrainer, trainer_settings

    config = load_config(None, overrides)
    assert config.train.dtype == "bfloat16" and config.policy.spec.options["dtype"] == "bfloat16"
    trainer = LocalTrainer("tiny", device="cpu", **trainer_settings(config.train))
    assert trainer.compute_dtype == torch.bfloat16


def test_the_trainer_dtype_holds_for_an_auto_sampler() -> None:
    import torch

    from core.backends.spec import build_token_backend

    config = load_config(None, ["train.dtype=bfloat16", 'policy.backend="builtin:tiny?device=cpu&prefix_cache_mb=0"'])
    assert config.policy.dtype == "bfloat16" and config.policy.spec.options["dtype"] == "bfloat16"
    backend = build_token_backend(config.policy.spec)
    try:
        assert backend.model.dtype == torch.bfloat16
    finally:
        asyncio.run(backend.aclose())


def test_both_auto_stay_auto_and_other_backends_are_left_alone() -> None:
    config = load_config(None, [])
    assert config.train.dtype == "auto" and "dtype" not in config.policy.spec.options
    served = load_config(None, ["train.dtype=bfloat16", 'policy.backend="vllm:http://127.0.0.1:9/v1?tokenizer=tiny"'])
    assert served.policy.dtype == "auto" and "dtype" not in served.policy.spec.options  # a vLLM server picks its own


@pytest.mark.parametrize(
    "overrides",
    [["policy.dtype=float32", "train.dtype=bfloat16"], ['policy.backend="builtin:tiny?dtype=bfloat16"', "train.dtype=float32"]],
    ids=["policy.dtype", "spec"],
)
def test_two_different_dtypes_are_kept_with_a_warning(overrides: list[str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="core.config"):
        config = load_config(None, overrides)
    sampler, trainer = config.policy.spec.options["dtype"], config.train.dtype
    assert sampler != trainer
    warned = [r.getMessage() for r in caplog.records if r.name == "core.config"]
    assert len(warned) == 1 and f"sampler computes in {sampler} and the trainer in {trainer}" in warned[0]


def test_the_specs_own_dtype_wins_over_policy_dtype_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="core.config"):
        config = load_config(None, ['policy.backend="builtin:tiny?dtype=float32"', "policy.dtype=bfloat16"])
    assert config.policy.spec.options["dtype"] == "float32" == config.train.dtype
    assert any("policy.dtype = bfloat16 is overridden by the backend spec's dtype=float32" in r.getMessage() for r in caplog.records)


def test_serve_model_takes_a_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    import core.proxy.model_server as model_server
    from forgetui.cli import build_parser

    seen: dict = {}

    async def serve(model: str, host: str, port: int, *, dtype: str, on_ready) -> None:  # stands in for the server loop
        seen.update(model=model, dtype=dtype)

    monkeypatch.setattr(model_server, "serve_model", serve)
    args = build_parser().parse_args(["serve-model", "tiny", "--dtype", "bfloat16"])
    assert args.func(args) == 0 and seen == {"model": "tiny", "dtype": "bfloat16"}
    assert build_parser().parse_args(["serve-model", "tiny"]).dtype == "auto"
    out = subprocess.run([sys.executable, "-m", "forgetui.cli", "serve-model", "tiny", "--dtype", "bf16"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "invalid choice: 'bf16'" in out.stderr
