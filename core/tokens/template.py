"""Render canonical chat messages with the policy's own chat template."""

from __future__ import annotations

import copy
import json
from typing import Any

from core.chat import request_images
from core.errors import ModelError
from core.tokens.offload import encode_in_child
from core.tokens.vision import template_messages, vision_prompt


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


HERMES_TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)
_renders_tools: dict[int, bool] = {}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template shows the tools to the model at all (SmolLM2's, for one, drops them)."""
    key = id(tokenizer)
    if key not in _renders_tools:
        probe = [{"role": "user", "content": "x"}]
        tool = {"type": "function", "function": {"name": "forgetui_probe_tool", "description": "", "parameters": {"type": "object", "properties": {}}}}
        text = tokenizer.apply_chat_template(probe, tools=[tool], tokenize=False, add_generation_prompt=True)
        _renders_tools[key] = "forgetui_probe_tool" in text
    return _renders_tools[key]


def with_tools_in_system(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hermes-style tool instructions in the system turn, for templates that ignore `tools`.

    The system turn comes first, so every call of a rollout renders it identically and the
    token prefix between calls still holds.
    """
    block = HERMES_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{block}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> str:
    """The prompt text for `messages` (and `tools`) as the model was trained to see it."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError("the policy's tokenizer has no chat template; use a chat/instruct model")
    if tools and not template_renders_tools(tokenizer):
        messages, tools = with_tools_in_system(messages, tools), None
    vision = vision_prompt(tokenizer) if any("parts" in m for m in messages) else None
    text = tokenizer.apply_chat_template(
        _template_messages(template_messages(messages) if vision is not None else messages),
        tools=tools or None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    # a vision model sees each image as a run of placeholder tokens; a text model, as the "[image]" text
    return vision.expand(text, request_images(messages)) if vision is not None else text


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of already-templated text (special tokens in the text are kept as such).

    Under `run_cancellable` a big text is encoded by a child process its caller can stop.
    """
    ids = encode_in_child(tokenizer, text)
    return ids if ids is not None else list(tokenizer.encode(text, add_special_tokens=False))
