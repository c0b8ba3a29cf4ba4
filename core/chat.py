"""The canonical, protocol-neutral form of a model call.

Every wire protocol (chat, responses, messages, gemini) is parsed into a
`ChatRequest` (OpenAI chat messages + function tools) and every answer is a
`Completion`; streaming answers are a sequence of `StreamEvent`s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

Api = Literal["chat", "responses", "messages", "gemini"]
FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass
class ToolCall:
    """A function call: `arguments` is the JSON text of the arguments object."""

    id: str
    name: str
    arguments: str


# ----------------------------------------------------------------------------- how deep JSON may nest
# The one nesting limit for what the proxy parses, compares and writes back as JSON: tool-call arguments
# (in a history or sampled), tool schemas, tool choices. orjson writes at most 254 levels and an answer
# wraps arguments in up to 6 more (Gemini's candidates[0].content.parts[i].functionCall.args), so 200
# leaves room; Python's own json recursion fails near 1,000. Request bodies themselves are stored as
# sent, however deep they nest: only the fields the proxy acts on are held to this.
MAX_JSON_DEPTH = 200
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


def nests_too_deep(text: str) -> bool:
    """Whether the JSON in `text` nests past `MAX_JSON_DEPTH` (without a scan when it has too few brackets to)."""
    return text.count("[") + text.count("{") > MAX_JSON_DEPTH and text_depth(text) > MAX_JSON_DEPTH


def json_depth(value: Any) -> int:
    """How many objects and lists deep `value` nests (a scalar: 0); iterative, so any depth is measured."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in node if isinstance(child, dict | list))
    return deepest


def text_depth(text: str) -> int:
    """How deep the JSON in `text` nests, read from its brackets outside strings (no parse, so no recursion)."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


IMAGE_PLACEHOLDER = "[image]"  # an image in `content`, the text-only form of a message


@dataclass(frozen=True)
class ImagePart:
    """An image input of a message: named by the sha256 of its bytes (the `blobs` row that holds them)."""

    sha256: str
    media_type: str
    data: bytes | None = None  # None when parsed back from a record (the body holds a blob reference)

    @property
    def ref(self) -> str:
        return f"sha256:{self.sha256}"


Piece = str | ImagePart


def content_fields(pieces: list[Piece]) -> dict[str, Any]:
    """A canonical message's ``content`` from its pieces (text joined by newlines), and ``parts`` when one is an image."""
    content = "\n".join(p if isinstance(p, str) else IMAGE_PLACEHOLDER for p in pieces)
    if any(isinstance(p, ImagePart) for p in pieces):
        return {"content": content, "parts": list(pieces)}
    return {"content": content}


def message_images(message: dict[str, Any]) -> list[ImagePart]:
    """The images of one canonical message, in order."""
    return [p for p in message.get("parts") or () if isinstance(p, ImagePart)]


def request_images(messages: list[dict[str, Any]]) -> list[ImagePart]:
    """Every image of a canonical conversation, in order."""
    return [image for message in messages for image in message_images(message)]


def image_refs(message: dict[str, Any]) -> tuple[str, ...]:
    """The blob references of a message's images, from its canonical form (`parts`) or its exported one (`images`)."""
    if "parts" in message:
        return tuple(image.ref for image in message_images(message))
    return tuple(message.get("images") or ())


def exported_message(message: dict[str, Any]) -> dict[str, Any]:
    """A canonical message as JSON holds it: its images as ``"images": ["sha256:<hex>", ...]`` (rows of `blobs`)."""
    if "parts" not in message:
        return message
    out = {k: v for k, v in message.items() if k != "parts"}
    out["images"] = list(image_refs(message))
    return out


@dataclass
class ChatRequest:
    """A request in canonical form.

    `messages` use OpenAI chat format: ``{"role": "system"|"user"|"assistant"|"tool",
    "content": str | None, "tool_calls": [{"id","type":"function","function":{"name","arguments"}}],
    "tool_call_id": str}``; content is always a plain string (text parts joined, an image as
    ``[image]``). A message that carries images also has ``"parts"``: its pieces in order, each a
    string or an `ImagePart`, for backends that take images (`content` is their texts joined).
    `tools` are OpenAI function tools ``{"type":"function","function":{name,description,parameters}}``.
    """

    api: Api
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    tool_choice: Any = None
    include_usage: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Completion:
    """One answer; token fields are set by token backends (and by passthrough when the server returns them)."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    reasoning: str = ""  # a thinking model's reasoning, split off the sampled text (its tokens stay in completion_token_ids)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    tool_parse_error: str | None = None
    # the limit forgetui imposed itself (not asked for by the client) cut the answer
    truncated_by_proxy: bool = False


@dataclass
class TextDelta:
    """A piece of visible answer text, streamed as it is sampled."""

    text: str


@dataclass
class ReasoningDelta:
    """A piece of the answer's reasoning, streamed as it is sampled (before any answer text)."""

    text: str


@dataclass
class Finished:
    """The end of a stream: the whole completion (tool calls are rendered from it)."""

    completion: Completion


StreamEvent = TextDelta | ReasoningDelta | Finished
