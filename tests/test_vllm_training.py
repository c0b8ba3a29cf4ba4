"""Training against a real vLLM server: full-parameter weights reloaded in place (core/train/vllm_sync.py), LoRA as before.

The first tests need no vLLM (the weights file, a server without the reload routes). The rest share one managed
server (`vllm:smollm2-135m`, 30-90 s to start on 2 cores) and skip with a printed reason where `make vllm` has not
run (tests/vllm_fixtures.py); the GRPO runs through Docker are slow (each ~1.5-2 min on 2 busy cores).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest

import tests.loopback as loopback
from core.backends.builtin import BuiltinBackend
from core.backends.spec import PolicySpec, build_backend
from core.backends.vllm import VllmBackend
from core.errors import ConfigError
from core.models.tiny import ensure_tiny_model
from core.paths import sub
from core.proxy.model_server import build_model_app
from core.run import execute_run
from core.train import lora_push, vllm_sync
from core.train import weights as W
from core.train.local import LocalTrainer
from tests.test_train_loop import coin_config
from tests.vllm_fixtures import SERVER_OPTIONS, SKIP_REASON

CLIENT = httpx.Client(trust_env=False, timeout=300)


# --- no vLLM needed ---------------------------------------------------------------------------------------------------


def test_the_weights_file_holds_every_tensor_and_the_tied_output_layer(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    trainer = LocalTrainer(str(ensure_tiny_model()))
    count = vllm_sync.save_weights(trainer, tmp_path / "w")
    saved = load_file(str(tmp_path / "w" / vllm_sync.FILE))
    state = trainer.state_dict_for_backend()
    assert count == len(saved) and set(saved) >= set(state) - {"lm_head.weight"}
    assert "lm_head.weight" in saved  # written even when tied: vLLM 0.32's in-place reload would keep the old one
    for name, tensor in state.items():
        assert saved[name].dtype == tensor.dtype and bool((saved[name] == tensor).all()), name
    assert not list((tmp_path / "w").glob("*.tmp"))
    vllm_sync.check_folder(tmp_path / "w", count)
    with pytest.raises(Exception, match="tensors, the trainer has"):
        vllm_sync.check_folder(tmp_path / "w", count + 1)
    with pytest.raises(Exception, match="were not written"):
        vllm_sync.check_folder(tmp_path / "none")


async def test_full_weights_are_refused_before_any_rollout_by_a_server_without_the_reload_routes() -> None:
    tiny = ensure_tiny_model()
    builtin = BuiltinBackend(str(tiny))
    app = build_model_app(builtin, model_name="tiny")  # vLLM's LoRA routes, not its dev routes
    try:
        async with loopback.serving(app) as url:
            backend = VllmBackend(url + "/v1", tokenizer_model=str(tiny))
            try:
                full = LocalTrainer(str(tiny))
                with pytest.raises(ConfigError, match="VLLM_SERVER_DEV_MODE=1.*train.lora_rank"):
                    await asyncio.to_thread(lora_push.check_push, full, backend)
                await asyncio.to_thread(lora_push.check_push, LocalTrainer(str(tiny), lora_rank=4, seed=0), backend)  # LoRA: as before
            finally:
                await backend.aclose()
    finally:
        await app.state.adapters.aclose()
        await builtin.aclose()


def test_the_learning_plan_samples_on_vllm_and_trains_sft_in_process() -> None:
    from forgetui.learning import Plan, policy, sft

    plan = Plan(sampler="vllm", concurrency=32)
    spec = PolicySpec.parse(policy(plan, "/ck/sft"))
    assert spec.kind == "vllm" and spec.managed and spec.target == "/ck/sft" and spec.weights_source(None) == "/ck/sft"
    assert dict(spec.options) == {"max_model_len": "8192", "kv_cache": "4"}
    assert policy(plan, "smollm2-135m", sampling=False) == "builtin:smollm2-135m?max_batch=32"  # SFT only trains: in-process
    assert policy(Plan(concurrency=32), "smollm2-135m") == "builtin:smollm2-135m?max_batch=32"
    with pytest.raises(ValueError, match="one of builtin, vllm"):
        policy(Plan(sampler="sglang"), "m")
    import inspect

    assert "sampling=False" in inspect.getsource(sft)


def test_the_plans_dtype_reaches_every_sampler_and_trainer(tmp_path: Path) -> None:
    from forgetui.learning import Plan, base_config, grpo_config, policy
    from forgetui.learning_sampler import SharedVllm

    plan = Plan(sampler="vllm", dtype="bfloat16", concurrency=32)
    assert dict(PolicySpec.parse(policy(plan, "/ck/sft")).options)["dtype"] == "bfloat16"  # a server a run starts
    shared = SharedVllm.for_model(plan.model, plan.server_options(), tmp_path / "vllm.log")
    assert shared.server.settings.dtype == "bfloat16"  # the learning run's one server
    assert grpo_config(plan, "/ck/sft").train.dtype == "bfloat16"  # the GRPO trainer
    sft = base_config(plan, policy(plan, plan.model, sampling=False), "train", 2)
    assert (sft.train.dtype, sft.policy.spec.options.get("dtype")) == ("bfloat16", "bfloat16")  # SFT (in-process)
    builtin = base_config(Plan(dtype="bfloat16"), policy(Plan(dtype="bfloat16"), "m"), "eval", 1)
    assert (builtin.policy.spec.options.get("dtype"), builtin.train.dtype) == ("bfloat16", "bfloat16")
    given = Plan(sampler="vllm", dtype="bfloat16", vllm_options="kv_cache=2&dtype=float32")  # the options' own dtype wins
    assert given.server_options() == "kv_cache=2&dtype=float32"
    default = Plan(sampler="vllm")
    assert default.server_options() == default.vllm_options and base_config(default, "builtin:m", "eval", 1).train.dtype == "auto"


@pytest.mark.parametrize("native", ["bfloat16", "float32"])
def test_a_fast_plan_computes_in_what_this_machine_multiplies_natively(monkeypatch: pytest.MonkeyPatch, native: str) -> None:
    import forgetui.learning as learning
    from core.models.precision import fastest_dtype

    assert fastest_dtype() in ("bfloat16", "float32")  # this machine's answer, whichever it is
    monkeypatch.setattr(learning, "fastest_dtype", lambda: native)
    plan = learning.Plan(sampler="vllm", dtype="fast")
    assert plan.server_options().endswith(f"dtype={native}")
    config = learning.base_config(plan, "builtin:m", "eval", 1)
    assert (config.train.dtype, config.policy.spec.options.get("dtype")) == (native, native)


def test_the_learning_benchmark_takes_a_sampler() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("learning_curve_script", Path(__file__).parents[1] / "benchmarks" / "learning_curve.py")
    assert spec is not None and spec.loader is not None
    lc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lc)
    argv = ["learning_curve.py", "--harness", "react", "--sampler", "vllm", "--vllm-options", "kv_cache=2", "--dtype", "bfloat16"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", argv)
        plan = lc.make_plan(lc.parse_args(), "react")
    assert (plan.sampler, plan.vllm_options, plan.dtype) == ("vllm", "kv_cache=2", "bfloat16")


# --- the real server --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def managed() -> Iterator[VllmBackend]:
    """`vllm:smollm2-135m` started by the project (dev routes on, LoRA on); stopped after the module."""
    if SKIP_REASON is not None:
        pytest.skip(f"real vLLM: {SKIP_REASON}")
    backend = build_backend(PolicySpec.parse(f"vllm:smollm2-135m?{SERVER_OPTIONS}"))
    yield backend
    asyncio.run(backend.aclose())


def prompt_ids(backend: VllmBackend) -> list[int]:
    """A prompt long enough (~150 tokens) that vLLM's prefix cache keeps whole blocks of it."""
    text = "Count the lines of notes.txt, then write the number into count.txt and say done. " * 10
    return backend.tokenizer(text)["input_ids"]


