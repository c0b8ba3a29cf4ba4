"""Images on the token path, Qwen2-VL style: each image is a run of ``<|image_pad|>`` tokens the model fills in.

The chat template writes one ``<|vision_start|><|image_pad|><|vision_end|>`` per image part; the
image processor (transformers' own, from the model folder) resizes the image and cuts it into
patches, and the placeholder is repeated once per merged patch (``t·h·w / merge²``), as
`Qwen2_5_VLProcessor` does. The recorded prompt ids therefore hold exactly the tokens the model
consumed, and the pixel inputs are rebuilt from the images alone (`pixel_inputs`): the proxy to
generate, the trainer from the store's blobs.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.chat import ImagePart
from core.errors import ModelError

log = logging.getLogger(__name__)

VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
_IMAGE_PROCESSORS = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil")


@dataclass
class VisionPrompt:
    """A vision-language tokenizer's image placeholders and the image processor that sizes them."""

    processor: Any
    pad_id: int
    merge_size: int
    placeholder_ids: tuple[int, ...] = ()  # the image markers (start, pad, end): a prompt's, never a completion's
    _grids: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def grid(self, image: ImagePart) -> tuple[int, int, int]:
        """The image's patch grid (temporal, height, width) after the processor's resize."""
        with self._lock:
            known = self._grids.get(image.sha256)
        if known is None:
            known = tuple(int(x) for x in self._process([image])["image_grid_thw"][0])  # type: ignore[assignment]
            with self._lock:
                self._grids[image.sha256] = known  # type: ignore[assignment]
        return known  # type: ignore[return-value]

    def pad_count(self, image: ImagePart) -> int:
        """How many ``<|image_pad|>`` tokens stand for `image` in the prompt."""
        t, h, w = self.grid(image)
        return t * h * w // (self.merge_size**2)

    def expand(self, text: str, images: list[ImagePart]) -> str:
        """`text` (as the template rendered it) with the k-th image's placeholder repeated for the k-th image."""
        pieces = text.split(IMAGE_PAD)
        if len(pieces) - 1 != len(images):
            raise ModelError(
                f"the chat template wrote {len(pieces) - 1} image placeholder(s) for {len(images)} image(s); "
                "a vision model's template must render every image part once"
            )
        out = [pieces[0]]
        for image, rest in zip(images, pieces[1:], strict=True):
            out.append(IMAGE_PAD * self.pad_count(image))
            out.append(rest)
        return "".join(out)

    def pixel_inputs(self, images: list[ImagePart]) -> dict[str, Any]:
        """``pixel_values`` and ``image_grid_thw`` for `images`, as the model's forward takes them."""
        if any(image.data is None for image in images):
            raise ModelError("an image has no bytes here: load recorded images from the store's blobs first")
        out = self._process(images)
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def _process(self, images: list[ImagePart]) -> Any:
        from PIL import Image, UnidentifiedImageError

        try:
            pil = [Image.open(io.BytesIO(image.data or b"")).convert("RGB") for image in images]
        except (UnidentifiedImageError, OSError) as exc:
            raise ModelError(f"an image could not be decoded for the vision model: {exc}") from exc
        return self.processor(images=pil, return_tensors="pt")


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with images as HF multimodal content lists (``{"type": "text"}`` / ``{"type": "image"}`` parts)."""
    out = []
    for message in messages:
        if "parts" not in message:
            out.append(message)
            continue
        content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in message["parts"]]
        out.append({**{k: v for k, v in message.items() if k != "parts"}, "content": content})
    return out


_cache: dict[int, VisionPrompt | None] = {}
_cache_lock = threading.Lock()


def vision_prompt(tokenizer: Any) -> VisionPrompt | None:
    """The tokenizer's `VisionPrompt` when its model folder holds a Qwen2-VL image processor and its vocabulary the placeholders; else None."""
    key = id(tokenizer)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    found = _load(tokenizer)
    with _cache_lock:
        _cache[key] = found
    return found


def _load(tokenizer: Any) -> VisionPrompt | None:
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    config = folder / "preprocessor_config.json"
    if not config.is_file():
        return None
    vocab = tokenizer.get_vocab()
    if not all(t in vocab for t in (VISION_START, VISION_END, IMAGE_PAD)):
        return None
    try:
        kind = json.loads(config.read_text()).get("image_processor_type", "")
    except (OSError, ValueError):
        return None
    if kind not in _IMAGE_PROCESSORS:
        log.info("%s: image processor %r is not Qwen2-VL's; images stay text placeholders", folder, kind)
        return None
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    # the PIL implementation: the same resize and patching, without torchvision (not installed here)
    processor = Qwen2VLImageProcessorPil.from_pretrained(str(folder))
    markers = tuple(vocab[t] for t in (VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD) if t in vocab)
    return VisionPrompt(processor, vocab[IMAGE_PAD], int(processor.merge_size), markers)



def forward_inputs(model: Any, vision: VisionPrompt, input_ids: Any, images: list[ImagePart], attention_mask: Any = None) -> dict[str, Any]:
    """What a Qwen2-VL model's forward takes beside the token ids: pixel values, grids and 3D rotary positions.

    `input_ids` is a (batch, length) tensor whose image-token runs belong to `images` in order
    (left or right padding masked by `attention_mask`); the positions come from the model's own
    `get_rope_index`, so a forward here places each image exactly where generation did.
    """
    pixels = vision.pixel_inputs(images)
    grid = pixels["image_grid_thw"]
    kinds = (input_ids == vision.pad_id).int()
    positions, deltas = model.model.get_rope_index(input_ids.cpu(), mm_token_type_ids=kinds.cpu(), image_grid_thw=grid, attention_mask=None if attention_mask is None else attention_mask.cpu())
    device = input_ids.device
    return {
        "pixel_values": pixels["pixel_values"].to(device, model.dtype),
        "image_grid_thw": grid.to(device),
        "position_ids": positions.to(device),
        "rope_deltas": deltas.view(-1).tolist(),
    }
