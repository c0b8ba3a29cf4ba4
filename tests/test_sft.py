"""SFT from teacher trajectories and `forgetui export`, on runs recorded for real: the react harness in Docker on the toy `hello` task.

Two teachers: a scripted policy (token backend, the student's tokenizer: token-exact samples) and a
passthrough `litellm:` backend talking to a fake OpenAI-compatible upstream on loopback (text only:
the student re-tokenizes). The student is `builtin:tiny`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from core.chat import ChatRequest, Completion, ToolCall
from core.config import RunConfig, load_config
from core.errors import ConfigError, TrainingDataError
from core.protocols.registry import get_protocol
from core.proxy.server import BackgroundServer
from core.serving import read_body
from core.train.sft import answer_message, same_tokenizer, teacher_tokenizer_name

SCRIPT = [{"tool": "shell", "command": "echo hi > hello.txt"}, {"text": "Done."}]
VERL_COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name"}


def cfg(**sets: Any) -> RunConfig:
    return load_config(
        None, [f"{k}={json.dumps(v) if isinstance(v, str | list) else v}" for k, v in sets.items()]
    )


def teacher_config(backend: str) -> RunConfig:
    return cfg(**{
        "env.name": "toy", "env.tasks": ["hello"], "harness.name": "react", "policy.backend": backend, "runtime.kind": "docker",
        "run.n_samples": 2, "run.concurrency": 2, "run.max_retries": 0, "run.timeout_s": 120,
    })  # fmt: skip


def sft_config(from_runs: list[str], **sets: Any) -> RunConfig:
    base = {"policy.backend": "builtin:tiny", "train.trainer": "sft", "train.from_runs": from_runs, "train.epochs": 4, "train.lr": 1e-3,
            "train.micro_batch_size": 1, "train.seed": 0}  # fmt: skip
    return cfg(**{**base, **sets})


def rows(store: str | Path, sql: str, params: list[Any] | None = None) -> list[tuple]:
    with duckdb.connect(str(store), read_only=True) as con:
        return con.execute(sql, params or []).fetchall()


def sequence_logprobs(model: str | Path, samples: list[Any]) -> list[float]:
    """Summed logprob of each sample's loss-mask-1 tokens under `model`."""
    from core.train.local import LocalTrainer

    trainer = LocalTrainer(model)
    return [
        sum(lp for lp, m in zip(lps, s.loss_mask, strict=True) if m)
        for lps, s in zip(trainer.logprobs(samples), samples, strict=True)
    ]


def run(config: RunConfig, **kwargs: Any) -> Any:
    from core.run import execute_run

    return asyncio.run(execute_run(config, **kwargs))


