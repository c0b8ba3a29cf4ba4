"""Streaming detokenization gives, chunk by chunk, exactly the text of a full decode."""

from __future__ import annotations

import random

import pytest

from core.tokens.incremental import IncrementalDecoder

TEXTS = [
    "plain ascii words, numbers 12345 and punctuation!?",
    "multi-byte: héllo wörld — “quotes” 日本語のテキスト 🚀🔥 emoji",
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la /tmp"}}\n</tool_call>',
    "  leading spaces\n\n\ttabs and\r\nnewlines  ",
]


@pytest.mark.parametrize("text", TEXTS)
def test_any_chunking_streams_the_full_decode(tiny_tokenizer, text: str) -> None:
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    full = tiny_tokenizer.decode(ids, skip_special_tokens=False)
    rng = random.Random(text)
    for _ in range(20):
        decoder = IncrementalDecoder(tiny_tokenizer)
        streamed, i = [], 0
        while i < len(ids):
            n = rng.choice([1, 1, 1, 2, 3, 8])
            delta = decoder.feed(ids[i : i + n])
            assert "\ufffd" not in delta  # never half a character
            streamed.append(delta)
            i += n
        assert "".join(streamed) == decoder.text == full


def test_skipped_ids_and_empty_feeds(tiny_tokenizer) -> None:
    eos = tiny_tokenizer.eos_token_id
    decoder = IncrementalDecoder(tiny_tokenizer, skip_ids={eos})
    ids = tiny_tokenizer.encode("done.", add_special_tokens=False)
    assert decoder.feed([]) == ""
    assert decoder.feed(ids) + decoder.feed([eos]) == "done." == decoder.text
