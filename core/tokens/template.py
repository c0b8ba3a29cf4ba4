"""Render canonical chat messages with the policy's own chat template."""

from __future__ import annotations

import copy
import json
from typing import Any

from core.errors import ModelError


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat templates (Qwen, hermes) expect tool-call arguments as objects, not JSON text."""
    out = []
    for msg in messages:
        if msg.get("tool_calls"):
            msg = copy.copy(msg)
            calls = []
            for call in msg["tool_calls"]:
                fn = dict(call.get("function", {}))
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError:
                        pass
                calls.append({**call, "function": fn})
            msg["tool_calls"] = calls
        if msg.get("content") is None:
            msg = {**msg, "content": ""}
        out.append(msg)
    return out


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> str:
    """The prompt text for `messages` (and `tools`) as the model was trained to see it."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError("the policy's tokenizer has no chat template; use a chat/instruct model")
    return tokenizer.apply_chat_template(
        _template_messages(messages),
        tools=tools or None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of already-templated text (special tokens in the text are kept as such)."""
    return list(tokenizer.encode(text, add_special_tokens=False))
