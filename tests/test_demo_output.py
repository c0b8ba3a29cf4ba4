"""`forgetui demo` shows one progress display, its own: no tqdm bars from transformers, huggingface_hub or gguf."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from core.models.quiet import _gguf_module, quiet_third_party
from forgetui.demo import prepare_models

# what a tqdm bar leaves in captured output: "Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 3.1it/s]"
TQDM_BAR = re.compile(r"\d+%\|.*\|\s*\d+/\d+ \[|\d+/\d+ \[\d\d:\d\d<|it/s\]|s/it\]")
OLD_DEMO_LINE = "\rWriting model shards: 100%|██████████| 1/1 [00:00<00:00, 29.61it/s]"


def test_the_bar_pattern_finds_what_the_demo_used_to_print() -> None:
    assert TQDM_BAR.search(OLD_DEMO_LINE)
    assert not TQDM_BAR.search("✓ tiny model built in 3 s\nrollouts ━━━━━━━━ 2/2 passed=2 0:00:00")


def test_building_the_tiny_model_shows_only_our_own_line(tmp_path: Path, monkeypatch, capfd) -> None:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))  # empty: the model is built here, not reused
    ours = io.StringIO()
    prepare_models(Console(file=ours, width=100), "builtin:tiny")
    out, err = capfd.readouterr()
    assert (tmp_path / "home" / "models" / "tiny-v1" / "config.json").exists()
    assert "tiny model built in" in ours.getvalue()
    assert not TQDM_BAR.search(out + err + ours.getvalue()), out + err


def test_quiet_block_silences_the_gguf_loaders_plain_tqdm_and_restores_it(capfd) -> None:
    gguf = _gguf_module()
    before = gguf.tqdm
    with quiet_third_party():
        for _ in gguf.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
    assert gguf.tqdm is before
    out, err = capfd.readouterr()
    assert "de-quantizing" not in out + err
