"""Deterministic replay: recorded rollouts of every harness that runs in Docker reproduce with no divergence (also
on another base image); a changed task file is reported at the call whose prompt first carries it; the backend's
own bookkeeping."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import duckdb
import pytest

from core.backends.base import GenerationContext, SamplingParams
from core.backends.replay import RecordedCall, ReplayBackend, first_difference
from core.chat import ChatRequest
from core.models.resolve import load_tokenizer, resolve_model
from core.run.replay import VOLATILE, divergences, replay_rollout
from envs.harbor import EXAMPLES
from forgetui.analyze import EXIT_DIVERGED
from forgetui.cli import main
from tests.analytics_runs import FAIL_FIX_VERIFY, run_scripted


def served(backend: ReplayBackend, prompt: list[int], session: str = "s") -> list[int]:
    async def go() -> list[int]:
        ctx = GenerationContext(session=session, call_seq=0, request=ChatRequest(api="chat", model="m", messages=[]))
        out: list[int] = []
        async for chunk in backend.generate(prompt, SamplingParams(max_tokens=8), ctx):
            out += chunk.token_ids
            assert len(chunk.logprobs) == len(chunk.token_ids)
        return out

    return asyncio.run(go())


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("tiny"))


def test_backend_answers_call_k_with_recording_k_and_notes_every_difference(tokenizer):
    rec = [RecordedCall(0, "a", [1, 2, 3], [7, 8], [-0.5, -0.25], "stop"), RecordedCall(1, "b", [1, 2, 3, 7, 8, 9], [10], [-1.0])]
    backend = ReplayBackend(rec, tokenizer)
    assert served(backend, [1, 2, 3]) == [7, 8]
    assert served(backend, [1, 2, 3, 7, 8, 4, 5]) == [10]
    assert served(backend, [1]) == [tokenizer.eos_token_id]  # past the recording: end the turn
    assert [s.first_difference for s in backend.served] == [None, 5, None]
    found, volatile = divergences(backend, "react", 1.0, 0.0)
    assert [(d.kind, d.call) for d in found] == [("prompt", 1), ("extra_calls", 2), ("score", None)]
    assert found[0].position == 5 and volatile == []
    assert first_difference([1, 2], [1, 2, 3]) == 2 and first_difference([4], [5]) == 0


def test_fewer_calls_and_volatile_text(tokenizer):
    ids = tokenizer("Chunk ID: ab12\nhi", add_special_tokens=False)["input_ids"]
    other = tokenizer("Chunk ID: ff99\nhi", add_special_tokens=False)["input_ids"]
    backend = ReplayBackend([RecordedCall(0, "a", ids, [1], [0.0]), RecordedCall(1, "b", None, [2], [0.0])], tokenizer)
    served(backend, other)
    found, volatile = divergences(backend, "codex", 0.5, 0.5)
    assert "Chunk ID" in VOLATILE["codex"][0] and volatile == [0]  # codex prints a random chunk id: not a divergence
    assert [(d.kind, d.call) for d in found] == [("missing_calls", 1)]
    found, _ = divergences(backend, "react", 0.5, 0.5)  # react prints no such thing: a real divergence there
    assert found[0].kind == "prompt" and "ab12" in found[0].recorded and "ff99" in found[0].replayed


def calls_of(store: str, rollout_id: str) -> list[tuple]:
    con = duckdb.connect(store, read_only=True)
    try:
        return con.execute("SELECT seq, token_ids(completion_token_ids), completion_logprobs FROM calls WHERE rollout_id = ? ORDER BY seq", [rollout_id]).fetchall()
    finally:
        con.close()


# every harness that runs in Docker here; those whose image build is slow (a large npm install) run with the slow tests
REPLAYED = ["react", "codex", "claude-code", "mini-swe-agent", *(pytest.param(h, marks=pytest.mark.slow) for h in ("gemini-cli", "opencode", "pi", "openclaw"))]


@pytest.mark.docker
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("harness", REPLAYED)
def test_recorded_rollout_replays_without_divergence(docker_client, base_image, tmp_path, harness):
    # mini-swe-agent ends when the model runs its submit command, not on a text answer
    script = FAIL_FIX_VERIFY[:3] + [{"tool": "shell", "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}] if harness == "mini-swe-agent" else FAIL_FIX_VERIFY
    summary = run_scripted(harness, script, tmp_path, tasks=["hello"])
    rollout_id = f"{summary.run_id}/hello/0"
    report = asyncio.run(replay_rollout(rollout_id))
    assert report.divergences == [] and not report.diverged and report.first is None, report.to_json()
    assert report.recorded_calls == report.replayed_calls >= 4  # some harnesses add calls of their own (a title)
    assert report.recorded_score == report.replayed_score == 1.0 and report.changed == {}
    replay_store = str(Path(summary.store).parent.parent / report.replay_run_id / "store.duckdb")
    recorded, replayed = calls_of(summary.store, rollout_id), calls_of(replay_store, report.replay_rollout_id)
    assert recorded == replayed  # token-exact: the same completion ids and logprobs, call for call


@pytest.mark.docker
@pytest.mark.timeout(1500)
def test_replay_on_another_base_image_reports_the_image_it_ran_in(docker_client, base_image, tmp_path, capsys):
    """`--image TAG`: the rollout replays on a rebuilt base (here the same bytes under a new tag), token for token."""
    summary = run_scripted("react", FAIL_FIX_VERIFY, tmp_path, tasks=["hello"])
    rollout_id = f"{summary.run_id}/hello/0"
    rebuilt = f"forgetui/base:replay-{tmp_path.name[-8:].lower().replace('_', '-')}"
    docker_client.images.get(base_image).tag(rebuilt)
    try:
        assert main(["replay", rollout_id, "--image", rebuilt, "--format", "json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert not report["diverged"] and report["recorded_calls"] == report["replayed_calls"] == 4
        was, now = report["changed"]["image_digest"]
        assert was.split("@")[0] != now.split("@")[0]  # the sandbox image was built on the other base
        replay_store = Path(summary.store).parent.parent / report["replay_run_id"] / "store.duckdb"
        con = duckdb.connect(str(replay_store), read_only=True)
        try:
            (config,) = con.execute("SELECT config->>'$.runtime.base_image' FROM runs").fetchone()
        finally:
            con.close()
        assert config == rebuilt
    finally:
        docker_client.images.remove(rebuilt)


HARBOR_SCRIPT = [
    {"tool": "shell", "command": "cat /app/log.txt"},
    {"tool": "shell", "command": "grep -cw harbor /app/log.txt > /app/count.txt"},
    {"text": "count.txt holds the count."},
]


@pytest.mark.docker
@pytest.mark.timeout(1500)
def test_changed_task_file_diverges_at_the_call_that_reads_it(docker_client, base_image, tmp_path, capsys):
    tasks = tmp_path / "tasks"
    shutil.copytree(EXAMPLES / "count-harbor", tasks / "count-harbor")
    summary = run_scripted("react", HARBOR_SCRIPT, tmp_path, env="harbor", tasks=["count-harbor"], extra=[f'env.path="{tasks}"'])
    rollout_id = f"{summary.run_id}/count-harbor/0"
    log = tasks / "count-harbor" / "environment" / "log.txt"
    log.write_text(log.read_text() + "a new harbor line\n")
    assert main(["replay", rollout_id, "--format", "json"]) == EXIT_DIVERGED
    report = json.loads(capsys.readouterr().out)
    first = report["first"]
    assert first["kind"] == "prompt" and first["call"] == 1  # call 0 is the same; call 1 carries cat's output
    assert "a new harbor line" in first["replayed"] and "a new harbor line" not in first["recorded"]
    assert "task_hash" in report["changed"] and report["recorded_calls"] == report["replayed_calls"] == 3
    assert report["recorded_score"] == report["replayed_score"] == 1.0  # grep counts the new line too: same score
    assert main(["replay", rollout_id]) == EXIT_DIVERGED
    assert "FIRST DIVERGENCE (prompt): call 1's prompt" in capsys.readouterr().out


def test_what_replay_refuses(tmp_path):
    from core.backends.replay import Recording, load_recording, tokenizer_name
    from core.config import RunConfig
    from core.errors import ConfigError
    from core.registry import load_harness
    from core.run.replay import replay_config
    from core.store.writer import Store

    with pytest.raises(ConfigError, match="passthrough"):
        tokenizer_name({"backend": "litellm:openai/gpt-4o"})
    assert tokenizer_name({"backend": "builtin:smollm2-135m"}) == "smollm2-135m"
    assert tokenizer_name({"backend": "scripted:/x.json?tokenizer=smollm2-135m"}) == "smollm2-135m"
    assert tokenizer_name({"backend": "vllm:http://127.0.0.1:1", "tokenizer": "/models/q"}) == "/models/q"
    recorded = {"rollout_id": "r/hello/0", "task_id": "hello"}
    for name, ok in (("mini-swe-agent", True), ("react", False)):  # --harness-version reaches the harness, which may refuse it
        config = replay_config(Recording(tmp_path, recorded, RunConfig.model_validate({"harness": {"name": name}}).model_dump(), []), None, "2.4.5")
        assert config.harness.version == "2.4.5" and config.policy.backend == "replay:r/hello/0"
        if ok:
            assert load_harness(name, **config.harness.adapter_options()).version == "2.4.5"
        else:
            with pytest.raises(ConfigError, match="the react harness has no installable version"):
                load_harness(name, **config.harness.adapter_options())
    store = Store.open(tmp_path / "s.duckdb")
    store.insert_run("r", {})
    store.close()
    with pytest.raises(ConfigError, match="no rollout 'r/x/0'"):
        load_recording("r/x/0", tmp_path / "s.duckdb")


@pytest.mark.parametrize(("fixture", "today", "other"), [
    ("claude-code", "2026-11-30", "2027-01-02"), ("gemini-cli", "Monday, November 30, 2026", "Tuesday, January 2, 2027"),
    ("opencode", "Mon Nov 30 2026", "Sat Jan 02 2027"),
])  # fmt: skip
def test_volatile_text_covers_the_date_each_harness_writes(fixture, today, other):
    from core.run.replay import _masked
    from tests.conftest import harness_requests

    text = next(json.dumps(r.get("body")) for name, r in harness_requests() if name == fixture and today in json.dumps(r.get("body")))
    assert _masked(text, fixture) == _masked(text.replace(today, other), fixture)
    assert _masked(text, fixture) != _masked(text.replace("You", "Yu"), fixture)  # nothing else is masked away
