"""What a run is set up from: its id, tasks, runtime, images and the proxy's address as sandboxes see it."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from core.config import RunConfig, load_config
from core.env import Environment, Task
from core.errors import ConfigError, SandboxError
from core.harness import Harness
from core.paths import runs_dir
from core.runtime import harness_volume, images, make_runtime
from core.runtime.base import Runtime
from core.runtime.images import ImageLayer
from core.runtime.k8s import harness as k8s_harness

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


def env_kwargs(config: RunConfig) -> dict[str, Any]:
    """The keyword options the config's environment is loaded with (`path`, `strict`, `[env.options]`)."""
    out: dict[str, Any] = dict(config.env.options)
    if config.env.path:
        out["path"] = config.env.path
    if config.env.strict:
        out["strict"] = True
    return out


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
    if rc.egress_allow:
        log.warning("runtime.egress_allow has no effect on the local runtime: its sandboxes share the host's network and reach everything")
    return make_runtime("local")


@dataclass(frozen=True)
class SandboxImage:
    """What a task's sandbox runs: the image, what the rollout row records of it, and the shared harness mount."""

    tag: str
    identity: str  # `tag@sha256:…` on Docker (rollouts.image_digest), the tag elsewhere
    volumes: dict[str, str] = field(default_factory=dict)  # harness volume (Kubernetes: harness image) → mount path (read-only)
    env: dict[str, str] = field(default_factory=dict)  # PATH with the mounted harness's commands first

    @property
    def harness_volume(self) -> str | None:
        return next(iter(self.volumes), None)