def served(backend: VllmBackend, prompt: list[int]) -> tuple[list[int], list[float]]:
    """The server's greedy answer to `prompt`: (token ids, logprobs)."""
    body = {"model": backend.model_name, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 0, "return_token_ids": True}
    choice = CLIENT.post(f"{backend.base_url}/v1/completions", json=body).json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def trainer_logprobs(trainer: LocalTrainer, prompt: list[int], ids: list[int]) -> list[float]:
    import torch

    seq = prompt + ids
    with torch.no_grad():
        logp = trainer.model(torch.tensor([seq])).logits[0].float().log_softmax(-1)
    return [float(logp[i - 1, seq[i]]) for i in range(len(prompt), len(seq))]


def perturbed(model_dir: str, seed: int) -> LocalTrainer:
    """A full-parameter trainer whose weights moved as after an update (the embedding, tied to the output, included)."""
    import torch

    trainer = LocalTrainer(model_dir, seed=seed)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "embed_tokens" in name or "mlp.down_proj" in name:
                param.add_(torch.randn_like(param) * 0.02)
    trainer.updates = 1
    return trainer


def weight_info(backend: VllmBackend) -> str:
    return CLIENT.get(f"{backend.base_url}/weight_info").json()["weight_version"]


@pytest.mark.skipif(SKIP_REASON is not None, reason=f"real vLLM: {SKIP_REASON}")
def test_a_full_weight_sync_reaches_the_server_and_drops_its_prefix_cache(managed: VllmBackend, tmp_path: Path) -> None:
    assert managed.server is not None
    model_dir = managed.server.model_dir
    prompt = prompt_ids(managed)
    before_ids, before = served(managed, prompt)  # the prompt's blocks now sit in the prefix cache, computed by the start weights
    trainer = perturbed(model_dir, 0)
    took = vllm_sync.push_full_weights(trainer, managed, tmp_path / "run", 0)
    assert took is not None and managed.weights_version == 1 and weight_info(managed) == "1"
    ids, after = served(managed, prompt)
    # the server now samples with the trainer's weights, over the whole prompt (no stale cached block)
    assert after == pytest.approx(trainer_logprobs(trainer, prompt, ids), abs=1e-3)
    assert (ids, after) != (before_ids, before)
    assert [p.name for p in (tmp_path / "run" / "weights").iterdir()] == ["step-00000"]

    # the same version again: nothing written; a second update replaces the first's folder
    assert vllm_sync.push_full_weights(trainer, managed, tmp_path / "run", 1) is None
    second = perturbed(model_dir, 1)
    second.updates = 2
    vllm_sync.push_full_weights(second, managed, tmp_path / "run", 1)
    ids, after = served(managed, prompt)
    assert after == pytest.approx(trainer_logprobs(second, prompt, ids), abs=1e-3)
    assert [p.name for p in (tmp_path / "run" / "weights").iterdir()] == ["step-00001"]

    # a new run on this server gets its starting weights back before its first rollout
    fresh = LocalTrainer(model_dir)
    lora_push.check_push(fresh, managed)
    assert weight_info(managed) == vllm_sync.BASE_VERSION
    ids, after = served(managed, prompt)
    assert (ids, after) == (before_ids, pytest.approx(before, abs=1e-4))


