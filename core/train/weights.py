"""The trainer's model: load it, wrap it in LoRA, export merged weights, write and read HF folders."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigError, ModelError
from core.models import attention
from core.models.precision import resolve_dtype
from core.models.resolve import load_tokenizer, model_class, resolve_model

log = logging.getLogger(__name__)


def pick_device(device: str) -> str:
    """ "auto" → cuda when one is visible, else cpu."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_model(source: str | Path, dtype: Any = "float32") -> tuple[Any, Any]:
    """(model, tokenizer) from a built-in name ("tiny"), a local HF folder or a hub id; weights in `dtype` (the trainer keeps float32)."""
    folder = resolve_model(str(source))
    torch_dtype = resolve_dtype(dtype, "cpu")
    try:
        tokenizer = load_tokenizer(folder)
        model = model_class(folder).from_pretrained(folder, dtype=torch_dtype, attn_implementation=attention.register())
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"cannot load model {source!r} from {folder}: {exc}") from exc
    return model, tokenizer


def use_packed_attention(model: Any) -> bool:
    """Switch `model` to core.models.attention's attention (GQA without copies, packed samples); whether it took."""
    base = base_model(model)
    name = attention.register()
    if base.config._attn_implementation != name:
        try:
            base.set_attn_implementation(name)
        except (ValueError, ImportError) as exc:
            log.warning("cannot switch %s to packed attention (%s): one sample per forward", type(base).__name__, exc)
    return base.config._attn_implementation == name


def enable_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (less memory, ~30% more time)."""
    base_model(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def checkpointed_layers(model: Any) -> list[Any]:
    """The decoder layers that checkpoint; transformers runs them checkpointed only while their `training` flag is set."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in base_model(model).modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def is_peft(model: Any) -> bool:
    """Whether `model` is a peft wrapper."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (LoRA layers still inside), or the model itself."""
    return model.get_base_model() if is_peft(model) else model


def add_lora(model: Any, rank: int, alpha: float, target_modules: str | Sequence[str], dropout: float) -> Any:
    """Wrap `model` with a fresh LoRA adapter ("default"); only the adapter's weights train."""
    from peft import LoraConfig, get_peft_model

    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=targets,
        lora_dropout=dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        raise ConfigError(f"cannot add LoRA (rank {rank}, targets {targets!r}): {exc}") from exc


def merged_state_dict(model: Any) -> dict[str, Any]:
    """A full state dict of plain-model names on the CPU, LoRA deltas added in (the wrapper is left as it is)."""
    if not is_peft(model):
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, Any] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            active = [a for a in module.active_adapters if a in module.lora_A]
            if active:
                deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in active)
    state: dict[str, Any] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        clean = key.replace(".base_layer.", ".")
        tensor = value.detach()
        if clean in deltas:
            tensor = tensor + deltas.pop(clean).to(tensor.dtype)
        state[clean] = tensor.to("cpu", copy=True)
    if deltas:
        raise ModelError(f"LoRA deltas with no base weight to merge into: {sorted(deltas)[:5]}")
    return state


def save_hf_folder(model: Any, tokenizer: Any, path: Path, state: dict[str, Any]) -> None:
    """Write `state` (merged weights) as a transformers folder with the model's config and the tokenizer."""
    base_model(model).save_pretrained(path, state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    else:
        log.warning(
            "checkpoint %s has no tokenizer (the trainer was given a model without one): "
            "BuiltinBackend cannot load it until one is saved there",
            path,
        )


WEIGHTS_FILE = "model.safetensors"


def write_weights(state: dict[str, Any], path: Path) -> Path:
    """`state` as `path`/model.safetensors, written whole to a temporary file and then renamed in, so a reader never sees
    half a file; the file's path."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (WEIGHTS_FILE + ".tmp")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata={"format": "pt"})
    return tmp.replace(path / WEIGHTS_FILE)


def read_weights(path: Path) -> dict[str, Any]:
    """Every tensor of the *.safetensors files in a folder."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"no safetensors weights in {path}")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load_full_weights(model: Any, state: dict[str, Any]) -> None:
    """Copy a full state dict into a plain model; only tied weights may be missing."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ModelError(
            f"checkpoint weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
