"""Find a wire protocol by its api name."""

from __future__ import annotations

from core.protocols import anthropic_messages, gemini, openai_chat, openai_responses
from core.protocols.base import WireProtocol

_PROTOCOLS: dict[str, WireProtocol] = {
    "chat": openai_chat.protocol,
    "responses": openai_responses.protocol,
    "messages": anthropic_messages.protocol,
    "gemini": gemini.protocol,
}


def get_protocol(api: str) -> WireProtocol:
    """The protocol singleton for `api` (chat | responses | messages | gemini)."""
    try:
        return _PROTOCOLS[api]
    except KeyError:
        raise ValueError(f"unknown wire protocol {api!r}; expected one of {sorted(_PROTOCOLS)}") from None
