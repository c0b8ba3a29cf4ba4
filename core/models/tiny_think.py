"""A tiny random Qwen2 that thinks first (`tiny-think`): the tiny model's tokenizer with ``<think>`` and
``</think>`` as single tokens and a Qwen3-style template that drops earlier turns' reasoning.

What it samples is noise (the weights are a seeded random init, like `tiny`'s); what it checks is the
reasoning path: the proxy splits sampled ``<think>…</think>`` off as reasoning, returns it in each
protocol's own form, and splices later calls onto the sampled ids although their history comes back
without it (the template renders reasoning only after the last user query, as Qwen3's does).
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

from core import paths
from core.models.loading import load_tokenizer
from core.models.quiet import quiet_third_party
from core.models.tiny import build_model, build_once, ensure_tiny_model

log = logging.getLogger(__name__)

TINY_THINK_NAME = "tiny-think-v1"
THINK_TOKENS = ["<think>", "</think>"]
_DONE_MARKER = "forgetui-tiny-think.done"


def think_chat_template() -> str:
    """The Qwen3-style template (ChatML, hermes tools, thinking) shipped with `tiny-think`."""
    return resources.files("core.models").joinpath("qwen3_think.jinja").read_text(encoding="utf-8")


def build_tiny_think_model(dest: Path) -> None:
    """Build the tokenizer (tiny's, plus the think tokens and the thinking template) and the model into `dest`."""
    from tokenizers import AddedToken

    dest.mkdir(parents=True, exist_ok=True)
    with quiet_third_party():
        tokenizer = load_tokenizer(ensure_tiny_model())
        # not "special": they survive skip_special_tokens, as Qwen3's do
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
        tokenizer.chat_template = think_chat_template()
        model = build_model(tokenizer)
        tokenizer.save_pretrained(dest)
        model.save_pretrained(dest, safe_serialization=True)
    (dest / _DONE_MARKER).write_text(TINY_THINK_NAME + "\n")


def ensure_tiny_think_model(root: Path | None = None) -> Path:
    """The tiny-think model's folder under FORGETUI_HOME/models (or `root`), built on first use (atomic)."""
    base = Path(root) if root is not None else paths.models_dir()
    final = base / TINY_THINK_NAME

    def build(dest: Path) -> None:
        log.info("building the tiny thinking model into %s", final)
        build_tiny_think_model(dest)

    return build_once(final, _DONE_MARKER, build, f"cannot build the tiny-think model in {base}")