class RunImages:
    """The run's images: env + harness layers on the configured base, or a task's own Dockerfile image.

    A task with its own image gets the env layers on top of it and, on Docker with
    `runtime.shared_harness`, the harness from one read-only volume (core.runtime.harness_volume)
    instead of a copy of the harness in every task image. Each distinct image is built once (cached
    by content hash on the engine) and never twice at once.
    """

    def __init__(self, runtime: Runtime, config: RunConfig, env: Environment, harness: Harness) -> None:
        self.runtime = runtime
        self.config = config
        self.env_layers = [x for x in (env.image_layer(),) if x is not None]
        self.harness_layers = [x for x in (harness.install_layer(),) if x is not None]
        self.layers = self.env_layers + self.harness_layers
        self.ca = Path(config.runtime.ca_bundle) if config.runtime.ca_bundle else None
        self._built: dict[str, SandboxImage] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def shares_harness(self) -> bool:
        """Whether tasks with their own image (on Kubernetes: every task) mount the harness instead of carrying it."""
        return self.runtime.images != "none" and self.config.runtime.shared_harness and bool(self.harness_layers)

    def _task_base(self, task: Task | None) -> str:
        """What a task's image is built on: its own Dockerfile's image (by content hash), or the configured base."""
        if task is None or task.image is None:
            return self.config.runtime.base_image
        return images.dockerfile_image_tag(task.id, task.image.dockerfile, task.image.context)

    def _k8s_blocking(self, task: Task | None = None) -> SandboxImage:
        """On Kubernetes: the task's image (the env on its base, no harness) and the harness image the pod mounts.

        Nothing is built here (pods pull what `forgetui images build --push` made: `k8s_build_blocking`);
        the tags are content hashes, so both sides name the same images. See core.runtime.k8s.harness.
        """
        base = self.config.runtime.base_image
        if not self.shares_harness:
            return self._describe(self._on_base(self._task_base(task), self.layers))
        ca = self.ca.read_bytes() if self.ca else None
        mounted = k8s_harness.mounted_image(base, self.harness_layers, ca, self.config.runtime.kubernetes.harness_mount)
        # no PATH here: a pod's env would replace the image's; the pod's exec script puts the harness's first
        return self._describe(self._on_base(self._task_base(task), self.env_layers), {mounted: harness_volume.MOUNT})

    def k8s_build_blocking(self, tasks: list[Task] | None = None, platform: str | None = None) -> list[str]:
        """Build on this Docker engine (``self.runtime``) every image a Kubernetes run of ``tasks`` pulls; returns their tags.

        One image per distinct task base (the configured base, or each task's own Dockerfile) with the
        env's layers, then the shared harness's image (or, with ``shared_harness = false``, the harness
        baked into each task image). ``platform`` (``linux/arm64``): the nodes'; every image is checked to be built for it.
        """
        client = self.runtime.client  # type: ignore[attr-defined]
        base = self.config.runtime.base_image
        if not images.image_exists(client, base):
            raise SandboxError(f"base image {base} is not present: run `forgetui images bootstrap` (no registry needed) or pull/build it")
        own = {self._task_base(t): t for t in tasks or [] if t.image is not None}  # by the tag pods will name
        bases = [images.ensure_dockerfile_image(client, t.id, t.image.dockerfile, t.image.context, platform) for t in own.values() if t.image]
        if not tasks or any(t.image is None for t in tasks):
            bases.insert(0, base)
        layers = self.env_layers if self.shares_harness else self.layers
        out = [images.ensure_image(client, b, layers, self.ca, platform=platform) if layers or self.ca else b for b in bases]
        if self.shares_harness:
            out += k8s_harness.build(client, base, self.harness_layers, self.ca, self.config.runtime.kubernetes.harness_mount, platform)
        for tag in dict.fromkeys(out):  # the bare base is pushed as it is: it must be for the nodes too
            images.require_platform(client, tag, platform)
        return list(dict.fromkeys(out))

    def default_blocking(self) -> str:
        return self._on_base(self.config.runtime.base_image, self.layers)

    def _on_base(self, base: str, layers: list[ImageLayer]) -> str:
        if self.runtime.images == "none":
            return "local"
        if self.runtime.images == "cluster":
            return images.image_tag(base, layers, self.ca.read_bytes() if self.ca else None) if layers or self.ca else base
        client = self.runtime.client  # type: ignore[attr-defined]
        if not images.image_exists(client, base):
            raise SandboxError(f"base image {base} is not present: run `forgetui images bootstrap` (no registry needed) or pull/build it")
        return images.ensure_image(client, base, layers, self.ca) if layers or self.ca else base

    def _for_task_blocking(self, task: Task) -> SandboxImage:
        if self.runtime.images == "cluster":
            return self._k8s_blocking(task)
        if task.image is None:
            return self._describe(self.default_blocking())
        if self.runtime.images != "engine":
            raise SandboxError(f"task {task.id} brings its own Dockerfile: the local runtime cannot run it (use docker or kubernetes)")
        client = self.runtime.client  # type: ignore[attr-defined]
        task_base = images.ensure_dockerfile_image(client, task.id, task.image.dockerfile, task.image.context)
        if not self.shares_harness:
            return self._describe(self._on_base(task_base, self.layers))
        tag = images.ensure_image(client, task_base, self.env_layers, self.ca) if self.env_layers or self.ca else task_base
        volume = harness_volume.ensure_harness_volume(client, self.config.runtime.base_image, self.harness_layers, self.ca)
        return self._describe(tag, {volume: harness_volume.MOUNT}, {"PATH": harness_volume.sandbox_path(client, tag)})

    def _describe(self, tag: str, volumes: dict[str, str] | None = None, env: dict[str, str] | None = None) -> SandboxImage:
        return SandboxImage(tag, image_identity(self.runtime, tag), volumes or {}, env or {})

    async def for_task(self, task: Task) -> SandboxImage:
        """The sandbox image of `task` (built on first use; concurrent callers wait for the one build)."""
        key = "" if task.image is None else task.image.dockerfile + "\0" + str(task.image.context)
        if key in self._built:
            return self._built[key]
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key not in self._built:
                self._built[key] = await asyncio.to_thread(self._for_task_blocking, task)
        return self._built[key]


def build_image(runtime: Runtime, config: RunConfig, env: Environment, harness: Harness) -> str:
    """The env+harness image on the configured base (what `forgetui images build` prints)."""
    return RunImages(runtime, config, env, harness).default_blocking()


def image_identity(runtime: Runtime, image: str) -> str:
    """`tag@sha256:…` for images this Docker engine runs (what the rollout row records), the tag elsewhere."""
    if runtime.images != "engine":
        return image
    try:
        return f"{image}@{runtime.client.images.get(image).id}"  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - the tag alone still identifies it
        return image


def proxy_url_for_sandboxes(config: RunConfig, runtime: Runtime, local_url: str) -> str:
    if config.proxy.public_url:
        return config.proxy.public_url.rstrip("/")
    if runtime.images == "cluster":
        raise ConfigError(f"runtime.kind = {runtime.name} needs proxy.public_url: the proxy's address as pods see it")
    if runtime.images == "engine" and config.runtime.network == "bridge":
        return "http://host.docker.internal:" + local_url.rsplit(":", 1)[1]
    return local_url


def load_run_config(run_id: str) -> RunConfig:
    path = runs_dir() / run_id / "config.toml"
    if not path.exists():
        raise ConfigError(f"no run {run_id!r} to resume (no {path})")
    return load_config(path)  # the one TOML loader: a damaged file is a ConfigError naming it