@pytest.mark.skipif(SKIP_REASON is not None, reason=f"real vLLM: {SKIP_REASON}")
def test_a_trainer_starting_elsewhere_gives_a_fresh_server_its_start_weights(managed: VllmBackend, tmp_path: Path, caplog) -> None:
    """A server started on the base model (version "default"), GRPO from another checkpoint (a learning run's SFT): before
    the first rollout the server must sample with the checkpoint, not the base model it was started with."""
    assert managed.server is not None
    model_dir = managed.server.model_dir
    lora_push.check_push(LocalTrainer(model_dir), managed)  # the start weights, version "default"
    prompt = prompt_ids(managed)
    base = served(managed, prompt)
    caplog.clear()
    with caplog.at_level("INFO", logger="core.train.vllm_sync"):
        lora_push.check_push(LocalTrainer(model_dir), managed)  # the model it was started with: nothing to reload
    assert not [r for r in caplog.records if "reloading" in r.getMessage()]

    checkpoint = tmp_path / "sft"
    moved = perturbed(model_dir, 5)
    W.save_hf_folder(moved.model, moved.tokenizer, checkpoint, moved.state_dict_for_backend())
    trainer = LocalTrainer(str(checkpoint))
    lora_push.check_push(trainer, managed)
    assert weight_info(managed) == vllm_sync.start_version(str(checkpoint))  # the trainer's start, named by its folder
    ids, logprobs = served(managed, prompt)
    assert logprobs == pytest.approx(trainer_logprobs(trainer, prompt, ids), abs=1e-3) and (ids, logprobs) != base
    caplog.clear()
    with caplog.at_level("INFO", logger="core.train.vllm_sync"):
        lora_push.check_push(trainer, managed)  # holds this start already: no second reload
    assert [r.getMessage() for r in caplog.records if "reloading" in r.getMessage()] == []
    lora_push.check_push(LocalTrainer(model_dir), managed)  # the base model given back, "default" again
    assert weight_info(managed) == vllm_sync.BASE_VERSION
    assert served(managed, prompt) == (base[0], pytest.approx(base[1], abs=1e-4))


