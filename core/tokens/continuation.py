"""Token-exact continuation across a harness's calls.

A harness re-sends its whole history on every call. For each session we keep,
per produced assistant turn, the exact prompt + completion token ids; when a
new request's history starts with a conversation we answered, the prompt is
built as *those ids* + the tokens of what came after, so call k+1's prompt
starts with call k's prompt + completion token for token (no re-tokenization
of sampled text). Where the harness rewrote history (compaction, subagents,
a title call), no turn matches: the call starts a new branch and the store
says so. A thinking model's reasoning is part of the sampled ids; a harness
resends the turn without it (or in a form the protocols drop), so the turn
still matches, and for a template that renders reasoning only after the last
user query (Qwen3's) the answered turn's end is found in a render that equals
the answered one once think blocks are removed (`after_answered`).

What comes after the answered turn is rendered incrementally: the template
renders a short stand-in of the answered history (a placeholder system turn,
then the answered turn and the message before it) followed by the new
messages, and the text after the stand-in is the new text. Its cost grows with
the new messages only, not the history. The full render (the reference path,
`plan_full`) stays the authority: a template must pass a probe of prefix
stability before the incremental path is used for it, and the first splice of
each message shape is cross-checked against the full render (a mismatch turns
the incremental path off for that shape).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from core.chat import image_refs
from core.tokens.reasoning import ThinkTags, reasoning_tags, strip_reasoning
from core.tokens.template import encode, render_chat

log = logging.getLogger(__name__)

MAX_TURNS_PER_SESSION = 256
MAX_SHAPES_PER_TOKENIZER = 4096
STAND_IN_SYSTEM = {"role": "system", "content": "."}


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
    images = image_refs(msg)  # the same text around another screenshot is another turn
    return (msg.get("role"), (msg.get("content") or "").strip(), calls, images)


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
    parent_ids: list[int] | None = None  # the parent's prompt + completion that prompt_ids starts with (when extends_parent)
    key: tuple[tuple, ...] | None = None  # the request's normalized messages (reused by `remember`)


# ----------------------------------------------------------------------------- rendering the new text
def _close(answered_text: str, eos_text: str) -> str:
    """What the template writes after the answered turn's last end-of-turn token."""
    if eos_text and eos_text in answered_text:
        return answered_text[answered_text.rfind(eos_text) + len(eos_text) :]
    return ""


_think_tags: weakref.WeakKeyDictionary[Any, tuple[ThinkTags | None]] = weakref.WeakKeyDictionary()


def template_think_tags(tokenizer: Any) -> ThinkTags | None:
    """The think tags this tokenizer's template renders (cached: reading a vocabulary is not free)."""
    found = _think_tags.get(tokenizer)
    if found is None:
        found = _think_tags[tokenizer] = (reasoning_tags(tokenizer, None),)
    return found[0]


def after_answered(answered_text: str, text: str, eos_text: str, think: ThinkTags | None) -> int | None:
    """Where the text after the answered turn (and its close) starts in `text`, a render that goes on past it.

    Where `answered_text` is a prefix of `text`, right after it. A template that drops reasoning renders the
    answered turn differently once a turn follows it (Qwen3's writes an empty think block on the last turn
    only, and no reasoning before the last user query): then the turn ends at the same end-of-turn token
    of a render that, think blocks removed, equals the answered one. None when neither holds: the template
    re-renders history otherwise, and the call starts a new branch.
    """
    if text.startswith(answered_text):
        return len(answered_text)
    end = answered_text.rfind(eos_text) if eos_text and think is not None else -1
    if end < 0:
        return None
    end += len(eos_text)
    cut = -len(eos_text)
    for _ in range(answered_text.count(eos_text)):
        cut = text.find(eos_text, cut + len(eos_text))
        if cut < 0:
            return None
    cut += len(eos_text)
    close = answered_text[end:]
    if not text.startswith(close, cut) or strip_reasoning(text[:cut], think) != strip_reasoning(answered_text[:end], think):
        return None
    return cut + len(close)


def _tail(tokenizer: Any, answered_text: str, text: str) -> tuple[str, str] | None:
    """(close, new text) of `text` after the answered turn rendered as `answered_text`."""
    eos_text = tokenizer.eos_token or ""
    start = after_answered(answered_text, text, eos_text, template_think_tags(tokenizer))
    if start is None:
        return None
    return _close(answered_text, eos_text), text[start:]


