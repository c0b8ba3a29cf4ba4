"""The `forgetui` veRL agent loop in-process on CPU: veRL's own AgentLoopWorker, a real Docker rollout, a veRL loss.

The one stand-in is the inference client: vLLM needs a GPU, so `BuiltinClient` answers veRL's
`LLMServerClient.generate` with the built-in tiny model. Everything else is veRL's code (config
composed by Hydra from verl/trainer/config, `AgentLoopWorker.generate_sequences`: agent loop,
per-rollout postprocessing, batch assembly) and forgetui's (sandbox, harness, proxy, store, verifier).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import threading
from pathlib import Path
from types import SimpleNamespace

import duckdb
import numpy as np
import pytest

from core.backends.base import GenerationContext, SamplingParams
from core.config import load_config
from core.errors import BackendError
from core.models.resolve import resolve_model
from core.train.types import Sample
from core.train.verl.client_backend import ClientTokenBackend
from core.train.verl.launch import ClusterOptions, gpu_count, prepare
from core.train.verl.outputs import Limits, branch_fields, pick_single

pytest.importorskip("verl")

N_ROWS = 4
PROMPT_LEN, RESPONSE_LEN = 256, 64
CONFIG = """
[env]
name = "toy"
tasks = ["hello"]
[harness]
name = "tests.harness_fixtures:CoinHarness"
[policy]
backend = "builtin:tiny"
[runtime]
kind = "docker"
[run]
n_samples = 2
concurrency = 4
timeout_s = 120
[train]
steps = 1
estimator = "grpo"
"""


class BuiltinClient:
    """veRL's LLMServerClient.generate answered by the built-in model (vLLM cannot run here)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.requests: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append(dict(sampling_params, request_id=request_id))
        sampling = SamplingParams(
            max_tokens=sampling_params["max_tokens"], temperature=sampling_params["temperature"],
            top_p=sampling_params["top_p"], stop_token_ids=sampling_params.get("stop_token_ids", []),
        )
        ids, lps = [], []
        async for chunk in self.backend.generate(list(prompt_ids), sampling, GenerationContext(session=request_id, call_seq=0, request=None)):
            ids += chunk.token_ids
            lps += chunk.logprobs
        return TokenOutput(token_ids=ids, log_probs=lps, stop_reason="completed", extra_fields={"global_steps": 0})


def compose(overrides: list[str]):
    """veRL's ppo_trainer config with `overrides`, composed by Hydra from veRL's own config folder."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return hydra_compose("ppo_trainer", overrides=overrides)


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG)
    return path


def plan_for(tmp_path: Path):
    config = load_config(write_config(tmp_path))
    opts = ClusterOptions(nnodes=1, n_gpus_per_node=1, max_prompt_length=PROMPT_LEN, max_response_length=RESPONSE_LEN)
    return prepare(config, opts)


def batch_of_rows(train_file: Path, n: int):
    """The parquet's first row, n times, as veRL's dataset hands rows to the agent-loop worker."""
    import pandas as pd
    from verl import DataProto

    row = pd.read_parquet(train_file).iloc[0]
    columns = {
        "raw_prompt": [list(row["prompt"])] * n,
        "extra_info": [dict(row["extra_info"])] * n,
        "data_source": [row["data_source"]] * n,
        "reward_model": [dict(row["reward_model"])] * n,
        "index": list(range(n)),
        "uid": ["hello"] * n,  # one GRPO group
    }
    arrays = {}
    for key, values in columns.items():
        arr = np.empty(n, dtype=object)
        arr[:] = values
        arrays[key] = arr
    return DataProto(batch=None, non_tensor_batch=arrays, meta_info={"global_steps": 0})


def recorded_calls(run_dir: Path, rollout_id: str) -> list[tuple]:
    (store,) = list((run_dir / "shards").glob("*/store.duckdb"))
    with duckdb.connect(str(store), read_only=True) as con:
        calls = con.execute(
            "SELECT token_ids(prompt_token_ids), token_ids(completion_token_ids), completion_logprobs FROM calls WHERE rollout_id = ? ORDER BY seq", [rollout_id]
        ).fetchall()
        reward = con.execute("SELECT reward FROM rollouts WHERE rollout_id = ?", [rollout_id]).fetchone()[0]
    return [(list(p), list(c), list(lp), reward) for p, c, lp in calls]


def policy_loss(batch, model_dir: str) -> tuple[float, float]:
    """veRL's GRPO advantages and vanilla policy loss on the batch, log-probs recomputed by the tiny model; (loss, max |Δlogprob|)."""
    import torch
    from transformers import AutoModelForCausalLM
    from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage, get_policy_loss_fn
    from verl.workers.config.actor import FSDPActorConfig

    tensors = batch.batch
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"], position_ids=tensors["position_ids"]).logits
    responses, mask = tensors["responses"], tensors["response_mask"].float()
    start = tensors["prompts"].shape[1]
    logp = torch.log_softmax(logits[:, start - 1 : -1].float(), dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    old = tensors["rollout_log_probs"]
    diff = float(((logp - old).abs() * mask).max())
    adv, _ = compute_grpo_outcome_advantage(tensors["rm_scores"], mask, np.array(batch.non_tensor_batch["uid"], dtype=object))
    actor = FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2, loss_agg_mode="token-mean")
    loss_mat, _metrics = get_policy_loss_fn("vanilla")(
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode="token-mean", config=actor
    )
    loss = agg_loss(loss_mat, mask, "token-mean") if loss_mat.dim() else loss_mat
    return float(loss), diff


