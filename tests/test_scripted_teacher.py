"""A scripted teacher for many tasks: each task's turns are picked by a text in its user message."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from core.backends.base import GenerationContext, SamplingParams
from core.backends.scripted import ScriptedBackend
from core.chat import ChatRequest
from core.errors import ConfigError

BASH = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


def answer(backend: ScriptedBackend, session: str, instruction: str) -> str:
    request = ChatRequest(api="chat", model="policy", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": instruction}], tools=BASH)

    async def run() -> list[int]:
        ids: list[int] = []
        async for chunk in backend.generate([1], SamplingParams(max_tokens=512), GenerationContext(session=session, call_seq=0, request=request)):
            ids += chunk.token_ids
        return ids

    return backend.tokenizer.decode(asyncio.run(run()), skip_special_tokens=True)


def test_each_task_plays_its_own_turns(tmp_path: Path) -> None:
    script = tmp_path / "teacher.json"
    script.write_text(json.dumps({
        "tasks": [
            {"match": "hello.txt", "turns": [{"tool": "bash", "command": "echo hi > hello.txt"}, {"text": "made hello"}]},
            {"match": "sum.txt", "turns": [{"tool": "bash", "command": "echo 6 > sum.txt"}, {"text": "summed"}]},
        ],
        "turns": [{"text": "no idea"}],
    }))
    backend = ScriptedBackend(script)
    assert "echo hi > hello.txt" in answer(backend, "a", "Create a file hello.txt containing hi")
    assert "echo 6 > sum.txt" in answer(backend, "b", "Write their sum to a file named sum.txt.")
    assert answer(backend, "a", "Create a file hello.txt containing hi") == "made hello"  # session a's second call
    assert answer(backend, "c", "Something else entirely") == "no idea"


def test_a_malformed_task_entry_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "bad.json"
    script.write_text(json.dumps({"tasks": [{"match": "x", "turns": [{"nope": 1}]}]}))
    with pytest.raises(ConfigError, match=r"tasks\[0\], turn 0"):
        ScriptedBackend(script)
