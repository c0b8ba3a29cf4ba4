"""Turn a model name from a config or the CLI into something `from_pretrained` can load."""

from __future__ import annotations

import os
from pathlib import Path

from core.errors import ModelError
from core.models.loading import load_tokenizer, model_class
from core.models.smollm import SMOLLM2_NAME, ensure_smollm2
from core.models.tiny import ensure_tiny_model
from core.models.tiny_think import ensure_tiny_think_model
from core.models.tiny_vl import ensure_tiny_vl_model

BUILTIN_MODELS = {
    "tiny": ensure_tiny_model,
    "tiny-think": ensure_tiny_think_model,
    "tiny-vl": ensure_tiny_vl_model,
    SMOLLM2_NAME: ensure_smollm2,
}
# what a built-in model declares about itself: the random test models answer noise, so a short default
# completion cap keeps their runs fast (a harness's own max_tokens and the spec's still win)
BUILTIN_DEFAULT_MAX_TOKENS = {"tiny": 64, "tiny-think": 64, "tiny-vl": 64}


def declared_max_tokens(name: str) -> int | None:
    """The default completion cap built-in model `name` declares, or None (a folder, a hub id, SmolLM2)."""
    return BUILTIN_DEFAULT_MAX_TOKENS.get(name)


def _offline() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def resolve_model(name: str) -> Path | str:
    """ "tiny" / "tiny-think" / "smollm2-135m" → a local folder built on first use; a local folder → itself;
    anything else → the hub id unchanged (loading it needs network and no HF_HUB_OFFLINE)."""
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name]()
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists() and not (path / "tokenizer_config.json").exists():
            raise ModelError(
                f"{path} is a folder but not a transformers model (no config.json or tokenizer_config.json)"
            )
        return path
    if path.exists():
        raise ModelError(f"{path} is a file; give the folder that holds config.json and the weights")
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_local:
        raise ModelError(f"model folder {name} does not exist; built-in models: {', '.join(BUILTIN_MODELS)}")
    if _offline():
        raise ModelError(
            f"model {name!r} is not built in and not a local folder, and HF_HUB_OFFLINE is set so it cannot be "
            f"downloaded; use one of {', '.join(BUILTIN_MODELS)} or a local folder"
        )
    return name


__all__ = ["BUILTIN_DEFAULT_MAX_TOKENS", "BUILTIN_MODELS", "declared_max_tokens", "load_tokenizer", "model_class", "resolve_model"]
