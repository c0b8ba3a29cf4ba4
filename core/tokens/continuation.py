"""Token-exact continuation across a harness's calls.

A harness re-sends its whole history on every call. For each session we keep,
per produced assistant turn, the exact prompt + completion token ids; when a
new request's history starts with a conversation we answered, the prompt is
built as *those ids* + the tokens of what came after, so call k+1's prompt
starts with call k's prompt + completion token for token (no re-tokenization
of sampled text). Where the harness rewrote history (compaction, subagents,
stripped thinking, a title call), no turn matches: the call starts a new
branch and the store says so.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from core.tokens.template import encode, render_chat

MAX_TURNS_PER_SESSION = 256


def _norm_args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments.strip()
    return arguments


def normalize_message(msg: dict[str, Any]) -> tuple:
    """What must match for two messages to be 'the same turn' (ids and whitespace ignored)."""
    calls = tuple(
        (c.get("function", {}).get("name"), orjson.dumps(_norm_args(c.get("function", {}).get("arguments")), option=orjson.OPT_SORT_KEYS))
        for c in msg.get("tool_calls") or ()
    )
    return (msg.get("role"), (msg.get("content") or "").strip(), calls)


def tools_key(tools: list[dict[str, Any]]) -> str:
    return hashlib.sha256(orjson.dumps(tools or [], option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


@dataclass
class Turn:
    """One answered call: the conversation it answered, our answer, and the exact token ids."""

    call_id: str
    branch: int
    tools: str
    history: tuple[tuple, ...]
    answer: tuple
    full_ids: list[int]
    ended_with_eos: bool


@dataclass
class PromptPlan:
    prompt_ids: list[int]
    branch: int
    parent_call_id: str | None
    extends_parent: bool
    prefix_tokens: int


class Continuation:
    """Per-session memory of produced turns and the splice that reuses their token ids."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_text: str = tokenizer.eos_token or ""
        self.turns: deque[Turn] = deque(maxlen=MAX_TURNS_PER_SESSION)
        self.branches = 0

    def plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> PromptPlan:
        """Prompt ids for this request, spliced onto the turn it continues when there is one."""
        norm = tuple(normalize_message(m) for m in messages)
        tkey = tools_key(tools)
        full_text = render_chat(self.tokenizer, messages, tools, add_generation_prompt=True)
        for turn in reversed(self.turns):
            k = len(turn.history)
            if turn.tools != tkey or len(norm) <= k or norm[:k] != turn.history or norm[k] != turn.answer:
                continue
            spliced = self._splice(turn, messages[: k + 1], tools, full_text)
            if spliced is not None:
                return PromptPlan(spliced, turn.branch, turn.call_id, True, len(turn.full_ids))
        ids = encode(self.tokenizer, full_text)
        parent = self.turns[-1] if self.turns else None
        if parent is not None and ids[: len(parent.full_ids)] == parent.full_ids:
            return PromptPlan(ids, parent.branch, parent.call_id, True, len(parent.full_ids))
        branch = self.branches
        self.branches += 1
        return PromptPlan(ids, branch, parent.call_id if parent else None, False, 0)

    def _splice(self, turn: Turn, answered: list[dict[str, Any]], tools: list[dict[str, Any]], full_text: str) -> list[int] | None:
        answered_text = render_chat(self.tokenizer, answered, tools, add_generation_prompt=False)
        if not full_text.startswith(answered_text):
            return None  # the template re-renders history differently: a new branch
        close = ""
        if self.eos_text and self.eos_text in answered_text:
            close = answered_text[answered_text.rfind(self.eos_text) + len(self.eos_text) :]
        glue = close if turn.ended_with_eos else self.eos_text + close
        return turn.full_ids + encode(self.tokenizer, glue + full_text[len(answered_text) :])

    def remember(
        self,
        call_id: str,
        plan: PromptPlan,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        answer: dict[str, Any],
        completion_ids: list[int],
    ) -> None:
        """Keep an answered call so later calls that carry it in their history can splice onto it."""
        eos_id = self.tokenizer.eos_token_id
        self.turns.append(
            Turn(
                call_id=call_id,
                branch=plan.branch,
                tools=tools_key(tools),
                history=tuple(normalize_message(m) for m in messages),
                answer=normalize_message(answer),
                full_ids=plan.prompt_ids + completion_ids,
                ended_with_eos=bool(completion_ids) and completion_ids[-1] == eos_id,
            )
        )
