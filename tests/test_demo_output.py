"""`forgetui demo` shows one progress display, its own (no tqdm bars, no log records unless -v), and a training step with signal."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest
from rich.console import Console

from core.models.quiet import _gguf_module, quiet_third_party
from forgetui.demo import prepare_models, quiet_logs, show_learning

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


def test_the_demo_logs_only_warnings_unless_verbose() -> None:
    root = logging.getLogger()
    before = root.level
    try:
        root.setLevel(logging.INFO)  # what the CLI sets up
        quiet_logs(verbose=True)
        assert logging.getLogger("core.train.loop").isEnabledFor(logging.INFO)
        quiet_logs(verbose=False)
        assert not logging.getLogger("core.train.loop").isEnabledFor(logging.INFO)  # the per-step metric dicts
        assert logging.getLogger("core.train.loop").isEnabledFor(logging.WARNING)
    finally:
        root.setLevel(before)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_the_demos_training_takes_a_step_with_signal_in_one_line_per_stage(docker_client, base_image, tmp_path, monkeypatch, caplog) -> None:
    """Base → SFT on the half-wrong teacher → one GRPO step: the step trains (some rollouts pass, some fail)."""
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    root = logging.getLogger()
    before = root.level
    try:
        quiet_logs(verbose=False)
        ours = io.StringIO()
        result = show_learning(Console(file=ours, width=400))
    finally:
        root.setLevel(before)
    text = ours.getvalue()
    (step,) = result["grpo_steps"]
    assert 0 < step["samples_trained"] <= step["samples"], step  # a group with passing and failing rollouts
    assert 0.0 < step["reward_mean"] < 1.0
    rates = [s["splits"]["train"]["pass_rate"] for s in result["stages"]]
    assert rates[0] == 0.0 and 0.0 < rates[1] < 1.0, rates  # the base model fails; SFT imitates both answers
    lines = [line for line in text.splitlines() if line.startswith("  ")]
    assert [line.split(":")[0].strip() for line in lines] == [
        "base · train", "teacher", "teacher-mistakes", "SFT", "sft · train", "GRPO step 0", "grpo · train"]
    assert "{'" not in text and "INFO" not in text  # no raw metric dicts, no log records
    assert not [r for r in caplog.records if r.levelno < logging.WARNING]
