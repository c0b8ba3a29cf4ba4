"""Loading a model folder's tokenizer and choosing its transformers class (no model building here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The tokenizer classes AutoTokenizer maps to `PreTrainedTokenizerFast` itself (the built-in models
# name the first). For them that class is imported directly: AutoTokenizer's module imports the model
# configuration code, which imports torch (about 1.5 s of a run's start-up, for a tokenizer).
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(source: Path | str) -> Any:
    """What ``AutoTokenizer.from_pretrained(source)`` returns, without importing torch when it can."""
    config = Path(source) / "tokenizer_config.json"
    try:
        declared = json.loads(config.read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        declared = None
    if declared in GENERIC_TOKENIZER_CLASSES and (Path(source) / "tokenizer.json").exists():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(source)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


def model_class(source: Path | str) -> Any:
    """The transformers auto class for a model folder: image-text-to-text when its config has a vision part, else causal LM."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(source)
    return AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
