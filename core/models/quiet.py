"""Keep third-party progress bars and chatter (transformers, huggingface_hub, tqdm) out of forgetui's output."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# read by huggingface_hub, transformers and tqdm when they are imported (and by any child process)
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TQDM_DISABLE": "1",
}


def silence_third_party() -> None:
    """Turn off transformers', huggingface_hub's and tqdm's progress bars and warnings for this process."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # huggingface_hub's too
    _set_gguf_bar(_silent_tqdm())


@contextmanager
def quiet_third_party() -> Iterator[None]:
    """The same as `silence_third_party` for one block (a model build); the previous settings come back after."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    gguf_bar = getattr(_gguf_module(), "tqdm", None)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    _set_gguf_bar(_silent_tqdm())
    try:
        yield
    finally:
        _set_gguf_bar(gguf_bar)
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _gguf_module() -> Any:
    """transformers' GGUF loader, which draws its bar with plain tqdm (no transformers switch reaches it), or None."""
    try:
        from transformers import modeling_gguf_pytorch_utils
    except ImportError:
        return None
    return modeling_gguf_pytorch_utils


def _set_gguf_bar(bar: Any) -> None:
    """Make the GGUF loader draw with `bar` (a tqdm-like callable)."""
    module = _gguf_module()
    if module is not None and bar is not None and hasattr(module, "tqdm"):
        module.tqdm = bar


def _silent_tqdm() -> Any:
    """A tqdm that draws nothing."""
    from tqdm.auto import tqdm

    return functools.partial(tqdm, disable=True)
