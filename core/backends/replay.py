"""A replay policy: answers a session's call k with the recorded completion k, token for token.

The same completion ids and logprobs as recorded go back through the real token path (decode, tool-call
parsing, splicing), so the harness sees the answers it saw then. Each call's prompt, rendered by the proxy
from what the harness sent now, is compared with the recorded prompt: the first differing token, the
calls beyond the recording, and the calls never made are what `forgetui replay` reports.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.backends.base import GenerationContext, SamplingParams, TokenChunk
from core.backends.kinds import Capabilities
from core.backends.spec import PolicySpec, spec_or_none
from core.errors import ConfigError
from core.models.loading import load_tokenizer
from core.models.resolve import resolve_model
from core.store.locate import store_of
from core.store.query import run_query
from core.store.tokens import id_list

REPLAY_CONTEXT = 1 << 22  # the recording decided every length; replay never cuts a prompt


@dataclass
class RecordedCall:
    """One call of the recording: the prompt it was given and the completion it sampled."""

    seq: int
    call_id: str
    prompt_ids: list[int] | None
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None


@dataclass
class ServedCall:
    """What replay saw for call k: the prompt the proxy rendered now, and whether it matched the recording."""

    index: int
    prompt_ids: list[int]
    recorded: RecordedCall | None
    first_difference: int | None = None  # token position where the prompts part, None when equal (or not recorded)


@dataclass
class ReplayBackend:
    """A `TokenBackend` over one rollout's recorded calls (all sessions share them: replay runs one rollout)."""

    recorded: list[RecordedCall]
    tokenizer: Any
    name: str = "replay"
    context_length: int = REPLAY_CONTEXT
    capabilities: Capabilities = Capabilities(token_ids=True, logprobs=True)
    weights_version: int | None = None  # the recording's answers, whatever weights sampled them
    served: list[ServedCall] = field(default_factory=list)
    _next: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext) -> AsyncIterator[TokenChunk]:
        k = self._next[context.session]
        self._next[context.session] += 1
        rec = self.recorded[k] if k < len(self.recorded) else None
        served = ServedCall(k, list(prompt_ids), rec)
        if rec is not None and rec.prompt_ids is not None and list(rec.prompt_ids) != served.prompt_ids:
            served.first_difference = first_difference(rec.prompt_ids, served.prompt_ids)
        self.served.append(served)
        if rec is None:  # more calls than recorded: end the turn (eos), the report says where
            eos = self.tokenizer.eos_token_id
            yield TokenChunk([eos] if eos is not None else [], [0.0] if eos is not None else [], "stop")
            return
        finish = "length" if rec.finish_reason == "length" else "stop"
        yield TokenChunk(list(rec.completion_ids), list(rec.logprobs), finish)
        await asyncio.sleep(0)

    async def aclose(self) -> None:
        return None


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two token lists differ (the shorter one's length when one extends the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


@dataclass
class Recording:
    """A recorded rollout: its row, its run's config and its final attempt's calls."""

    store: Path
    rollout: dict[str, Any]
    config: dict[str, Any]
    calls: list[RecordedCall]


def _rows(store: Path, sql: str) -> list[dict[str, Any]]:
    result = run_query(store, sql)
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def load_recording(rollout_id: str, store: Path | None = None) -> Recording:
    """The rollout's row, its run's config and its final attempt's ok calls (whole prompts rebuilt) from the store."""
    store = store or store_of(rollout_id.split("/", 1)[0])
    found = _rows(store, f"SELECT r.*, ru.config AS run_config FROM rollouts r LEFT JOIN runs ru ON ru.run_id = r.run_id WHERE r.rollout_id = {_lit(rollout_id)}")
    if not found:
        raise ConfigError(f"no rollout {rollout_id!r} in {store} (rollout ids look like RUN/TASK/0; list them with `forgetui sql \"SELECT rollout_id FROM rollouts\"`)")
    rollout = found[0]
    config = rollout.pop("run_config")
    config = json.loads(config) if isinstance(config, str) else (config or {})
    attempt = rollout.get("attempt") or 0
    rows = _rows(
        store,
        "SELECT seq, call_id, completion_token_ids, completion_logprobs, finish_reason FROM calls "
        f"WHERE rollout_id = {_lit(rollout_id)} AND coalesce(attempt, 0) = {int(attempt)} AND status = 'ok' ORDER BY seq",
    )
    calls = []
    for row in rows:
        prompt = _rows(store, f"SELECT prompt_token_ids FROM full_prompt({_lit(row['call_id'])})")
        ids = id_list(row["completion_token_ids"])  # token text (schema 6 on) or a list
        if ids is None:
            raise ConfigError(f"call {row['call_id']} of {rollout_id} has no completion token ids (a passthrough recording): there is nothing token-exact to replay")
        logprobs = row["completion_logprobs"] or [0.0] * len(ids)
        calls.append(RecordedCall(row["seq"], row["call_id"], prompt[0]["prompt_token_ids"] if prompt else None, ids, list(logprobs), row["finish_reason"]))
    return Recording(store, rollout, config, calls)


def tokenizer_name(policy: dict[str, Any]) -> str:
    """The tokenizer the recording's policy rendered prompts with (what replay must render with too)."""
    spec = spec_or_none(policy.get("backend", "builtin:tiny"))
    if spec is None:
        raise ConfigError(f"the recorded policy.backend {policy.get('backend')!r} no longer parses: it cannot be replayed")
    if spec.declared.path != "token":
        raise ConfigError("this rollout was recorded through a passthrough (litellm:) backend: its prompts were never tokenized here, so it cannot be replayed token for token")
    return spec.tokenizer_model(policy.get("tokenizer")) or "tiny"


def replay_backend(recording: Recording) -> ReplayBackend:
    """A replay backend over the recording, with the tokenizer its policy used."""
    tokenizer = load_tokenizer(resolve_model(tokenizer_name(recording.config.get("policy", {}))))
    return ReplayBackend(recording.calls, tokenizer, name=f"replay:{recording.rollout['rollout_id']}")


def from_spec(spec: PolicySpec, *, tokenizer: str | None = None) -> ReplayBackend:
    """`replay:ROLLOUT_ID` (option store=PATH): a recorded rollout's answers, token for token (`forgetui replay`)."""
    store = spec.options.get("store")
    return replay_backend(load_recording(spec.target, Path(store) if store else None))
