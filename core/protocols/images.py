"""Image inputs of every wire protocol: found in the request body, checked, and replaced by content-hash references.

The four shapes: OpenAI chat ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``,
Responses ``{"type": "input_image", "image_url": "data:..."}``, Anthropic ``{"type": "image", "source":
{"type": "base64", "media_type", "data"}}`` (also inside `tool_result` content), Gemini
``{"inline_data": {"mime_type", "data"}}`` (or ``inlineData``/``mimeType``). Each image is decoded,
its bytes checked against its declared type and size, and named by its sha256; the body that is
recorded carries ``"forgetui_blob": "sha256:<hex>"`` in place of the bytes, so a screenshot a
harness sends again in every later call's history is stored once (`blobs`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterator
from typing import Any

from core.chat import ImagePart
from core.errors import ProtocolError

MAX_IMAGE_BYTES = 10 * 1024 * 1024  # decoded; providers cap a single image at 5-20 MB
MAGIC = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}
BLOB_KEY = "forgetui_blob"


class ImageTooLarge(ProtocolError):
    kind = "too_large"


Image = ImagePart  # a decoded, checked image input (its bytes always set)


def decode(media_type: str, data: Any, where: str) -> Image:
    """Check and decode one base64 image; ProtocolError (400) saying what is wrong otherwise."""
    media_type = str(media_type or "").lower()
    if media_type not in MAGIC:
        raise ProtocolError(f"{where}: unsupported image media type {media_type!r}; send one of {', '.join(MAGIC)}")
    if not isinstance(data, str) or not data:
        raise ProtocolError(f"{where}: the image data must be a non-empty base64 string")
    if len(data) * 3 // 4 > MAX_IMAGE_BYTES + 3:
        raise ImageTooLarge(f"{where}: the image is over {MAX_IMAGE_BYTES >> 20} MiB (about {len(data) * 3 // 4 >> 20} MiB decoded)")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(f"{where}: the image data is not valid base64 ({exc})") from None
    if len(raw) > MAX_IMAGE_BYTES:
        raise ImageTooLarge(f"{where}: the image is {len(raw)} bytes, over the {MAX_IMAGE_BYTES >> 20} MiB limit")
    if not raw.startswith(MAGIC[media_type]) or (media_type == "image/webp" and raw[8:12] != b"WEBP"):
        raise ProtocolError(f"{where}: the image bytes are not a {media_type} image (declared type and content disagree)")
    return Image(hashlib.sha256(raw).hexdigest(), media_type, raw)


def data_url(url: Any, where: str) -> Image:
    """A `data:<type>;base64,<data>` URL as an Image; other URLs are refused (the proxy fetches nothing)."""
    if not isinstance(url, str):
        raise ProtocolError(f"{where}: the image URL must be a string")
    if not url.startswith("data:"):
        raise ProtocolError(f"{where}: only data: URLs are accepted for images (the proxy fetches nothing); got {url[:60]!r}")
    head, sep, payload = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        raise ProtocolError(f"{where}: an image data URL must be data:<media type>;base64,<data>")
    return decode(head[: -len(";base64")], payload, where)


def _walk(node: Any, where: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Every object in `node` with the path it was found at, in document order.

    Iterative: a request may nest as deep as the JSON parser allows (~1000 levels), past Python's recursion limit.
    """
    stack: list[tuple[Any, str]] = [(node, where)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            yield node, where
            stack.extend((value, f"{where}.{key}") for key, value in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((value, f"{where}[{i}]") for i, value in reversed(list(enumerate(node))))


def _recorded(node: Any) -> ImagePart | None:
    """The image a recorded part names by its blob reference (bytes in `blobs`), or None."""
    ref = node.get(BLOB_KEY) if isinstance(node, dict) else None
    if not isinstance(ref, str) or not ref.startswith("sha256:"):
        return None
    media_type = node.get("media_type") or node.get("mime_type") or node.get("mimeType") or ""
    return ImagePart(ref[len("sha256:") :], str(media_type))


def part_image(part: dict[str, Any], api: str, where: str) -> ImagePart | None:
    """The image a content part carries (decoded and checked; or the blob a recorded part names), or None.

    Leaves `part` as it is: parsing a request for the backend reads its images with this, and
    `extract_images` swaps their bytes for references in the copy that is recorded.
    """
    kind = part.get("type")
    if api == "chat" and kind == "image_url":
        inner = part.get("image_url")
        recorded = _recorded(inner)
        if recorded is not None:
            return recorded
        return data_url(inner.get("url") if isinstance(inner, dict) else inner, f"{where}.image_url")
    if api == "responses" and kind == "input_image":
        recorded = _recorded(part)
        if recorded is not None:
            return recorded
        if part.get("file_id") and not part.get("image_url"):
            raise ProtocolError(f"{where}: images by file_id are not supported; send the image as a data: URL")
        return data_url(part.get("image_url"), f"{where}.image_url")
    if api == "messages" and kind == "image":
        source = part.get("source")
        recorded = _recorded(source)
        if recorded is not None:
            return recorded
        if not isinstance(source, dict) or source.get("type") != "base64":
            raise ProtocolError(f"{where}.source: only base64 image sources are accepted (the proxy fetches nothing)")
        return decode(source.get("media_type"), source.get("data"), f"{where}.source")
    if api == "gemini":
        key = "inline_data" if "inline_data" in part else "inlineData" if "inlineData" in part else None
        inline = part.get(key) if key else None
        if isinstance(inline, dict):
            recorded = _recorded(inline)
            if recorded is not None:
                return recorded
            mime = inline.get("mime_type", inline.get("mimeType"))
            if str(mime or "").startswith("image/"):
                return decode(mime, inline.get("data"), f"{where}.{key}")
    return None


def _take(part: dict[str, Any], api: str, where: str) -> Image | None:
    """The image a content part carries, its bytes in `part` replaced by a reference; None for other parts."""
    image = part_image(part, api, where)
    if image is None or image.data is None:
        return None  # not an image, or already a reference
    kind = part.get("type")
    if api == "chat":
        inner = part.get("image_url")
        part["image_url"] = {**inner, "url": None, BLOB_KEY: image.ref} if isinstance(inner, dict) else {BLOB_KEY: image.ref}
    elif api == "responses":
        part["image_url"] = None
        part[BLOB_KEY] = image.ref
    elif api == "messages" and kind == "image":
        part["source"] = {"type": "base64", "media_type": image.media_type, "data": None, BLOB_KEY: image.ref}
    else:
        key = "inline_data" if "inline_data" in part else "inlineData"
        part[key] = {**{k: v for k, v in part[key].items() if k != "data"}, "data": None, BLOB_KEY: image.ref}
    return image


def extract_images(api: str, body: Any) -> list[Image]:
    """Every image input of a parsed request body, in order, checked; their bytes in `body` replaced by references.

    `body` is modified in place (parse a fresh copy: what the backend needs was already parsed from it).
    """
    images: list[Image] = []
    for part, where in list(_walk(body, "body")):
        image = _take(part, api, where)
        if image is not None:
            images.append(image)
    return images


__all__ = ["BLOB_KEY", "MAX_IMAGE_BYTES", "Image", "ImageTooLarge", "data_url", "decode", "extract_images", "part_image"]
