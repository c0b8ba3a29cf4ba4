"""A tiny random Qwen2.5-VL model (`tiny-vl`), built locally: the token path for screenshots, end to end on a CPU.

The tiny model's tokenizer gains Qwen2-VL's vision tokens and a chat template that renders an
image part as ``<|vision_start|><|image_pad|><|vision_end|>``; the weights are a seeded random
`Qwen2_5_VLForConditionalGeneration` (a one-block vision tower, ~0.4M parameters in all) and the
image processor is transformers' own Qwen2-VL one, saved beside them. What it answers is noise;
what it checks is real: the recorded prompt ids hold every image's placeholder run exactly as the
model consumed it, and the trainer rebuilds the pixel inputs from the stored blobs.
"""

from __future__ import annotations

import logging
from pathlib import Path

from core import paths
from core.models.loading import load_tokenizer
from core.models.quiet import quiet_third_party
from core.models.tiny import MAX_POSITIONS, SEED, build_once, chat_template, ensure_tiny_model

log = logging.getLogger(__name__)

TINY_VL_NAME = "tiny-vl-v1"
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
# small screenshots: at most 224×224 pixels reach the vision tower (≤ 64 image tokens per image)
MIN_PIXELS, MAX_PIXELS = 56 * 56, 224 * 224
_DONE_MARKER = "forgetui-tiny-vl.done"
_TEXT_PART = "{%- elif part.text is defined -%}{{- part.text -}}"
_IMAGE_PART = "{%- elif part.type is defined and part.type == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"


def vl_chat_template() -> str:
    """The tiny model's ChatML template, with image parts rendered as Qwen2-VL's vision placeholder."""
    template = chat_template()
    if _TEXT_PART not in template:  # the shipped template changed shape: fail the build, not the render
        raise RuntimeError("chatml.jinja no longer has the text-part branch the vision template extends")
    return template.replace(_TEXT_PART, _IMAGE_PART + _TEXT_PART, 1)


def build_tiny_vl_model(dest: Path) -> None:
    """Build the tokenizer, the image processor and the model into `dest`."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil


    dest.mkdir(parents=True, exist_ok=True)
    with quiet_third_party():
        tokenizer = load_tokenizer(ensure_tiny_model())
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", *VISION_TOKENS]})
        tokenizer.chat_template = vl_chat_template()
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
        eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
        text = {
            "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": MAX_POSITIONS,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}, "tie_word_embeddings": True,
            "bos_token_id": None, "eos_token_id": eos, "pad_token_id": pad, "use_sliding_window": False,
        }  # fmt: skip
        vision = {
            "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
            "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56, "fullatt_block_indexes": [0],
        }  # fmt: skip
        config = Qwen2_5_VLConfig(
            text_config=text, vision_config=vision, tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos, pad_token_id=pad,
            image_token_id=ids["<|image_pad|>"], vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        )  # fmt: skip
        torch.manual_seed(SEED)
        model = Qwen2_5_VLForConditionalGeneration(config).eval()
        model.generation_config.eos_token_id, model.generation_config.pad_token_id = eos, pad
        processor = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=14, merge_size=2, temporal_patch_size=2)
        tokenizer.save_pretrained(dest)
        processor.save_pretrained(dest)
        model.save_pretrained(dest, safe_serialization=True)
    (dest / _DONE_MARKER).write_text(TINY_VL_NAME + "\n")


def ensure_tiny_vl_model(root: Path | None = None) -> Path:
    """The tiny-vl model's folder under FORGETUI_HOME/models (or `root`), built on first use (atomic)."""
    base = Path(root) if root is not None else paths.models_dir()
    final = base / TINY_VL_NAME

    def build(dest: Path) -> None:
        log.info("building the tiny vision-language model into %s", final)
        build_tiny_vl_model(dest)

    return build_once(final, _DONE_MARKER, build, f"cannot build the tiny-vl model in {base}")