def rows(store: str, sql: str) -> list[tuple]:
    with duckdb.connect(store, read_only=True) as con:
        return con.execute(sql).fetchall()


def grpo_on(managed: VllmBackend, **train: object) -> tuple[object, list[tuple]]:
    """Two GRPO steps of the coin harness sampling on the shared server (as `vllm:URL`): the summary and the step rows."""
    assert managed.server is not None
    url = f"{managed.server.base_url}/v1?model={managed.model_name}"
    config = coin_config(**{"policy.backend": f"vllm:{url}", "policy.tokenizer": managed.server.model_dir, "run.n_samples": 8,
                            "run.concurrency": 8, **train})
    summary = asyncio.run(execute_run(config))
    assert summary.rollouts == 16 and summary.infra_errors == 0
    versions = dict(rows(summary.store, "SELECT r.step, list(DISTINCT c.weights_version) FROM calls c JOIN rollouts r USING (rollout_id) GROUP BY 1"))
    assert versions == {0: [0], 1: [1]}  # step 1 sampled with step 0's update, and every call says so
    steps = rows(summary.store, "SELECT step, CAST(metrics->>'logprob_diff_max' AS DOUBLE), CAST(metrics->>'sync_s' AS DOUBLE), "
                                "CAST(metrics->>'weights_version' AS INT) FROM train_steps ORDER BY step")
    assert [(s[0], s[3]) for s in steps] == [(0, 1), (1, 2)]
    for step, diff_max, sync_s, _ in steps:
        assert diff_max <= 1e-3, f"step {step}: the server's logprobs and the trainer's disagree by {diff_max}"
        assert sync_s > 0
    return summary, steps


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.skipif(SKIP_REASON is not None, reason=f"real vLLM: {SKIP_REASON}")
def test_full_parameter_grpo_against_vllm_agrees_every_step(managed: VllmBackend, docker_client, base_image) -> None:
    summary, _ = grpo_on(managed, **{"train.lr": 1e-4})
    assert weight_info(managed) == "2"
    run_dir = Path(summary.store).parent
    # the run's end removed the copy it pushed (the final checkpoint holds the same weights); the server keeps serving them
    assert not (run_dir / "weights").exists() and not (run_dir / "adapters").exists()
    prompt = prompt_ids(managed)
    ids, logprobs = served(managed, prompt)
    final = LocalTrainer(str(run_dir / "checkpoints" / "step-00001"))
    assert logprobs == pytest.approx(trainer_logprobs(final, prompt, ids), abs=1e-3)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.skipif(SKIP_REASON is not None, reason=f"real vLLM: {SKIP_REASON}")
def test_lora_grpo_against_vllm_still_agrees_every_step(managed: VllmBackend, docker_client, base_image) -> None:
    summary, _ = grpo_on(managed, **{"train.lora_rank": 8})
    assert weight_info(managed) == vllm_sync.BASE_VERSION  # an earlier full-weight run's weights were given back first
    cards = [c["id"] for c in CLIENT.get(f"{managed.base_url}/v1/models").json()["data"]]
    assert f"forgetui-{summary.run_id}-step-1" in cards