@pytest.mark.docker
def test_agent_loop_worker_runs_docker_rollouts_into_a_trainable_batch(tmp_path, docker_client, base_image, capsys) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from core.backends.builtin import BuiltinBackend
    from core.train.verl.worker import close_worker_run
    from forgetui.cli import main

    plan = plan_for(tmp_path)
    config = compose(plan.overrides)
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "forgetui"
    client = BuiltinClient(BuiltinBackend("tiny", device="cpu"))
    worker = AgentLoopWorker(config, llm_client=client)

    async def rollouts():
        try:
            return await worker.generate_sequences(batch_of_rows(plan.train_file, N_ROWS))
        finally:
            await close_worker_run()

    out = asyncio.run(rollouts())
    t = out.batch
    assert t["prompts"].shape == (N_ROWS, PROMPT_LEN)
    assert t["responses"].shape == t["response_mask"].shape == t["rollout_log_probs"].shape == (N_ROWS, RESPONSE_LEN)
    assert t["input_ids"].shape == (N_ROWS, PROMPT_LEN + RESPONSE_LEN)
    assert client.requests and all(r["logprobs"] and r["temperature"] == config.actor_rollout_ref.rollout.temperature for r in client.requests)

    run_dir = Path(os.environ["FORGETUI_HOME"]) / "runs" / plan.run_id
    rewards = []
    for i, rollout_id in enumerate(out.non_tensor_batch["forgetui_rollout_id"]):
        (prompt, completion, logprobs, reward), = recorded_calls(run_dir, rollout_id)  # CoinHarness: one call, one branch
        n_prompt = int(t["attention_mask"][i, :PROMPT_LEN].sum())
        assert t["prompts"][i, PROMPT_LEN - n_prompt :].tolist() == prompt  # left-padded prompt = the call's prompt
        mask = t["response_mask"][i].tolist()
        assert mask == [1] * len(completion) + [0] * (RESPONSE_LEN - len(completion))  # 1 exactly on sampled tokens
        assert t["responses"][i, : len(completion)].tolist() == completion
        assert t["rollout_log_probs"][i, : len(completion)].tolist() == pytest.approx(logprobs, abs=1e-6)
        assert float(t["rm_scores"][i].sum()) == pytest.approx(reward)
        assert float(t["rm_scores"][i, len(completion) - 1]) == pytest.approx(reward)  # on the last response token
        rewards.append(reward)
    assert set(rewards) <= {0.0, 1.0}

    loss, diff = policy_loss(out, str(resolve_model("tiny")))
    assert math.isfinite(loss)
    assert diff < 1e-3, f"recomputed and recorded logprobs differ by {diff}"

    capsys.readouterr()  # veRL prints to stdout while it builds its worker
    assert main(["sql", "SELECT count(*) AS n, sum(reward) AS r FROM rollouts", "--run", plan.run_id, "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["n"] == N_ROWS and row["r"] == pytest.approx(sum(rewards))


# ----------------------------------------------------------------------------- `forgetui train --trainer verl`
def dry_run(tmp_path: Path, capsys, *extra: str) -> tuple[int, list[str]]:
    from forgetui.cli import main

    code = main(["train", str(write_config(tmp_path)), "--trainer", "verl", "--n-gpus-per-node", "2", "--max-prompt-length", "512", *extra])
    lines = [line for line in capsys.readouterr().out.splitlines() if "verl.trainer.main_ppo" in line]
    command = shlex.split(lines[-1]) if lines else []
    return code, command[command.index("verl.trainer.main_ppo") + 1 :] if command else []


def test_dry_run_writes_verl_dataset_and_overrides_that_compose(tmp_path, capsys) -> None:
    import pandas as pd
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    code, overrides = dry_run(tmp_path, capsys, "--dry-run")
    assert code == 0 and overrides
    values = dict(o.lstrip("+").split("=", 1) for o in overrides)
    folder = Path(values["data.train_files"]).parent
    assert (folder / "overrides.txt").read_text().split() == overrides
    assert "verl.trainer.main_ppo" in (folder / "command.sh").read_text()

    frame = pd.read_parquet(values["data.train_files"])
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name"]
    row = frame.iloc[0]
    assert row["extra_info"]["task_id"] == "hello" and row["extra_info"]["env"] == "toy" and row["agent_name"] == "forgetui"
    assert list(row["prompt"])[0]["role"] == "user" and row["reward_model"]["ground_truth"] == "hello"

    config = compose(overrides)
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.mode, rollout.name, rollout.calculate_log_probs, rollout.n) == ("async", "vllm", True, 2)
    assert rollout.agent.default_agent_loop == "forgetui" and Path(rollout.agent.agent_loop_config_path).is_file()
    assert config.algorithm.adv_estimator == "grpo" and config.trainer.n_gpus_per_node == 2 and config.trainer.total_training_steps == 1
    assert rollout.prompt_length == 512
    (loop,) = OmegaConf.load(rollout.agent.agent_loop_config_path)
    assert loop.name == "forgetui" and loop._target_ == "core.train.verl.agent_loop.ForgetuiAgentLoop"
    assert Path(loop.forgetui_config).is_file() and loop.run_id == config.trainer.experiment_name

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)
    dataset = RLHFDataset(data_files=values["data.train_files"], tokenizer=tokenizer, config=config.data)
    item = dataset[0]  # veRL's own dataset class reads the rows the agent loop gets
    assert item["extra_info"]["task_id"] == "hello" and item["raw_prompt"][0]["role"] == "user"


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU: the launch would start veRL")
def test_train_verl_without_gpu_stops_clearly_after_writing_the_files(tmp_path, capsys, caplog) -> None:
    code, overrides = dry_run(tmp_path, capsys)
    assert code == 2
    assert "no GPU on this machine" in caplog.text and "command.sh" in caplog.text
    files = dict(o.split("=", 1) for o in overrides if o.startswith("data."))
    assert Path(files["data.train_files"]).is_file() and Path(files["data.val_files"]).is_file()