def tail_full(tokenizer: Any, messages: list[dict[str, Any]], k: int, tools: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(close, new text) after the answered turn `messages[k]`, from full renders; None when not prefix-stable."""
    answered_text = render_chat(tokenizer, messages[: k + 1], tools, add_generation_prompt=False)
    full_text = render_chat(tokenizer, messages, tools, add_generation_prompt=True)
    return _tail(tokenizer, answered_text, full_text)


def stand_in(messages: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """A short conversation that ends like `messages[: k + 1]`: a placeholder system turn, then its last two messages."""
    start = max(k - 1, 0)
    head = [STAND_IN_SYSTEM] if start > 0 and messages[0].get("role") == "system" else []
    return head + messages[start : k + 1]


def tail_incremental(tokenizer: Any, messages: list[dict[str, Any]], k: int, tools: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(close, new text) after `messages[k]`, rendering only a stand-in of the history; None when not prefix-stable."""
    context = stand_in(messages, k)
    context_text = render_chat(tokenizer, context, tools, add_generation_prompt=False)
    text = render_chat(tokenizer, context + messages[k + 1 :], tools, add_generation_prompt=True)
    return _tail(tokenizer, context_text, text)


def shape(messages: list[dict[str, Any]], k: int, tkey: str) -> tuple:
    """What the template's structure can depend on around the splice: roles, tool calls, content types, tools."""

    def one(m: dict[str, Any]) -> tuple:
        return (m.get("role"), bool(m.get("tool_calls")), type(m.get("content")).__name__)

    start = max(k - 1, 0)
    return (messages[0].get("role") == "system", start > 0, tuple(one(m) for m in messages[start:]), tkey)


PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]


def _probe_conversations() -> list[list[dict[str, Any]]]:
    """Conversations that exercise the template around assistant turns (tools, consecutive results, users)."""
    call = lambda i, cmd: {"id": f"p{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": cmd})}}  # noqa: E731
    body = [
        {"role": "user", "content": "Create hello.txt"},
        {"role": "assistant", "content": None, "tool_calls": [call(1, "echo hi > hello.txt")]},
        {"role": "tool", "tool_call_id": "p1", "content": ""},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call(2, "cat hello.txt"), call(3, "ls")]},
        {"role": "tool", "tool_call_id": "p2", "content": "hi"},
        {"role": "tool", "tool_call_id": "p3", "content": "hello.txt"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "You're welcome."},
        {"role": "user", "content": "and again"},
    ]
    return [[{"role": "system", "content": "You are a coding agent."}, *body], body]


def probe_incremental(tokenizer: Any) -> bool:
    """Whether the incremental render equals the full render's new text on the probe conversations."""
    try:
        for conversation in _probe_conversations():
            for tools in (PROBE_TOOLS, []):
                for k, msg in enumerate(conversation):
                    if msg["role"] != "assistant" or k + 1 >= len(conversation):
                        continue
                    if tail_incremental(tokenizer, conversation, k, tools) != tail_full(tokenizer, conversation, k, tools):
                        return False
    except Exception as exc:  # noqa: BLE001 - a template that cannot render the probe is not used incrementally
        log.info("chat template failed the incremental probe (%s); full renders only", exc)
        return False
    return True


class _TemplateFacts:
    """Per tokenizer: whether the incremental path is allowed, and which splice shapes were cross-checked."""

    def __init__(self, tokenizer: Any) -> None:
        self.incremental = probe_incremental(tokenizer)
        self.shapes: dict[tuple, bool] = {}
        if not self.incremental:
            log.warning("the chat template is not incrementally renderable; every spliced call renders its whole history")


_facts: weakref.WeakKeyDictionary[Any, _TemplateFacts] = weakref.WeakKeyDictionary()
_facts_lock = threading.Lock()


def template_facts(tokenizer: Any) -> _TemplateFacts:
    """The (cached) facts for this tokenizer's template."""
    with _facts_lock:
        facts = _facts.get(tokenizer)
        if facts is None:
            facts = _facts[tokenizer] = _TemplateFacts(tokenizer)
        return facts


