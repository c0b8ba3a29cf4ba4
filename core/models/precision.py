"""The number format a model computes in: "auto" (per device), "float32", "bfloat16" or "float16".

"auto" is bfloat16 on a CUDA GPU that supports it (float16 on one that does not) and float32 on a
CPU. On a CPU, float32 is the default even where bfloat16 is fast (AVX-512 BF16 / AMX: about 2×
for SmolLM2-135M) because it keeps the sampler's and the trainer's logprobs equal to ~1e-6; ask
for "bfloat16" there to trade that for speed (the trainer then corrects the mismatch by truncated
importance sampling). On a CPU without native bfloat16 (AVX2 only) bfloat16 is several times
*slower* than float32: `native_bf16` says which kind this CPU is.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from core.errors import ConfigError

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_dtype(dtype: Any, device: str) -> Any:
    """A torch dtype from a name in DTYPES (None = "auto") or a torch dtype, for a model on `device`."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = "auto" if dtype is None else str(dtype)
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if name != "auto":
        if name == "bfloat16" and device == "cpu" and not native_bf16():
            log.warning("bfloat16 on a CPU without native bfloat16 (no AVX-512 BF16 / AMX): expect it to be slower than float32")
        return getattr(torch, name)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX), as oneDNN reports it."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def fastest_dtype() -> str:
    """"bfloat16" where this machine multiplies it natively (a CUDA GPU that supports it, else a CPU with AVX-512 BF16
    or AMX), else "float32": what a schedule meant to run anywhere asks for when speed matters more than exact logprobs."""
    import torch

    if torch.cuda.is_available():
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if native_bf16() else "float32"


def dtype_name(dtype: Any) -> str:
    """"bfloat16" for torch.bfloat16 and so on."""
    return str(dtype).removeprefix("torch.")
