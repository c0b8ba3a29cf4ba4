"""What a run is set up from: its id, tasks, runtime, images and the proxy's address as sandboxes see it."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import secrets
import tomllib
from datetime import datetime
from pathlib import Path

from core.config import RunConfig
from core.env import Environment, Task
from core.errors import ConfigError, SandboxError
from core.harness import Harness
from core.paths import runs_dir
from core.runtime import make_runtime
from core.runtime.base import Runtime

log = logging.getLogger(__name__)


def new_run_id() -> str:
    return f"{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def select_tasks(env: Environment, patterns: list[str] | None, limit: int | None) -> list[Task]:
    """Tasks whose id matches any pattern (exact id or glob), in the env's order, at most `limit`."""
    tasks = env.tasks()
    if patterns:
        tasks = [t for t in tasks if any(t.id == p or fnmatch.fnmatchcase(t.id, p) for p in patterns)]
        if not tasks:
            raise ConfigError(f"no task of env {env.name!r} matches {patterns}")
    return tasks[:limit] if limit else tasks


def pick_runtime(config: RunConfig) -> Runtime:
    rc = config.runtime
    if rc.kind == "kubernetes":
        return make_runtime("kubernetes", config=rc.kubernetes, registry=rc.registry, proxy_public_url=config.proxy.public_url)
    if rc.kind in ("docker", "auto"):
        docker = make_runtime("docker")
        if docker.available():
            return docker
        if rc.kind == "docker":
            raise SandboxError("runtime.kind = docker but no Docker engine answers: start dockerd (see .ci/docker-up.sh) or use runtime.kind = local")
        log.warning("no Docker engine answers: falling back to the LOCAL runtime, which is NOT isolated")
    return make_runtime("local")


class RunImages:
    """The run's images: env + harness layers on the configured base, or on a task's own Dockerfile image.

    Each distinct image is built once (cached by content hash on the engine) and never twice at once.
    """

    def __init__(self, runtime: Runtime, config: RunConfig, env: Environment, harness: Harness) -> None:
        self.runtime = runtime
        self.config = config
        self.layers = [layer for layer in (env.image_layer(), harness.image_layer()) if layer is not None]
        self.ca = Path(config.runtime.ca_bundle) if config.runtime.ca_bundle else None
        self._built: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def default_blocking(self) -> str:
        return self._on_base(self.config.runtime.base_image)

    def _on_base(self, base: str) -> str:
        from core.runtime import images

        if self.runtime.name == "local":
            return "local"
        if self.runtime.name == "kubernetes":
            return images.image_tag(base, self.layers, self.ca.read_bytes() if self.ca else None) if self.layers else base
        client = self.runtime.client  # type: ignore[attr-defined]
        if not images.image_exists(client, base):
            raise SandboxError(f"base image {base} is not present: run `forgetui images bootstrap` (no registry needed) or pull/build it")
        return images.ensure_image(client, base, self.layers, self.ca) if self.layers or self.ca else base

    def _for_task_blocking(self, task: Task) -> str:
        from core.runtime import images

        assert task.image is not None
        if self.runtime.name != "docker":
            raise SandboxError(f"task {task.id} brings its own Dockerfile: only the docker runtime builds those (build and push it for {self.runtime.name})")
        base = images.ensure_dockerfile_image(self.runtime.client, task.id, task.image.dockerfile, task.image.context)  # type: ignore[attr-defined]
        return self._on_base(base)

    async def for_task(self, task: Task) -> str:
        key = "" if task.image is None else task.image.dockerfile + str(task.image.context)
        if key in self._built:
            return self._built[key]
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key not in self._built:
                build = self.default_blocking if task.image is None else (lambda: self._for_task_blocking(task))
                self._built[key] = await asyncio.to_thread(build)
        return self._built[key]


def build_image(runtime: Runtime, config: RunConfig, env: Environment, harness: Harness) -> str:
    """The env+harness image on the configured base (what `forgetui images build` prints)."""
    return RunImages(runtime, config, env, harness).default_blocking()


def image_identity(runtime: Runtime, image: str) -> str:
    """`tag@sha256:…` for Docker images (what the rollout row records), the tag elsewhere."""
    if runtime.name != "docker":
        return image
    try:
        return f"{image}@{runtime.client.images.get(image).id}"  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - the tag alone still identifies it
        return image


def proxy_url_for_sandboxes(config: RunConfig, runtime: Runtime, local_url: str) -> str:
    if config.proxy.public_url:
        return config.proxy.public_url.rstrip("/")
    if runtime.name == "kubernetes":
        raise ConfigError("runtime.kind = kubernetes needs proxy.public_url: the proxy's address as pods see it")
    if runtime.name == "docker" and config.runtime.network == "bridge":
        return "http://host.docker.internal:" + local_url.rsplit(":", 1)[1]
    return local_url


def load_run_config(run_id: str) -> RunConfig:
    path = runs_dir() / run_id / "config.toml"
    if not path.exists():
        raise ConfigError(f"no run {run_id!r} to resume (no {path})")
    return RunConfig.model_validate(tomllib.loads(path.read_text()))
