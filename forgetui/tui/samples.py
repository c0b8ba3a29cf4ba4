"""A rollout's token view data: its stored samples, the policy's tokenizer (local models only) and the sandbox log."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from forgetui.tui.rows import SampleView

log = logging.getLogger(__name__)


def stored_samples(rows: list[dict[str, Any]]) -> list[SampleView]:
    """`samples` rows as the token view shows them."""
    return [
        SampleView(sample_id=str(s["sample_id"]), branch=int(s["branch"] or 0), token_ids=list(s["token_ids"] or []),
                   loss_mask=[int(m) for m in s["loss_mask"] or []],
                   logprobs=[float(x) if x is not None else math.nan for x in s["logprobs"] or []],
                   call_ids=list(s["call_ids"] or []), completion_starts=list(s["completion_starts"] or []),
                   completion_ends=list(s["completion_ends"] or []), reward=s["reward"], advantage=s["advantage"])
        for s in rows
    ]


def tokenizer_for(config: dict[str, Any]) -> Any | None:
    """The policy's tokenizer when it is a local or built-in model (never a hub download); None otherwise."""
    from core.models.resolve import BUILTIN_MODELS, load_tokenizer, resolve_model
    from core.train.sft import teacher_tokenizer_name

    name = teacher_tokenizer_name(config)
    if not name:
        return None
    if name not in BUILTIN_MODELS and not Path(name).expanduser().is_dir():
        return None
    try:
        folder = Path(resolve_model(name))
        if (folder / "tokenizer.json").exists():
            # the Rust tokenizer alone: importing transformers' tokenizer classes holds the GIL ~150 ms,
            # a visible freeze of the screen the first time a rollout opens; decoding needs nothing more
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(folder / "tokenizer.json"))
        return load_tokenizer(folder)
    except Exception:  # noqa: BLE001 - no tokenizer means ids without text, not a broken screen
        log.info("no tokenizer for %s: token ids are shown undecoded", name, exc_info=True)
        return None


def decode_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's own text (special tokens kept, so a template's markers show)."""
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def rollout_log(run_dir: Path, rollout: dict[str, Any]) -> str | None:
    """The sandbox's saved log of the rollout's last attempt (runs/<id>/logs/<task>.<sample>[.sN].attemptN.log)."""
    step = f".s{rollout['step']}" if rollout.get("step") else ""
    stem = f"{rollout.get('task_id')}.{rollout.get('sample_index')}{step}.attempt"

    def attempt_no(path: Path) -> int:  # numerically: attempt10 comes after attempt2
        digits = path.name[len(stem) : -len(".log")]
        return int(digits) if digits.isdigit() else -1

    found = sorted((run_dir / "logs").glob(f"{stem}*.log"), key=attempt_no)
    if not found:
        return None
    try:
        return found[-1].read_text(errors="replace")[-20_000:]
    except OSError:
        return None