@pytest.mark.skipif(SKIP_REASON is not None, reason=f"real vLLM: {SKIP_REASON}")
def test_one_server_serves_each_stage_of_a_learning_run_by_reloading_its_checkpoint(managed: VllmBackend, tmp_path: Path) -> None:
    """The learning run's shared server (forgetui.learning_sampler): a checkpoint folder's weights reach it in place,
    tied output layer included, and it reloads only when something else replaced what it loaded."""
    from forgetui.learning_sampler import SharedVllm

    assert managed.server is not None
    model_dir = managed.server.model_dir
    lora_push.check_push(LocalTrainer(model_dir), managed)  # an earlier test's sync undone: the start weights
    shared = SharedVllm(managed.server, model_dir)
    prompt = prompt_ids(managed)
    base = served(managed, prompt)
    spec = PolicySpec.parse(shared.spec(model_dir))
    assert shared.reload_s == [] and not spec.managed and spec.target == managed.base_url  # holds the base already: nothing loaded
    assert (spec.options["model"], spec.options["tokenizer"]) == (managed.model_name, model_dir)

    trainer = perturbed(model_dir, 3)  # the embedding moved: a checkpoint folder without lm_head.weight must still tie it
    checkpoint = tmp_path / "step-00000"  # the model folder a checkpoint holds (not the optimizer state: 1 GB less on disk)
    W.save_hf_folder(trainer.model, trainer.tokenizer, checkpoint, {k: v for k, v in trainer.state_dict_for_backend().items() if k != "lm_head.weight"})
    shared.spec(str(checkpoint))
    assert len(shared.reload_s) == 1 and weight_info(managed) == shared.loaded[1] != vllm_sync.BASE_VERSION
    ids, after = served(managed, prompt)
    assert after == pytest.approx(trainer_logprobs(trainer, prompt, ids), abs=1e-3)
    assert not list((tmp_path / "step-00000").glob("*.tmp")) and list(sub("cache").glob("vllm-weights/learning-*")) == []

    shared.spec(str(checkpoint))  # still held: no reload
    assert len(shared.reload_s) == 1
    other = perturbed(model_dir, 4)
    vllm_sync.push_full_weights(other, managed, tmp_path / "run", 0)  # a trainer's sync replaced it (GRPO's stage)
    shared.spec(str(checkpoint))
    assert len(shared.reload_s) == 2 and served(managed, prompt)[1] == pytest.approx(after, abs=1e-4)

    shared.spec(model_dir)  # back to the base model
    assert served(managed, prompt) == (base[0], pytest.approx(base[1], abs=1e-4))
    lora_push.check_push(LocalTrainer(model_dir), managed)  # leave the start weights' version for the tests after


def test_the_sampler_benchmarks_sides_set_the_plans_sampler_and_dtype(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    from core.backends.vllm_server import ServerSettings
    from forgetui.learning import Plan, base_config, policy

    spec = importlib.util.spec_from_file_location("vllm_sampler_script", Path(__file__).parents[1] / "benchmarks" / "vllm_sampler.py")
    assert spec is not None and spec.loader is not None
    vs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vs)
    for name, want in (("builtin-bf16", ("builtin", "bfloat16")), ("vllm-bf16", ("vllm", "bfloat16")), ("vllm", ("vllm", "float32"))):
        plan = Plan()
        vs.use_side(plan, name, plan.vllm_options)
        if plan.sampler == "vllm":
            got = ServerSettings.from_options("m", dict(PolicySpec.parse(policy(plan, "m")).options)).dtype
        else:
            got = base_config(plan, policy(plan, "m"), "eval", 1).policy.spec.options.get("dtype")
        assert (plan.sampler, got) == want, name
    monkeypatch.setattr("sys.argv", ["vllm_sampler.py", "--order", "builtin,bf16"])
    with pytest.raises(SystemExit):
        vs.main()  # an unknown side is refused before any stage runs
    assert "unknown side(s) bf16; the sides are builtin, vllm," in capsys.readouterr().err