def test_train_needs_training_steps(tmp_path) -> None:
    from forgetui.cli import main

    config = write_config(tmp_path)
    assert main(["train", str(config), "--trainer", "verl", "--dry-run", "--set", "train.steps=0"]) == 2
    assert main(["train", str(config), "--trainer", "local", "--set", "train.steps=0"]) == 2


# ----------------------------------------------------------------------------- samples → AgentLoopOutput fields
def sample(branch: int, prompt: list[int], parts: list[tuple[list[int], list[int]]], reward: float = 1.0) -> Sample:
    """A branch: its first prompt, then (sampled, appended-by-the-harness) parts."""
    ids, mask, lps = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
    for sampled, env in parts:
        ids += sampled + env
        mask += [1] * len(sampled) + [0] * len(env)
        lps += [-0.5] * len(sampled) + [0.0] * len(env)
    return Sample(sample_id=f"r#{branch}", run_id="run", rollout_id="r", task_id="t", branch=branch, step=0, token_ids=ids,
                  loss_mask=mask, logprobs=lps, prompt_tokens=len(prompt), call_ids=[f"c{i}" for i in range(len(parts))], reward=reward)


def test_branch_fields_split_prompt_and_response_with_aligned_mask() -> None:
    main = sample(0, [1, 2, 3], [([4, 5], [6, 7]), ([8], [])])
    fields = branch_fields(main, Limits(prompt_length=8, response_length=8), passed=True)
    assert fields["prompt_ids"] == [1, 2, 3] and fields["response_ids"] == [4, 5, 6, 7, 8]
    assert fields["response_mask"] == [1, 1, 0, 0, 1] and fields["response_logprobs"] == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert fields["reward_score"] == 1.0 and fields["num_turns"] == 4
    assert fields["extra_fields"]["reward_extra_info"] == {"passed": 1.0}
    cut = branch_fields(main, Limits(prompt_length=2, response_length=3))
    assert cut["prompt_ids"] == [2, 3] and cut["response_ids"] == [4, 5, 6] and cut["response_mask"] == [1, 1, 0]
    side = sample(1, [9], [([10, 11], [])])
    assert pick_single([main, side]) is main  # the most sampled tokens (3 > 2)
    tie = sample(1, [9], [([10, 11, 12], [])])
    assert pick_single([main, tie]) is tie  # a tie: the later branch


