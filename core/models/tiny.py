"""A tiny random Qwen2 model with its own byte-level BPE tokenizer, built locally and deterministically.

No download: the tokenizer is trained on a corpus generated here from fixed seeds, the
weights are a seeded random init. Good for fast tests and demos of the whole token path.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from core import paths
from core.errors import ModelError
from core.models.quiet import quiet_third_party

log = logging.getLogger(__name__)

TINY_NAME = "tiny-v1"
VOCAB_SIZE = 4096
MAX_POSITIONS = 65536
SEED = 20261130
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# single tokens (not "special": they survive skip_special_tokens) that make tool calls cheap to parse
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>"]
_DONE_MARKER = "forgetui-tiny.done"

_WORDS = (
    "the a an of to in and or is are was be it this that for on with as by at from not you we they "
    "file files folder directory path read write edit create delete list run runs command commands shell "
    "bash output input error errors test tests pass fail passed failed task tasks user assistant system "
    "tool tools call result response request model agent code python function class return import def "
    "print value values string number list dict json key keys name names arguments argument content "
    "line lines text data config install build make check fix bug issue change changes update new old "
    "first last next please can will should would could use using used help need want done ok yes no "
    "hello world workspace repo repository git commit branch diff patch search find grep glob open close "
    "start stop wait time timeout process exit status code message messages step steps plan goal answer"
).split()

_SNIPPETS = [
    "ls -la",
    "cat README.md",
    "echo hi > hello.txt",
    "python3 -m pytest -q",
    "grep -rn TODO .",
    "mkdir -p src && cd src",
    "git status --short",
    "git diff HEAD",
    "pip install -e .",
    "npm test",
    "sed -n 1,40p main.py",
    "find . -name '*.py'",
    "wc -l *.txt",
    "printf 'done\\n'",
    "bash -lc",
    "def main() -> None:\n    print('hello')\n",
    "if __name__ == '__main__':\n    main()\n",
    "import os\nimport sys\n",
    "for i in range(10):\n    total += i\n",
    'return {"ok": True}\n',
    "class Solution:\n    def solve(self, items):\n        return sorted(items)\n",
    "Traceback (most recent call last):\n",
    "AssertionError: expected 3, got 2\n",
    "Exit code: 0\n",
    "Exit code: 1\n",
    "No such file or directory\n",
    "Permission denied\n",
    "You are a helpful assistant.",
    "# Tools\n\nYou may call one or more functions to assist with the user query.",
    "You are provided with function signatures within <tools></tools> XML tags:",
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:",
    '{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": '
    '{"type": "object", "properties": {"command": {"type": "string", "description": "The command"}}, "required": ["command"]}}}',
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
    "<tool_response>\nhello.txt\n</tool_response>",
    "<|im_start|>system\n",
    "<|im_start|>user\n",
    "<|im_start|>assistant\n",
    "<|im_end|>\n",
]

_TOOL_NAMES = [
    "bash",
    "shell",
    "exec_command",
    "run_shell_command",
    "Bash",
    "Read",
    "Write",
    "Edit",
    "read_file",
    "write_file",
    "list_directory",
    "glob",
    "grep",
    "apply_patch",
    "exec",
    "read",
    "write",
    "edit",
]
_PARAM_NAMES = [
    "command",
    "cmd",
    "path",
    "file_path",
    "filePath",
    "content",
    "pattern",
    "description",
    "timeout",
]


def _corpus(rng: random.Random) -> list[str]:
    """A fixed, generated training corpus (same on every machine)."""
    docs: list[str] = list(_SNIPPETS)
    for _ in range(3000):
        n = rng.randint(5, 30)
        sentence = " ".join(rng.choice(_WORDS) for _ in range(n))
        if rng.random() < 0.5:
            sentence = sentence[0].upper() + sentence[1:] + "."
        docs.append(sentence)
    for _ in range(1500):
        name = rng.choice(_TOOL_NAMES)
        args = {rng.choice(_PARAM_NAMES): rng.choice(_SNIPPETS[:15]) for _ in range(rng.randint(1, 3))}
        docs.append(f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>')
        props = {
            p: {
                "type": rng.choice(["string", "number", "boolean", "array"]),
                "description": " ".join(rng.choice(_WORDS) for _ in range(6)),
            }
            for p in rng.sample(_PARAM_NAMES, 3)
        }
        docs.append(
            json.dumps(
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": rng.choice(_WORDS),
                        "parameters": {"type": "object", "properties": props, "required": list(props)[:1]},
                    },
                }
            )
        )
    exts = ["py", "txt", "md", "json", "toml", "sh", "js", "ts", "rs", "go", "c", "h", "yaml"]
    for _ in range(4000):
        a, b, c = rng.choice(_WORDS), rng.choice(_WORDS), rng.choice(_WORDS)
        docs.append(f"{a}_{b} = {b}_{c}({a}, {c.upper()})")
        docs.append(f"{a.capitalize()}{b.capitalize()}{c.capitalize()}.{b}{c.capitalize()}()")
        docs.append(f"/home/user/{a}/{b}-{c}.{rng.choice(exts)}:{rng.randint(1, 999)}")
        docs.append(f'--{a}-{b}={rng.randint(0, 99)} -{a[0]} "{c} {b}"')
    for _ in range(1500):
        docs.append("".join(rng.choice(_SNIPPETS) for _ in range(rng.randint(1, 4))))
        docs.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(1, 8))))
    return docs


def chat_template() -> str:
    """The ChatML + hermes tool-call template (Qwen2.5 style) shipped with the tiny model."""
    return resources.files("core.models").joinpath("chatml.jinja").read_text(encoding="utf-8")


def _build_tokenizer(rng: random.Random):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TOOL_TOKENS),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )
    from tokenizers import AddedToken

    fast.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast.chat_template = chat_template()
    return fast


def build_model(tokenizer):
    """A seeded random Qwen2 sized for `tokenizer` (its vocabulary, its eos and pad tokens)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        use_sliding_window=False,
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config)
    model.eval()
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def build_tiny_model(dest: Path) -> None:
    """Build the tokenizer and the model into `dest` (an empty or missing folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    with quiet_third_party():  # "Writing model shards" and friends: the caller shows its own progress
        tokenizer = _build_tokenizer(random.Random(SEED))
        model = build_model(tokenizer)
        tokenizer.save_pretrained(dest)
        model.save_pretrained(dest, safe_serialization=True)
    (dest / _DONE_MARKER).write_text(TINY_NAME + "\n")


def ensure_tiny_model(root: Path | None = None) -> Path:
    """The tiny model's folder under FORGETUI_HOME/models (or `root`), built on first use (atomic)."""
    base = Path(root) if root is not None else paths.models_dir()
    final = base / TINY_NAME

    def build(dest: Path) -> None:
        log.info("building the tiny model into %s", final)
        build_tiny_model(dest)

    return build_once(final, _DONE_MARKER, build, f"cannot build the tiny model in {base}")


def build_once(final: Path, done_marker: str, build: Callable[[Path], None], failure: str) -> Path:
    """`final`, built by ``build(folder)`` in a temporary sibling and moved into place when complete.

    Concurrent first uses each build; the first to finish wins and the others keep its folder. A failed
    build leaves nothing behind and raises ModelError starting with `failure`.
    """
    if (final / done_marker).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        build(tmp)
        _publish(tmp, final, done_marker)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, ModelError):
            raise
        raise ModelError(f"{failure}: {exc}") from exc
    return final


def _publish(tmp: Path, final: Path, done_marker: str) -> None:
    """Move a finished build into place; if another process won the race, keep theirs."""
    if final.exists() and not (final / done_marker).exists():
        # a leftover from a crashed non-atomic writer: replace it
        shutil.rmtree(final, ignore_errors=True)
    try:
        os.replace(tmp, final)
    except OSError:
        if (final / done_marker).exists():
            shutil.rmtree(tmp, ignore_errors=True)
            return
        raise


def is_complete(folder: Path) -> bool:
    """True when `folder` holds a finished build made by this module or `core.models.smollm`."""
    return any(folder.glob("forgetui-*.done"))
