"""`forgetui replay`: re-run one recorded rollout in a fresh sandbox against its own recorded answers.

The harness runs the same task again; the replay backend answers call k with the recorded completion k
(same token ids and logprobs). The first divergence is reported: call k's prompt differs from the
recorded one (token position and both sides decoded around it), the harness made more or fewer calls,
or the verifier's score changed. Differences the harness itself makes on every run (a random chunk id,
a wall time, today's date) are listed per harness in `VOLATILE` and reported apart, as volatile.
Replaying under another harness version (`harness.version`) checks that an upgrade preserves behaviour.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.backends.replay import Recording, ReplayBackend, ServedCall, load_recording, replay_backend
from core.config import RunConfig
from core.errors import ConfigError, SandboxError
from core.proxy.factory import token_policy
from core.registry import load_harness
from core.session import RunSession
from core.status import RunStatus

log = logging.getLogger(__name__)

WINDOW = 24  # tokens shown on each side of a prompt difference
# Text a harness writes differently on every run (it never comes from the model): masked before prompts are
# compared a second time, so a difference only there is reported as volatile, not as a divergence.
VOLATILE: dict[str, list[str]] = {
    "codex": [r"Chunk ID: [0-9a-f]+", r"Wall time: [0-9.]+ seconds", r"<current_date>[^<]*</current_date>", r"session_id[\"': =]+[0-9a-f-]+"],
    "claude-code": [r"Today's date is [0-9-]+"],
    "gemini-cli": [r"Today's date is [^.\n]*", r"Process Group PGID: [0-9]+"],  # the shell tool's process group
    # its session key (agent:main:explicit:<uuid>) is new on every run, and its runtime line names the host (the container's id)
    "openclaw": [r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9:.]+Z?", r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r"host=[^ |]+"],
    "opencode": [r"Today's date: [^\n]*"],
}


@dataclass
class Divergence:
    kind: str  # prompt | extra_calls | missing_calls | score
    call: int | None
    detail: str
    position: int | None = None
    recorded: str | None = None  # decoded tokens around the difference, as recorded
    replayed: str | None = None  # ... and as replayed


@dataclass
class ReplayReport:
    rollout_id: str
    replay_run_id: str
    replay_rollout_id: str
    diverged: bool
    first: Divergence | None
    divergences: list[Divergence] = field(default_factory=list)
    volatile_calls: list[int] = field(default_factory=list)  # calls whose prompts differ only in VOLATILE text
    recorded_calls: int = 0
    replayed_calls: int = 0
    recorded_score: float | None = None
    replayed_score: float | None = None
    changed: dict[str, list[Any]] = field(default_factory=dict)  # harness_version, image_digest, task_hash: [recorded, now]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def _masked(text: str, harness: str) -> str:
    for pattern in VOLATILE.get(harness, []):
        text = re.sub(pattern, "<volatile>", text)
    return text


def prompt_divergence(served: ServedCall, tokenizer: Any, harness: str) -> Divergence | None:
    """The divergence of one served call's prompt, or None when it only differs in the harness's volatile text."""
    rec = served.recorded
    assert rec is not None and rec.prompt_ids is not None and served.first_difference is not None
    if _masked(_decode(tokenizer, rec.prompt_ids), harness) == _masked(_decode(tokenizer, served.prompt_ids), harness):
        return None
    p = served.first_difference
    lo = max(0, p - WINDOW)
    return Divergence(
        "prompt",
        served.index,
        f"call {served.index}'s prompt differs from the recording at token {p} "
        f"(recorded {len(rec.prompt_ids)} tokens, replayed {len(served.prompt_ids)})",
        position=p,
        recorded=_decode(tokenizer, rec.prompt_ids[lo : p + WINDOW]),
        replayed=_decode(tokenizer, served.prompt_ids[lo : p + WINDOW]),
    )


def divergences(backend: ReplayBackend, harness: str, recorded_score: float | None, replayed_score: float | None) -> tuple[list[Divergence], list[int]]:
    """Every divergence in timeline order (prompts, then call counts, then the score) and the volatile-only calls."""
    out: list[Divergence] = []
    volatile: list[int] = []
    for served in backend.served:
        if served.first_difference is None:
            continue
        found = prompt_divergence(served, backend.tokenizer, harness)
        if found is None:
            volatile.append(served.index)
        else:
            out.append(found)
    n_rec, n_new = len(backend.recorded), len(backend.served)
    if n_new > n_rec:
        out.append(Divergence("extra_calls", n_rec, f"the harness made {n_new} calls, {n_new - n_rec} more than the {n_rec} recorded (from call {n_rec} on)"))
    elif n_new < n_rec:
        out.append(Divergence("missing_calls", n_new, f"the harness made {n_new} calls where {n_rec} were recorded (call {n_new} never came)"))
    if recorded_score != replayed_score:
        out.append(Divergence("score", None, f"the verifier scored {replayed_score} where the recording scored {recorded_score}"))
    return out, volatile


def replay_config(recording: Recording, image: str | None = None, harness_version: str | None = None) -> Any:
    """The recorded run's config narrowed to this rollout's task, one sample, no retries, no training.

    `harness_version` installs that release of the harness (`harness.version`) instead of the recorded run's.
    """
    data = json.loads(json.dumps(recording.config))
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"the recorded run's config no longer loads in this forgetui: {exc}") from exc
    config.env.tasks = [recording.rollout["task_id"]]
    config.env.limit = None
    config.run.n_samples = 1
    config.run.max_retries = 0
    config.train.steps = 0
    config.policy.backend = f"replay:{recording.rollout['rollout_id']}"
    if image:
        config.runtime.base_image = image
    if harness_version is not None:
        config.harness.version = harness_version
    return config


async def replay_rollout(rollout_id: str, *, store: Path | None = None, image: str | None = None, harness_version: str | None = None) -> ReplayReport:
    """Re-run a recorded rollout against its recorded answers (under `harness_version`, if given) and report how the new run differs."""
    recording = load_recording(rollout_id, store)
    row = recording.rollout
    config = replay_config(recording, image, harness_version)
    if harness_version is not None:  # install it first: a version refused or missing from the registry fails before a replay run is made
        load_harness(config.harness.name, **config.harness.adapter_options()).install_layer()
    backend = replay_backend(recording)
    policy = token_policy(backend, config.policy.spec, parser=config.policy.parser, default_max_tokens=config.policy.max_tokens)
    async with RunSession(config, policy=policy) as session:
        task = next((t for t in session.tasks() if t.id == row["task_id"]), None)
        if task is None:
            raise ConfigError(f"task {row['task_id']!r} is no longer in env {row['env']!r}")
        items, _ = session.plan([task])
        await session.run_rollouts(items)
        session.finish(RunStatus.DONE)
        assert session.store is not None
        session.store.flush()
        cur = session.store.cursor().execute(
            "SELECT rollout_id, reward, status, error, harness_version, image_digest, task_hash FROM rollouts WHERE rollout_id = ?", [items[0].rollout_id]
        )
        new_id, new_score, status, error, *now = cur.fetchone()
        cur.close()
        run_id = session.run_id
    if status == "infra_error":  # the sandbox, not the harness, failed: there is no replay to compare
        raise SandboxError(f"the replay's sandbox failed ({error}); nothing was compared: fix that and replay again")
    found, volatile = divergences(backend, row["harness"], row["reward"], new_score)
    changed = {
        key: [row[key], value]
        for key, value in zip(("harness_version", "image_digest", "task_hash"), now, strict=True)
        if row[key] != value
    }
    return ReplayReport(
        rollout_id=rollout_id,
        replay_run_id=run_id,
        replay_rollout_id=new_id,
        diverged=bool(found),
        first=found[0] if found else None,
        divergences=found,
        volatile_calls=volatile,
        recorded_calls=len(recording.calls),
        replayed_calls=len(backend.served),
        recorded_score=row["reward"],
        replayed_score=new_score,
        changed=changed,
    )
