"""A trained LoRA adapter into a running vLLM server (its dynamic LoRA loading), as OpenPipe ART does.

After each update the trainer's adapter is saved as a PEFT folder (adapter_config.json +
adapter_model.safetensors) under ``run_dir/adapters/step-NNNNN``, loaded into the server with
``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``, the previous adapter is unloaded
(``POST /v1/unload_lora_adapter {"lora_name"}``), and the backend's requests name the new adapter
as their ``model``. vLLM serves these routes only when started with ``--enable-lora`` (and a
``--max-lora-rank`` ≥ train.lora_rank) and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; the path
must be readable by the server (same machine or a shared folder).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx

from core.errors import BackendError, ConfigError
from core.train import vllm_sync
from core.train import weights as W

log = logging.getLogger(__name__)

ADAPTERS = "adapters"
TIMEOUT_S = 600.0


def adapter_dir(run_dir: Path, step: int) -> Path:
    return run_dir / ADAPTERS / f"step-{step:05d}"


def adapter_name(run_dir: Path, step: int) -> str:
    """The adapter's name on the server: unique per run and step, so runs can share a server."""
    return f"forgetui-{run_dir.name}-step-{step}"


def save_adapter(model: Any, path: Path) -> Path:
    """Write the LoRA adapter alone (adapter_config.json + adapter_model.safetensors), not the base weights."""
    if not W.is_peft(model):
        raise ConfigError("a vLLM policy trains LoRA adapters: set train.lora_rank")
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def _post(base_url: str, route: str, body: dict[str, Any]) -> httpx.Response:
    try:
        return httpx.post(f"{base_url}{route}", json=body, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise BackendError(f"cannot reach vLLM at {base_url} for {route}: {exc!r}") from exc


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except ValueError:
        return response.text
    return str(error.get("message", error)) if isinstance(error, dict) else response.text


def _route_missing(response: httpx.Response) -> bool:
    """A 404 that is not vLLM's ErrorResponse: the server has no such route (dynamic LoRA is off)."""
    if response.status_code != 404:
        return False
    try:
        return "error" not in response.json()
    except ValueError:
        return True


def load_adapter(base_url: str, name: str, path: Path) -> None:
    """Load the adapter at `path` as `name` (replacing a stale one of that name left by a crashed run)."""
    response = _post(base_url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
    if response.status_code == 400 and "already been loaded" in _message(response):
        unload_adapter(base_url, name)
        response = _post(base_url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
    if _route_missing(response):
        raise BackendError(
            f"vLLM at {base_url} has no /v1/load_lora_adapter: start it with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
        )
    if response.status_code != 200:
        raise BackendError(
            f"vLLM at {base_url} did not load LoRA adapter {name!r} from {path}: HTTP {response.status_code}: {_message(response)}"
        )


def unload_adapter(base_url: str, name: str) -> None:
    """Unload `name`; an adapter the server no longer has (404) is already gone."""
    response = _post(base_url, "/v1/unload_lora_adapter", {"lora_name": name})
    if response.status_code not in (200, 404):
        raise BackendError(
            f"vLLM at {base_url} did not unload LoRA adapter {name!r}: HTTP {response.status_code}: {_message(response)}"
        )


def push_adapter(trainer: Any, backend: Any, run_dir: Path, step: int) -> str | None:
    """Save the trainer's adapter after `step`, load it into the backend's server, drop the previous one; its name.

    Nothing is pushed while the weights are unchanged (no update yet, or none this step): the
    server keeps sampling with the base model or the adapter it has, under the same version.
    """
    version = trainer.updates
    if version == 0 or (backend.adapter is not None and backend.weights_version == version):
        return backend.adapter
    name, path = adapter_name(run_dir, step), save_adapter(trainer.model, adapter_dir(run_dir, step))
    load_adapter(backend.base_url, name, path.resolve())
    previous = backend.adapter
    backend.set_adapter(name, version)
    if previous is not None and previous != name:
        unload_adapter(backend.base_url, previous)
    log.info("LoRA adapter %s (weights version %d) loaded into %s", name, version, backend.base_url)
    return name


def check_push(trainer: Any, backend: Any) -> None:
    """Refuse now, before any rollout, a server that could not take this trainer's weights after its first update."""
    if backend.capabilities.adapters:
        vllm_sync.check_server(trainer, backend)


def push_weights(trainer: Any, backend: Any, run_dir: Path, step: int) -> None:
    """The trainer's weights into the sampling backend, the way the backend declares it takes them (between steps:
    nothing is generating): into its server (a LoRA adapter loaded, or the full weights reloaded from a folder:
    `core.train.vllm_sync`), or the state dict reloaded in-process."""
    if backend.capabilities.adapters:
        if W.is_peft(trainer.model):
            push_adapter(trainer, backend, run_dir, step)
        else:
            vllm_sync.push_full_weights(trainer, backend, run_dir, step)
        return
    if not backend.capabilities.weight_reload:
        raise ConfigError(f"backend {backend.name} cannot take new weights (it declares neither weight reload nor adapters)")
    backend.reload_weights(trainer.state_dict_for_backend())
    backend.weights_version = trainer.updates
