"""A harness installed once into a named Docker volume, mounted read-only into every task's sandbox.

With per-task images (harbor's environment/Dockerfile) baking the harness layer into each task image
copies the harness's bytes (hundreds of MB for a Node harness) into every one of them. Instead the
harness layer is built once on the run's base image, its install tree (``/opt/forgetui``) and its
commands (``/usr/local/bin``, as ``/opt/forgetui/bin``) are copied into a volume named after the
layer's content hash, and each sandbox mounts that volume read-only at ``/opt/forgetui`` with
``/opt/forgetui/bin`` first on PATH. The task image stays exactly the task's.

Why a volume: this engine (Docker 20.10, API 1.41) has no ``--mount type=image`` (Docker 28+) and no
volume subpaths; a named volume filled from the harness image is what it does support. The harness
image itself is removed after the fill when this call built it, so the harness's bytes are stored
once, in the volume. The harness still runs on the task image's libc and (for Python harnesses)
its python3, exactly as a layer baked on top of the task image would.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from core.errors import SandboxError
from core.runtime.images import ImageLayer, ensure_image, image_exists, image_tag

log = logging.getLogger(__name__)

MOUNT = "/opt/forgetui"  # where every harness recipe installs (core.runtime.recipes.INSTALL_ROOT)
BIN = f"{MOUNT}/bin"
COMPLETE = ".forgetui-volume-complete"
FILL_AT = "/mnt/forgetui-harness"
# cp -a keeps the links recipes make into /usr/local/bin (absolute /opt/forgetui/... targets stay valid under the mount)
FILL_SCRIPT = (
    f"set -e; d={FILL_AT}; rm -f $d/{COMPLETE}; mkdir -p {MOUNT} /usr/local/bin; "
    f"cp -a {MOUNT}/. $d/; mkdir -p $d/bin; cp -a /usr/local/bin/. $d/bin/; touch $d/{COMPLETE}"
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VOLUME_LABEL = "forgetui.harness-volume"
# one fill per volume in this process: tasks with different images ask for the same harness at once,
# and a second fill would delete the marker and copy over files a started sandbox is using
_FILL_LOCKS: dict[str, threading.Lock] = {}
_FILL_LOCKS_GUARD = threading.Lock()


def volume_name(base: str, layers: list[ImageLayer], ca_bundle: bytes | None = None) -> str:
    """``forgetui-harness-<names>-<hash12>``: the same content hash as the harness image's tag."""
    repo, _, digest = image_tag(base, layers, ca_bundle).rpartition(":")
    return f"forgetui-harness-{repo.split('/', 1)[1]}-{digest}"


def _complete(client: Any, name: str, probe_image: str) -> bool:
    """Whether volume `name` exists and was filled to the end (its marker file is there)."""
    import docker.errors

    try:
        volume = client.volumes.get(name)
    except docker.errors.NotFound:
        return False
    mountpoint = Path(volume.attrs.get("Mountpoint") or "/nonexistent")
    if mountpoint.is_dir() and os.access(mountpoint, os.R_OK | os.X_OK):  # a local engine, and we may read its volumes
        return (mountpoint / COMPLETE).is_file()
    try:  # not readable from here (remote engine, not root): ask a throwaway container
        client.containers.run(probe_image, ["test", "-f", f"{FILL_AT}/{COMPLETE}"], volumes={name: {"bind": FILL_AT, "mode": "ro"}}, remove=True, network_mode="none")
        return True
    except docker.errors.ContainerError:
        return False


def ensure_harness_volume(client: Any, base: str, layers: list[ImageLayer], ca_bundle: Path | None = None) -> str:
    """The volume holding `layers` (built on `base`) once; filled unless complete already. Returns its name."""
    ca = Path(ca_bundle).read_bytes() if ca_bundle is not None else None
    name = volume_name(base, layers, ca)
    with _FILL_LOCKS_GUARD:
        lock = _FILL_LOCKS.setdefault(name, threading.Lock())
    with lock:
        if _complete(client, name, base):
            log.info("harness volume %s exists; reusing it", name)
            return name
        return _fill(client, name, base, layers, ca_bundle, ca)


def _fill(client: Any, name: str, base: str, layers: list[ImageLayer], ca_bundle: Path | None, ca: bytes | None) -> str:
    """Build the harness image if needed, copy its install tree into volume `name`, and drop the image again."""
    import docker.errors

    tag = image_tag(base, layers, ca)
    had_image = image_exists(client, tag)
    # recipes install on the host and only copy in: the build needs no network (nor Docker's bridge)
    ensure_image(client, base, layers, ca_bundle, network_mode="none")
    try:
        try:
            client.volumes.get(name)
        except docker.errors.NotFound:
            client.volumes.create(name=name, labels={VOLUME_LABEL: "true", "forgetui.layers": ",".join(x.name for x in layers), "forgetui.source": tag})
        log.info("filling harness volume %s from %s", name, tag)
        client.containers.run(tag, ["sh", "-c", FILL_SCRIPT], volumes={name: {"bind": FILL_AT, "mode": "rw"}}, remove=True, network_mode="none")
    except docker.errors.ContainerError as exc:
        raise SandboxError(f"filling harness volume {name} from {tag} failed: {exc}") from exc
    except docker.errors.APIError as exc:
        raise SandboxError(f"creating harness volume {name} failed: {exc}") from exc
    finally:
        if not had_image:  # its bytes now live in the volume: keep them once
            try:
                client.images.remove(tag)
            except docker.errors.APIError as exc:
                log.info("could not remove the harness image %s after filling its volume: %s", tag, exc)
    return name


def image_path(client: Any, tag: str) -> str:
    """The PATH an image's config sets (Docker's default when it sets none)."""
    env = (client.images.get(tag).attrs.get("Config") or {}).get("Env") or []
    for item in env:
        if item.startswith("PATH="):
            return item[5:]
    return DEFAULT_PATH


def sandbox_path(client: Any, tag: str) -> str:
    """PATH for a sandbox of image `tag` with the harness volume mounted: the harness's commands first."""
    return f"{BIN}:{image_path(client, tag)}"


__all__ = ["BIN", "MOUNT", "ensure_harness_volume", "sandbox_path", "volume_name"]


def prune_harness_volumes(client: Any, *, everything: bool = False) -> list[str]:
    """Remove harness volumes no container mounts: older fills of a harness (its files changed since), or all with `everything`.

    The newest volume of each harness stays (the next run would only fill it again); a volume in use
    by any container, running or not, is never removed.
    """
    import docker.errors

    volumes = client.volumes.list(filters={"label": VOLUME_LABEL})
    # sparse: the list answer carries each container's mounts; inspecting each could meet one removed meanwhile
    in_use = {m.get("Name") for c in client.containers.list(all=True, sparse=True) for m in (c.attrs.get("Mounts") or []) if m.get("Type") == "volume"}
    newest: dict[str, str] = {}
    if not everything:
        for v in sorted(volumes, key=lambda v: v.attrs.get("CreatedAt") or ""):
            newest[(v.attrs.get("Labels") or {}).get("forgetui.layers", v.name)] = v.name
    removed = []
    for volume in volumes:
        if volume.name in in_use or volume.name in newest.values():
            continue
        try:
            volume.remove()
        except docker.errors.APIError as exc:  # mounted by a container created since the listing: leave it
            log.info("harness volume %s not removed: %s", volume.name, exc)
            continue
        removed.append(volume.name)
    return removed