def test_agent_loop_outputs_are_veRL_outputs() -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    out = AgentLoopOutput(**branch_fields(sample(0, [1, 2], [([3, 4], [5])]), Limits(8, 8)), metrics=AgentLoopMetrics())
    tensors = out.as_dict()
    assert tensors["responses"].tolist() == [3, 4, 5] and tensors["rm_scores"].tolist() == [0.0, 0.0, 1.0]


# ----------------------------------------------------------------------------- the client backend
class EchoClient:
    """An LLMServerClient-shaped client that must be called on its own loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log_probs: bool = True) -> None:
        self.loop, self.log_probs, self.params = loop, log_probs, []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        assert asyncio.get_running_loop() is self.loop
        self.params.append(sampling_params)
        ids = [7] * sampling_params["max_tokens"]
        return SimpleNamespace(token_ids=ids, log_probs=[-1.0] * len(ids) if self.log_probs else None, stop_reason="completed", extra_fields={"global_steps": 3})


def collect(backend: ClientTokenBackend, max_tokens: int = 3):
    async def go():
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.2, stop_token_ids=[2])
        return [c async for c in backend.generate([1, 2, 3], sampling, GenerationContext(session="tok", call_seq=0, request=None))]

    return asyncio.run(go())


def test_client_backend_samples_on_the_clients_loop_with_verls_params() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        client = EchoClient(loop)
        backend = ClientTokenBackend(client, tokenizer=None, context_length=64, loop=loop, sampling_for=lambda token: {"temperature": 1.0, "top_k": -1} if token == "tok" else None)
        (chunk,) = collect(backend)
        assert chunk.token_ids == [7, 7, 7] and chunk.logprobs == [-1.0] * 3 and chunk.finish_reason == "length"
        assert client.params[0] == {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "max_tokens": 3, "logprobs": True, "stop_token_ids": [2]}
        assert backend.weights_version == 3
        client.log_probs = False
        with pytest.raises(BackendError, match="calculate_log_probs"):
            collect(backend)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
