"""A vLLM policy trains LoRA adapters: serve-model's dynamic LoRA routes (vLLM's shapes), lora_push, the trainer end to end."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import duckdb
import httpx
import pytest

import tests.loopback as loopback
from core.backends.base import GenerationContext, SamplingParams
from core.backends.builtin import BuiltinBackend
from core.backends.vllm import VllmBackend
from core.chat import ChatRequest
from core.errors import ConfigError
from core.models.tiny import ensure_tiny_model
from core.proxy.model_server import build_model_app
from core.run import execute_run
from core.train import lora_push
from core.train.local import LocalTrainer
from core.train.loop import check_trainable, load_for_training
from tests.test_train_loop import coin_config

PROMPT = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def builtin(tiny_dir: Path) -> Iterator[BuiltinBackend]:
    backend = BuiltinBackend(str(tiny_dir))
    yield backend
    asyncio.run(backend.aclose())


@asynccontextmanager
async def serving(app):
    """`app` on a loopback port; its adapters are closed after."""
    async with loopback.serving(app) as url:
        try:
            yield url
        finally:
            await app.state.adapters.aclose()


def trained(tiny_dir: Path, seed: int) -> LocalTrainer:
    """A LoRA trainer whose adapter is not the identity (lora_B drawn at random, as after some updates)."""
    import torch

    trainer = LocalTrainer(str(tiny_dir), lora_rank=8, seed=seed)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    trainer.updates = 1
    return trainer


def peft_logprobs(trainer: LocalTrainer, prompt: list[int], ids: list[int]) -> list[float]:
    """The logprobs of `ids` after `prompt` under the trainer's (unmerged) LoRA model."""
    import torch

    seq = prompt + ids
    with torch.no_grad():
        logp = trainer.model(torch.tensor([seq])).logits[0].float().log_softmax(-1)
    return [float(logp[i - 1, seq[i]]) for i in range(len(prompt), len(seq))]


async def complete(client: httpx.AsyncClient, model: str) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0, "return_token_ids": True}
    return await client.post("/v1/completions", json=body)


def error(response: httpx.Response) -> tuple[int, str, str]:
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == response.status_code
    return response.status_code, err["type"], err["message"]