# ----------------------------------------------------------------------------- a text-only teacher upstream
class TeacherUpstream:
    """A fake OpenAI-compatible server that solves `hello` like the script: a bash call, then "Done." (SSE, text only)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.url = ""

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        req = orjson.loads(await read_body(scope, receive, 1 << 30))
        self.requests.append(req)
        if any(m.get("role") == "tool" for m in req["messages"]):
            delta: dict[str, Any] = {"role": "assistant", "content": "Done."}
            finish = "stop"
        else:
            call = {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": "echo hi > hello.txt"})},
            }
            delta, finish = {"role": "assistant", "content": "", "tool_calls": [call]}, "tool_calls"
        chunks = [
            {"index": 0, "delta": delta, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": finish},
        ]
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for choice in chunks:
            event = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "teacher",
                "choices": [choice],
            }
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + orjson.dumps(event) + b"\n\n",
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


# ----------------------------------------------------------------------------- recorded teacher runs (once per module)
@pytest.fixture(scope="module")
def scripted_teacher(docker_client, base_image, tmp_path_factory) -> Any:
    from core.run import execute_run

    script = tmp_path_factory.mktemp("teacher") / "script.json"
    script.write_text(json.dumps({"turns": SCRIPT}))
    summary = asyncio.run(execute_run(teacher_config(f"scripted:{script}")))
    assert summary.rollouts == 2 and summary.passed == 2, summary
    return summary


@pytest.fixture(scope="module")
def passthrough_teacher(docker_client, base_image) -> Any:
    from core.run import execute_run

    app = TeacherUpstream()
    with BackgroundServer(app) as server:
        app.url = server.url
        summary = asyncio.run(
            execute_run(teacher_config(f"litellm:openai/teacher?api_base={server.url}/v1&api_key=sk-test"))
        )
    assert summary.rollouts == 2 and summary.passed == 2, summary
    assert len(app.requests) == 4
    return summary


def teacher_samples(store: str, run_id: str) -> list[Any]:
    from core.train.samples import samples_for_run

    with duckdb.connect(store, read_only=True) as con:
        return samples_for_run(con, run_id)


# ----------------------------------------------------------------------------- SFT
@pytest.mark.docker
def test_sft_on_a_scripted_teacher_learns_its_answers(scripted_teacher) -> None:
    from core.backends.spec import PolicySpec, build_token_backend

    teacher = teacher_samples(scripted_teacher.store, scripted_teacher.run_id)
    summary = run(sft_config([scripted_teacher.run_id]))
    assert summary.rollouts == 0
    extra = summary.extra
    assert [t["path"] for t in extra["teachers"]] == ["token-exact"]
    assert (
        extra["examples"] == 2
        and extra["train_steps"] == 8
        and extra["tokens"] == sum(s.trainable_tokens for s in teacher)
    )

    steps = rows(
        summary.store,
        "SELECT step, loss, metrics FROM train_steps WHERE run_id = ? ORDER BY step",
        [summary.run_id],
    )
    assert [s[0] for s in steps] == list(range(8))
    metrics = [json.loads(m) for _, _, m in steps]
    assert all({"tokens", "lr", "grad_norm", "epoch", "examples"} <= m.keys() for m in metrics)
    assert [m["epoch"] for m in metrics] == [0, 0, 1, 1, 2, 2, 3, 3] and all(
        m["examples"] == 1 and m["lr"] == 1e-3 for m in metrics
    )
    losses = [loss for _, loss, _ in steps]
    epoch_loss = [sum(losses[i : i + 2]) / 2 for i in range(0, 8, 2)]
    # measured: 8.25, 7.91, 7.65, 7.38 (random tiny model, 4 epochs at lr 1e-3)
    assert (
        all(b < a for a, b in zip(epoch_loss, epoch_loss[1:], strict=False))
        and epoch_loss[-1] < epoch_loss[0] - 0.5
    ), epoch_loss
    assert extra["final_loss"] == losses[-1]

    # the examples are the teacher's recorded samples, token for token
    stored = rows(
        summary.store,
        "SELECT rollout_id, token_ids, loss_mask, advantage FROM samples WHERE run_id = ? ORDER BY rollout_id",
        [summary.run_id],
    )
    assert [(r, list(t), list(m)) for r, t, m, _ in stored] == [
        (s.rollout_id, list(s.token_ids), list(s.loss_mask)) for s in sorted(teacher, key=lambda s: s.rollout_id)
    ]
    assert {a for *_, a in stored} == {1.0}

    # the checkpoint is a builtin:PATH model, and the teacher's answers are likelier under it
    checkpoint = Path(extra["checkpoint"])
    assert checkpoint == Path(summary.store).parent / "checkpoints" / "step-00007"
    backend = build_token_backend(PolicySpec.parse(f"builtin:{checkpoint}"))
    assert backend.tokenizer is not None
    before, after = sequence_logprobs("tiny", teacher), sequence_logprobs(checkpoint, teacher)
    assert all(a > b + 1.0 for a, b in zip(after, before, strict=True)), (before, after)


@pytest.mark.docker
def test_sft_with_lora_merges_into_a_loadable_checkpoint(scripted_teacher) -> None:
    teacher = teacher_samples(scripted_teacher.store, scripted_teacher.run_id)
    summary = run(
        sft_config([scripted_teacher.run_id], **{"train.lora_rank": 8, "train.epochs": 3, "train.lr": 1e-2})
    )
    losses = [r[0] for r in rows(summary.store, "SELECT loss FROM train_steps ORDER BY step")]
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    before, after = (
        sequence_logprobs("tiny", teacher),
        sequence_logprobs(summary.extra["checkpoint"], teacher),
    )
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


@pytest.mark.docker
def test_retokenizing_a_token_exact_run_gives_the_recorded_tokens(scripted_teacher) -> None:
    """The re-tokenize path, checked against ground truth: the scripted teacher sampled on the same template."""
    from core.models.resolve import load_tokenizer, resolve_model
    from core.train.sft import passing_rollouts, retokenized_samples

    teacher = {s.rollout_id: s for s in teacher_samples(scripted_teacher.store, scripted_teacher.run_id)}
    with duckdb.connect(scripted_teacher.store, read_only=True) as con:
        passing = passing_rollouts(con, scripted_teacher.run_id, 1.0)
        rebuilt = retokenized_samples(
            con, scripted_teacher.run_id, passing, load_tokenizer(resolve_model("tiny"))
        )
    assert sorted(passing) == sorted(teacher) and len(rebuilt) == 2
    for sample in rebuilt:
        recorded = teacher[sample.rollout_id]
        assert (
            sample.n_calls == 2
            and list(sample.token_ids) == list(recorded.token_ids)
            and list(sample.loss_mask) == list(recorded.loss_mask)
        )


@pytest.mark.docker
def test_sft_on_a_text_only_passthrough_teacher_retokenizes(passthrough_teacher) -> None:
    from core.models.resolve import load_tokenizer, resolve_model

    with pytest.raises(TrainingDataError):
        teacher_samples(passthrough_teacher.store, passthrough_teacher.run_id)  # no token ids recorded
    summary = run(sft_config([passthrough_teacher.run_id], **{"train.epochs": 3}))
    assert [t["path"] for t in summary.extra["teachers"]] == ["re-tokenized"] and summary.extra[
        "examples"
    ] == 2
    losses = [
        r[0]
        for r in rows(
            summary.store, "SELECT loss FROM train_steps WHERE run_id = ? ORDER BY step", [summary.run_id]
        )
    ]
    assert len(losses) == 6 and losses[-1] < losses[0] and losses[4] + losses[5] < losses[0] + losses[1], (
        losses
    )

    # loss mask 1 covers exactly the teacher's two answers, each through its end-of-turn token
    tok = load_tokenizer(resolve_model("tiny"))
    for token_ids, mask, starts, ends in rows(
        summary.store,
        "SELECT token_ids, loss_mask, completion_starts, completion_ends FROM samples WHERE run_id = ?",
        [summary.run_id],
    ):
        answers = [tok.decode(token_ids[a:b]) for a, b in zip(starts, ends, strict=True)]
        assert answers == [
            '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi > hello.txt"}}\n</tool_call><|im_end|>',
            "Done.<|im_end|>",
        ]
        assert sum(mask) == sum(b - a for a, b in zip(starts, ends, strict=True))
    student = sequence_logprobs("tiny", _stored_samples(summary))
    tuned = sequence_logprobs(summary.extra["checkpoint"], _stored_samples(summary))
    assert all(a > b for a, b in zip(tuned, student, strict=True))


def _stored_samples(summary: Any) -> list[Any]:
    from core.train.types import Sample

    cols = (
        "sample_id",
        "run_id",
        "rollout_id",
        "task_id",
        "branch",
        "step",
        "token_ids",
        "loss_mask",
        "logprobs",
        "prompt_tokens",
    )
    return [
        Sample(*[list(v) if isinstance(v, list) else v for v in r])
        for r in rows(
            summary.store, f"SELECT {', '.join(cols)} FROM samples WHERE run_id = ?", [summary.run_id]
        )
    ]


@pytest.mark.docker
def test_two_teachers_and_a_store_path_and_resume(scripted_teacher, passthrough_teacher) -> None:
    from core.paths import runs_dir

    first = run(
        sft_config(
            [scripted_teacher.run_id, passthrough_teacher.store],
            **{"train.epochs": 1, "train.micro_batch_size": 2},
        )
    )
    assert [t["path"] for t in first.extra["teachers"]] == ["token-exact", "re-tokenized"]
    assert first.extra["examples"] == 4 and first.extra["train_steps"] == 2
    # resume the run with one more epoch: it continues after the last checkpoint, rows are not duplicated
    more = sft_config(
        [scripted_teacher.run_id, passthrough_teacher.store],
        **{"train.epochs": 2, "train.micro_batch_size": 2},
    )
    again = run(more, resume=first.run_id)
    assert again.run_id == first.run_id and again.extra["train_steps"] == 4
    assert [r[0] for r in rows(again.store, "SELECT step FROM train_steps ORDER BY step")] == [0, 1, 2, 3]
    assert rows(again.store, "SELECT count(*) FROM samples")[0][0] == 4
    assert sorted(p.name for p in (runs_dir() / first.run_id / "checkpoints").iterdir()) == [
        "step-00001",
        "step-00003",
    ]
    # the same as a run straight through: weights, optimizer moments and the schedule came back
    straight = run(more)
    losses = "SELECT loss FROM train_steps ORDER BY step"
    assert [r[0] for r in rows(again.store, losses)] == pytest.approx(
        [r[0] for r in rows(straight.store, losses)], abs=1e-5
    )


@pytest.mark.docker
def test_sft_refuses_a_bar_no_rollout_reaches(scripted_teacher) -> None:
    from core.paths import runs_dir

    before = set(runs_dir().iterdir())
    with pytest.raises(ConfigError, match="min_reward"):
        run(sft_config([scripted_teacher.run_id], **{"train.min_reward": 1.5}))
    assert set(runs_dir().iterdir()) == before  # refused before any run folder or training


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ({"train.from_runs": []}, "needs train.from_runs"),
        ({"train.from_runs": ["20990101-000000-dead"]}, "no run '20990101-000000-dead'"),
        ({"policy.backend": "litellm:gpt-4o"}, "has no weights here"),
        ({"policy.backend": "scripted:/nonexistent.json"}, "has no weights here"),
    ],
)
def test_bad_sft_configs_are_refused_before_training(sets, message, tmp_path, monkeypatch) -> None:
    from core.run import execute_run
    from core.train.trainers import trainer_for

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    config = sft_config(["20990101-000000-dead"], **sets)
    with pytest.raises(ConfigError, match=message):
        run(config)
    if "from_runs" in message:
        with pytest.raises(ConfigError, match=message):
            trainer_for(config).check(config)  # what a run checks first
    config.train.steps = 1
    with pytest.raises(ConfigError, match=message):
        asyncio.run(execute_run(config))  # a run with train.steps > 0 dispatches to sft
    assert not list(tmp_path.glob("runs/*"))  # refused before any run folder


def test_a_store_that_is_not_a_forgetui_store_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    bogus = tmp_path / "other.duckdb"
    duckdb.connect(str(bogus)).close()
    with pytest.raises(ConfigError, match="not a forgetui store"):
        run(sft_config([str(bogus)]))


# ----------------------------------------------------------------------------- export
def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.docker
def test_export_jsonl_and_sft_of_the_scripted_teacher(scripted_teacher, tmp_path, capsys) -> None:
    from forgetui.cli import main

    teacher = {s.sample_id: s for s in teacher_samples(scripted_teacher.store, scripted_teacher.run_id)}
    assert (
        main(["export", scripted_teacher.run_id, "--format", "jsonl", "--out", str(tmp_path / "s.jsonl")])
        == 0
    )
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == {
        "format": "jsonl",
        "path": str(tmp_path / "s.jsonl"),
        "rows": 2,
        "run_id": scripted_teacher.run_id,
    }
    lines = read_jsonl(tmp_path / "s.jsonl")
    assert {line["sample_id"] for line in lines} == set(teacher)
    for line in lines:
        s = teacher[line["sample_id"]]
        assert (
            line["token_ids"],
            line["loss_mask"],
            line["reward"],
            line["advantage"],
            line["task_id"],
            line["rollout_id"],
        ) == (list(s.token_ids), list(s.loss_mask), 1.0, 0.0, "hello", s.rollout_id)
        assert line["logprobs"] == list(s.logprobs) and len(line["logprobs"]) == len(line["token_ids"])

    assert (
        main(["export", scripted_teacher.run_id, "--format", "sft", "--out", str(tmp_path / "c.jsonl")]) == 0
    )
    convs = read_jsonl(tmp_path / "c.jsonl")
    assert len(convs) == 2 and {c["rollout_id"] for c in convs} == {s.rollout_id for s in teacher.values()}
    for conv in convs:
        roles = [m["role"] for m in conv["messages"]]
        assert roles[:2] == ["system", "user"] and roles[-3:] == ["assistant", "tool", "assistant"]
        call = conv["messages"][-3]["tool_calls"][0]
        assert call["type"] == "function" and json.loads(call["function"]["arguments"]) == {
            "command": "echo hi > hello.txt"
        }
        assert conv["messages"][-1] == {"role": "assistant", "content": "Done."}
        assert {t["function"]["name"] for t in conv["tools"]} >= {"bash", "write_file"}
        sample = next(s for s in teacher.values() if s.rollout_id == conv["rollout_id"])
        assert conv["token_ids"] == list(sample.token_ids) and conv["loss_mask"] == list(sample.loss_mask)
    # nothing passes a bar above 1
    assert (
        main(
            [
                "export",
                scripted_teacher.run_id,
                "--format",
                "sft",
                "--out",
                str(tmp_path / "none.jsonl"),
                "--min-reward",
                "1.5",
            ]
        )
        == 0
    )
    assert (tmp_path / "none.jsonl").read_text() == ""


@pytest.mark.docker
def test_export_verl_parquet_reads_back_as_verls_rl_dataset(scripted_teacher, tmp_path) -> None:
    import pyarrow.parquet as pq

    from core.registry import load_env
    from core.train.export import export_run

    out = export_run(scripted_teacher.run_id, "verl", tmp_path / "train.parquet")
    assert out.rows == 1
    table = pq.read_table(out.path)
    assert set(table.column_names) == VERL_COLUMNS
    (row,) = table.to_pylist()
    hello = next(t for t in load_env("toy").tasks() if t.id == "hello")
    assert (
        row["prompt"] == [{"role": "user", "content": hello.instruction}]
        and row["data_source"] == "forgetui/toy"
    )
    assert (
        row["reward_model"] == {"style": "rule", "ground_truth": "hello"} and row["agent_name"] == "forgetui"
    )
    info = row["extra_info"]
    assert (info["index"], info["task_id"], info["env"], info["run_id"], info["harness"]) == (
        0,
        "hello",
        "toy",
        scripted_teacher.run_id,
        "react",
    )
    assert info["recorded_rollouts"] == 2 and info["recorded_mean_reward"] == 1.0

    # veRL's own RL dataset reads it: the prompt renders with a chat template, extra_info gives the index
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from core.models.resolve import load_tokenizer, resolve_model

    data = RLHFDataset(
        data_files=[out.path],
        tokenizer=load_tokenizer(resolve_model("tiny")),
        config=OmegaConf.create(
            {"max_prompt_length": 1024, "filter_overlong_prompts": False, "return_raw_chat": True}
        ),
    )
    assert len(data) == 1
    item = data[0]
    assert item["index"] == 0 and item["data_source"] == "forgetui/toy"
    assert item["raw_prompt"][0]["content"] == hello.instruction
    with pytest.raises(ConfigError, match="does not apply"):
        export_run(scripted_teacher.run_id, "verl", tmp_path / "x.parquet", min_reward=1.0)


@pytest.mark.docker
def test_export_of_a_text_only_run(passthrough_teacher, tmp_path) -> None:
    from core.train.export import export_run

    out = export_run(passthrough_teacher.store, "sft", tmp_path / "c.jsonl")
    convs = read_jsonl(out.path)
    assert out.rows == 2 and all("token_ids" not in c for c in convs)
    assert all(c["messages"][-1] == {"role": "assistant", "content": "Done."} for c in convs)
    assert all(c["messages"][-3]["tool_calls"][0]["function"]["name"] == "bash" for c in convs)
    with pytest.raises(TrainingDataError, match="--format sft"):
        export_run(passthrough_teacher.run_id, "jsonl", tmp_path / "s.jsonl")
    assert export_run(passthrough_teacher.run_id, "verl", tmp_path / "v.parquet").rows == 1


def test_export_bad_input(tmp_path, monkeypatch) -> None:
    from core.train.export import export_run
    from forgetui.cli import main

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="no run"):
        export_run("20990101-000000-dead", "sft")
    with pytest.raises(ConfigError, match="format"):
        export_run("20990101-000000-dead", "csv")
    assert main(["export", "20990101-000000-dead", "--format", "jsonl"]) == 2


# ----------------------------------------------------------------------------- pieces
@pytest.mark.parametrize("api", ["chat", "responses", "messages", "gemini"])
@pytest.mark.parametrize(
    "completion",
    [
        Completion(text="Hello there"),
        Completion(
            text="Let me look.",
            tool_calls=[ToolCall("call_1", "bash", '{"command": "ls"}')],
            finish_reason="tool_calls",
        ),
        Completion(
            text="",
            tool_calls=[
                ToolCall("call_1", "bash", '{"command": "ls"}'),
                ToolCall("call_2", "read_file", '{"path": "a"}'),
            ],
            finish_reason="tool_calls",
        ),
    ],
)
def test_the_answer_is_rebuilt_from_each_protocols_response(api, completion) -> None:
    request = ChatRequest(api=api, model="m", messages=[{"role": "user", "content": "hi"}])
    body = get_protocol(api).render_response(request, completion, "resp_abc")
    answer = answer_message(api, json.dumps(body))
    assert answer["role"] == "assistant" and answer["content"] == completion.text
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in answer.get("tool_calls", [])
    ]
    assert calls == [(tc.name, json.loads(tc.arguments)) for tc in completion.tool_calls]


def test_which_tokenizer_a_teacher_used() -> None:
    from core.models.resolve import load_tokenizer, resolve_model

    assert teacher_tokenizer_name({"policy": {"backend": "scripted:/x.json"}}) == "tiny"
    assert (
        teacher_tokenizer_name({"policy": {"backend": "scripted:/x.json?tokenizer=smollm2-135m"}})
        == "smollm2-135m"
    )
    assert teacher_tokenizer_name({"policy": {"backend": "builtin:/models/m"}}) == "/models/m"
    assert (
        teacher_tokenizer_name({"policy": {"backend": "vllm:http://h:8000", "tokenizer": "qwen"}}) == "qwen"
    )
    assert teacher_tokenizer_name({"policy": {"backend": "litellm:anthropic/claude"}}) is None
    tiny = load_tokenizer(resolve_model("tiny"))
    assert same_tokenizer("tiny", tiny, "tiny") and same_tokenizer(str(resolve_model("tiny")), tiny, "tiny")
    assert not same_tokenizer(None, tiny, "tiny")
    assert not same_tokenizer("smollm2-135m", tiny, "tiny")
