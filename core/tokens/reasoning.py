"""Split sampled text into reasoning and answer (``<think>…</think>`` first, Qwen3 style); parsers by name.

A thinking model samples its reasoning as ordinary tokens. The proxy records those ids unchanged (they are
trained on) and only splits the decoded text: the reasoning goes back in each protocol's own form, the
answer is parsed for tool calls. Reasoning is recognised only where the sampled text opens with the
open tag (as vLLM's qwen3 parser does); a text without it is all answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError

AUTO = "auto"
OFF = "none"


@dataclass(frozen=True)
class ThinkTags:
    """The tags a model writes around its reasoning."""

    open: str
    close: str

    def block(self) -> re.Pattern[str]:
        """A whole think block and the whitespace after it (for comparing renders that drop reasoning)."""
        return re.compile(re.escape(self.open) + r".*?" + re.escape(self.close) + r"\s*", re.DOTALL)


QWEN3 = ThinkTags("<think>", "</think>")
REASONING_PARSERS: dict[str, ThinkTags] = {"qwen3": QWEN3, "deepseek_r1": QWEN3}


def split_reasoning(text: str, tags: ThinkTags) -> tuple[str, str]:
    """(reasoning, answer) of a sampled text; a text that does not open with `tags.open` is all answer."""
    body = text.lstrip()
    if not body.startswith(tags.open):
        return "", text
    body = body[len(tags.open) :]
    reasoning, closed, answer = body.partition(tags.close)
    return reasoning.strip("\n"), answer.lstrip("\n") if closed else ""


def strip_reasoning(text: str, tags: ThinkTags) -> str:
    """`text` without its think blocks (an empty one included), as a template that drops reasoning renders it."""
    return tags.block().sub("", text)


def parser_names() -> list[str]:
    return sorted(REASONING_PARSERS)


def reasoning_tags(tokenizer: Any, name: str | None) -> ThinkTags | None:
    """The think tags the proxy splits on: `name` ("qwen3", "none"), or by default (None / "auto") the
    qwen3 tags when the tokenizer has them as single tokens and its chat template renders them."""
    if name is None or name == AUTO:
        template = getattr(tokenizer, "chat_template", None) or ""
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        found = isinstance(template, str) and QWEN3.close in template and QWEN3.open in vocab and QWEN3.close in vocab
        return QWEN3 if found else None
    if name == OFF:
        return None
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ConfigError(f"unknown reasoning parser {name!r}; known: {', '.join([*parser_names(), AUTO, OFF])}") from None


def check_reasoning_name(name: str | None) -> None:
    """ConfigError when `name` is no reasoning parser (checked when a backend spec loads)."""
    if name is not None and name not in (AUTO, OFF) and name not in REASONING_PARSERS:
        raise ConfigError(f"reasoning={name!r} in the backend spec is not one of {', '.join([*parser_names(), AUTO, OFF])}")


class ReasoningStream:
    """Splits streamed text into reasoning and answer deltas that add up to `split_reasoning`'s result.

    Nothing is shown until it is known whether the text opens with the open tag; inside the
    reasoning, trailing newlines and what may start the close tag are held back, so every delta
    is final.
    """

    def __init__(self, tags: ThinkTags) -> None:
        self.tags = tags
        self.buffer = ""
        self.sent_reasoning = 0
        self.sent_answer = 0

    def feed(self, delta: str) -> tuple[str, str]:
        """Add sampled text; return the new (reasoning, answer) text."""
        self.buffer += delta
        reasoning, answer = self._stable()
        out = reasoning[self.sent_reasoning :], answer[self.sent_answer :]
        self.sent_reasoning, self.sent_answer = max(self.sent_reasoning, len(reasoning)), max(self.sent_answer, len(answer))
        return out

    def _stable(self) -> tuple[str, str]:
        """The parts of (reasoning, answer) that no later text can change."""
        tags, body = self.tags, self.buffer.lstrip()
        if len(body) < len(tags.open) and tags.open.startswith(body):
            return "", ""  # it may still open with the tag
        if not body.startswith(tags.open):
            return "", self.buffer
        body = body[len(tags.open) :]
        reasoning, closed, answer = body.partition(tags.close)
        if closed:
            return reasoning.strip("\n"), answer.lstrip("\n")
        for keep in range(min(len(tags.close) - 1, len(reasoning)), 0, -1):
            if tags.close.startswith(reasoning[-keep:]):
                reasoning = reasoning[:-keep]
                break
        return reasoning.lstrip("\n").rstrip("\n"), ""