async def test_lora_routes_answer_like_vllm(builtin: BuiltinBackend, tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    first, second = trained(tiny_dir, 1), trained(tiny_dir, 2)
    a1 = lora_push.save_adapter(first.model, tmp_path / "a1")
    a2 = lora_push.save_adapter(second.model, tmp_path / "a2")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in a1.iterdir()}
    assert not list(a1.glob("model*.safetensors"))  # the adapter alone, not the base weights
    app = build_model_app(builtin, model_name="tiny")
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:
        load = await client.post("/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(a1)})
        assert (load.status_code, load.text) == (200, "Success: LoRA adapter 'a1' added successfully.")
        cards = (await client.get("/v1/models")).json()["data"]
        assert [(c["id"], c["parent"], c["root"]) for c in cards] == [("tiny", None, "tiny"), ("a1", "tiny", str(a1))]

        # requests naming the adapter sample with it; the base model's name (or none) keeps the base weights
        base, lora = (await complete(client, "tiny")).json(), (await complete(client, "a1")).json()
        assert lora["model"] == "a1"
        base_choice, lora_choice = base["choices"][0], lora["choices"][0]
        direct = (await complete(client, "")).json()["choices"][0]
        assert direct["token_ids"] == base_choice["token_ids"]
        assert lora_choice["logprobs"]["token_logprobs"] == pytest.approx(peft_logprobs(first, PROMPT, lora_choice["token_ids"]), abs=1e-4)
        assert base_choice["logprobs"]["token_logprobs"] != pytest.approx(peft_logprobs(first, PROMPT, base_choice["token_ids"]), abs=1e-3)
        assert error(await complete(client, "nope")) == (404, "NotFoundError", "The model `nope` does not exist.")

        # vLLM's load errors: a name already loaded, missing fields, no adapter there, no tensors, shapes that do not fit
        again = await client.post("/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(a2)})
        assert error(again)[:2] == (400, "InvalidUserInput") and "has already been loaded" in error(again)[2]
        missing = await client.post("/v1/load_lora_adapter", json={"lora_name": "a3"})
        assert error(missing) == (400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
        nowhere = await client.post("/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": str(tmp_path / "none")})
        assert error(nowhere) == (404, "NotFoundError", f"Loading lora a3 failed: No adapter found for {tmp_path / 'none'}")
        empty = tmp_path / "empty"
        empty.mkdir()
        (empty / "adapter_config.json").write_text((a1 / "adapter_config.json").read_text())
        no_tensors = await client.post("/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": str(empty)})
        assert error(no_tensors) == (500, "InternalServerError", f"{empty} doesn't contain tensors")
        bad = tmp_path / "bad"
        bad.mkdir()
        (bad / "adapter_config.json").write_text((a1 / "adapter_config.json").read_text())
        tensors = load_file(str(a1 / "adapter_model.safetensors"))
        save_file({k: v[:, :-1].contiguous() if "lora_A" in k else v for k, v in tensors.items()}, str(bad / "adapter_model.safetensors"))
        wrong = await client.post("/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": str(bad)})
        assert error(wrong)[:2] == (500, "InternalServerError") and "size mismatch" in error(wrong)[2]
        assert [c["id"] for c in (await client.get("/v1/models")).json()["data"]] == ["tiny", "a1"]

        # load_inplace replaces an adapter under its name
        inplace = await client.post("/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(a2), "load_inplace": True})
        assert inplace.status_code == 200
        replaced = (await complete(client, "a1")).json()["choices"][0]
        assert replaced["logprobs"]["token_logprobs"] == pytest.approx(peft_logprobs(second, PROMPT, replaced["token_ids"]), abs=1e-4)

        # unloading: then the name is unknown to completions and to a second unload
        gone = await client.post("/v1/unload_lora_adapter", json={"lora_name": "a1"})
        assert (gone.status_code, gone.text) == (200, "Success: LoRA adapter 'a1' removed successfully.")
        assert error(await client.post("/v1/unload_lora_adapter", json={"lora_name": "a1"})) == (404, "NotFoundError", "The lora adapter 'a1' cannot be found.")
        assert error(await client.post("/v1/unload_lora_adapter", json={})) == (400, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter.")
        assert error(await complete(client, "a1"))[0] == 404
        assert [c["id"] for c in (await client.get("/v1/models")).json()["data"]] == ["tiny"]


async def test_push_adapter_loads_each_update_and_unloads_the_previous(builtin: BuiltinBackend, tiny_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run-1"
    async with serving(build_model_app(builtin, model_name="tiny")) as url:
        backend = VllmBackend(url + "/v1", tokenizer_model=str(tiny_dir))
        try:
            fresh = LocalTrainer(str(tiny_dir), lora_rank=8, seed=0)
            assert await asyncio.to_thread(lora_push.push_adapter, fresh, backend, run_dir, 0) is None  # no update yet: the base model
            assert (backend.adapter, backend.weights_version) == (None, 0) and not (run_dir / "adapters").exists()

            names = []
            for step, seed in ((0, 1), (1, 2)):
                trainer = trained(tiny_dir, seed)
                trainer.updates = step + 1
                names.append(await asyncio.to_thread(lora_push.push_adapter, trainer, backend, run_dir, step))
                assert names[-1] == f"forgetui-run-1-step-{step}" == backend.adapter and backend.weights_version == step + 1
                assert (run_dir / "adapters" / f"step-{step:05d}" / "adapter_config.json").exists()
                async with httpx.AsyncClient(base_url=url) as client:
                    served = [c["id"] for c in (await client.get("/v1/models")).json()["data"]]
                assert served == ["tiny", names[-1]]  # the previous adapter is unloaded
                ids, lps = await generate(backend)
                assert lps == pytest.approx(peft_logprobs(trainer, PROMPT, ids), abs=1e-4)
            # the same weights again (a step without an update): nothing new is saved or loaded
            assert await asyncio.to_thread(lora_push.push_adapter, trainer, backend, run_dir, 2) == names[-1]
            assert not (run_dir / "adapters" / "step-00002").exists()
        finally:
            await backend.aclose()


async def generate(backend: VllmBackend) -> tuple[list[int], list[float]]:
    """A greedy completion of PROMPT through the backend: (token ids, logprobs)."""
    context = GenerationContext(session="s", call_seq=0, request=ChatRequest(api="chat", model="m", messages=[]))
    ids: list[int] = []
    lps: list[float] = []
    async for chunk in backend.generate(PROMPT, SamplingParams(max_tokens=6, temperature=0), context):
        ids += chunk.token_ids
        lps += chunk.logprobs
    return ids, lps


async def test_resume_loads_the_checkpoints_adapter_into_the_server(builtin: BuiltinBackend, tiny_dir: Path, tmp_path: Path) -> None:
    saved = trained(tiny_dir, 3)
    saved.updates = 2
    run_dir = tmp_path / "run-2"
    saved.save_checkpoint(run_dir / "checkpoints" / "step-00001")
    async with serving(build_model_app(builtin, model_name="tiny")) as url:
        config = coin_config(**{"policy.backend": f"vllm:{url}", "policy.tokenizer": "tiny", "train.lora_rank": 8})
        backend, trainer, first = await load_for_training(config, run_dir)
        try:
            assert first == 2 and trainer.updates == 2
            assert (backend.adapter, backend.weights_version) == ("forgetui-run-2-step-1", 2)
            ids, lps = await generate(backend)
            assert lps == pytest.approx(peft_logprobs(saved, PROMPT, ids), abs=1e-4)
        finally:
            await backend.aclose()


def test_a_vllm_policy_trains_adapters_or_full_weights() -> None:
    # full weights too (reloaded by the server: core.train.vllm_sync); a server without the reload routes is refused
    # once built, before any rollout (tests/test_vllm_training.py)
    check_trainable(coin_config(**{"policy.backend": "vllm:http://127.0.0.1:9", "policy.tokenizer": "tiny"}))
    check_trainable(coin_config(**{"policy.backend": "vllm:http://127.0.0.1:9", "policy.tokenizer": "tiny", "train.lora_rank": 8}))
    with pytest.raises(ConfigError, match="has no weights to train|replays fixed turns"):
        check_trainable(coin_config(**{"policy.backend": "scripted:x.json"}))


@pytest.fixture
def serve_model() -> Iterator[str]:
    """`forgetui serve-model tiny` in a subprocess; its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "forgetui.cli", "serve-model", "tiny", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else url
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def rows(store: str, sql: str) -> list[tuple]:
    with duckdb.connect(store, read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.mark.docker
def test_grpo_with_a_vllm_policy_loads_each_adapter_into_the_server(serve_model: str, docker_client, base_image) -> None:
    config = coin_config(**{"policy.backend": f"vllm:{serve_model}", "policy.tokenizer": "tiny", "train.lora_rank": 8})
    summary = asyncio.run(execute_run(config))
    store = summary.store
    assert summary.rollouts == 24 and summary.infra_errors == 0

    # step 0 sampled with the base weights, step 1 with the adapter of step 0's update
    versions = dict(rows(store, "SELECT r.step, list(DISTINCT c.weights_version) FROM calls c JOIN rollouts r USING (rollout_id) GROUP BY 1"))
    assert versions == {0: [0], 1: [1]}
    steps = rows(store, "SELECT step, CAST(metrics->>'logprob_diff_max' AS DOUBLE), CAST(metrics->>'samples_trained' AS INT) FROM train_steps ORDER BY step")
    assert [s[0] for s in steps] == [0, 1]
    for step, diff_max, trained_samples in steps:
        assert diff_max <= 1e-3, f"step {step}: the server's logprobs under the adapter and the trainer's disagree by {diff_max}"
        assert trained_samples == 12

    # the server holds the last adapter only; each update's adapter is a PEFT folder in the run
    run_dir = Path(store).parent
    served = [c["id"] for c in httpx.get(f"{serve_model}/v1/models", timeout=30).json()["data"]]
    assert served == ["tiny", f"forgetui-{summary.run_id}-step-1"]
    for step in (0, 1):
        assert (run_dir / "adapters" / f"step-{step:05d}" / "adapter_model.safetensors").exists()