# ----------------------------------------------------------------------------- the continuation
class Continuation:
    """Per-session memory of produced turns and the splice that reuses their token ids."""

    def __init__(self, tokenizer: Any, *, incremental: bool = True) -> None:
        self.tokenizer = tokenizer
        self.eos_text: str = tokenizer.eos_token or ""
        self.turns: deque[Turn] = deque(maxlen=MAX_TURNS_PER_SESSION)
        self.branches = 0
        self.incremental = incremental

    def plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> PromptPlan:
        """Prompt ids for this request, spliced onto the turn it continues when there is one."""
        return self._plan(messages, tools, self._tail)

    def plan_full(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> PromptPlan:
        """`plan` by full renders of the history only (the reference the incremental path must equal)."""
        return self._plan(messages, tools, lambda m, k, t, _key: tail_full(self.tokenizer, m, k, t))

    def _plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], tail: Any) -> PromptPlan:
        norm = tuple(normalize_message(m) for m in messages)
        tkey = tools_key(tools)
        for turn in reversed(self.turns):
            k = len(turn.history)
            if turn.tools != tkey or len(norm) <= k or norm[k] != turn.answer or norm[:k] != turn.history:
                continue
            parts = tail(messages, k, tools, tkey)
            if parts is not None:
                ids = self._splice(turn, *parts)
                return PromptPlan(ids, turn.branch, turn.call_id, True, len(turn.full_ids), turn.full_ids, norm)
        return self._fresh(messages, tools, norm)

    def _fresh(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], norm: tuple[tuple, ...]) -> PromptPlan:
        """A plan from the whole rendered conversation (no turn to splice onto)."""
        ids = encode(self.tokenizer, render_chat(self.tokenizer, messages, tools, add_generation_prompt=True))
        parent = self.turns[-1] if self.turns else None
        if parent is not None and ids[: len(parent.full_ids)] == parent.full_ids:
            return PromptPlan(ids, parent.branch, parent.call_id, True, len(parent.full_ids), parent.full_ids, norm)
        branch = self.branches
        self.branches += 1
        return PromptPlan(ids, branch, parent.call_id if parent else None, False, 0, None, norm)

    def _splice(self, turn: Turn, close: str, rest: str) -> list[int]:
        """The turn's exact ids, then the tokens of the end-of-turn glue and the new text."""
        glue = close if turn.ended_with_eos else self.eos_text + close
        return turn.full_ids + encode(self.tokenizer, glue + rest)

    def _tail(self, messages: list[dict[str, Any]], k: int, tools: list[dict[str, Any]], tkey: str) -> tuple[str, str] | None:
        """The new text after turn `messages[k]`: incremental where the template allows it, else full renders."""
        facts = template_facts(self.tokenizer) if self.incremental else None
        if facts is None or not facts.incremental:
            return tail_full(self.tokenizer, messages, k, tools)
        key = shape(messages, k, tkey)
        trusted = facts.shapes.get(key)
        if trusted is False:
            return tail_full(self.tokenizer, messages, k, tools)
        try:
            parts = tail_incremental(self.tokenizer, messages, k, tools)
        except Exception as exc:  # noqa: BLE001 - the full render decides (and raises what it raises)
            log.debug("incremental render failed (%s); rendering the whole history", exc)
            parts = None
        if parts is None:
            return tail_full(self.tokenizer, messages, k, tools)
        if trusted is None:
            return self._cross_check(facts, key, parts, messages, k, tools)
        return parts

    def _cross_check(
        self, facts: _TemplateFacts, key: tuple, parts: tuple[str, str], messages: list[dict[str, Any]], k: int, tools: list[dict[str, Any]]
    ) -> tuple[str, str] | None:
        """The first splice of a shape: the full render decides, and says whether the shape is trusted from now on."""
        reference = tail_full(self.tokenizer, messages, k, tools)
        ok = reference == parts
        if not ok:
            log.warning("incremental render differs from the full render for splice shape %s; rendering whole histories for it", key)
        if len(facts.shapes) < MAX_SHAPES_PER_TOKENIZER:
            facts.shapes[key] = ok
        return reference

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
        history = plan.key if plan.key is not None and len(plan.key) == len(messages) else tuple(normalize_message(m) for m in messages)
        self.turns.append(
            Turn(
                call_id=call_id,
                branch=plan.branch,
                tools=tools_key(tools),
                history=history,
                answer=normalize_message(answer),
                full_ids=plan.prompt_ids + completion_ids,
                ended_with_eos=bool(completion_ids) and completion_ids[-1] == eos_id,
            )
        )

    def ids_of(self, call_id: str) -> list[int] | None:
        """The prompt + completion ids of a remembered call, or None when it is not (or no longer) remembered."""
        for turn in reversed(self.turns):
            if turn.call_id == call_id:
                return turn.full_ids
        return None
