"""The shared harness on Kubernetes: installed once in an image, reaching each pod without a copy in the task image.

The Docker runtime fills a named volume from the harness image (core.runtime.harness_volume); a
cluster has no such volume shared across nodes, so the pod brings the harness itself, two ways
(``runtime.kubernetes.harness_mount``):

* ``init`` (default): the harness image (the harness layer on the run's base image) runs as an init
  container that copies its ``/opt/forgetui`` and ``/usr/local/bin`` (as ``/opt/forgetui/bin``) into
  an ``emptyDir``; the task container mounts it read-only at ``/opt/forgetui``. Any cluster; a copy
  per pod (seconds for a Node harness, and its bytes count against the pod's ephemeral storage).
* ``image``: an ``image`` volume (Kubernetes ≥ 1.31, feature gate ImageVolume; on by default from
  1.35) of the harness *tree* image, ``FROM scratch`` holding exactly that layout at its root,
  mounted read-only at ``/opt/forgetui``: nothing copied, the node's image store shares it between pods.

Either way every command in the pod runs with ``/opt/forgetui/bin`` in front of the image's own PATH, as
on Docker (the exec script sets it: a pod's env can only replace an image's PATH). ``SandboxSpec.volumes``
names the image to mount (source → mount path); the runtime's ``harness_mount`` says how.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from core.runtime.harness_volume import BIN, FILL_AT, MOUNT
from core.runtime.images import ImageLayer, ensure_image, image_tag

if TYPE_CHECKING:
    from core.runtime.k8s.config import KubernetesConfig

Mode = Literal["init", "image"]
INIT_CONTAINER = "forgetui-harness"
VOLUME = "forgetui-harness"
# What the init container runs. Entry by entry rather than Docker's `cp -a MOUNT/. dir/`: as a non-root uid
# (pod_security = "restricted") that would set the times of the emptyDir's root, which root owns: EPERM.
INIT_SCRIPT = (
    f"set -e; d={FILL_AT}; mkdir -p $d/bin; "
    f'for f in {MOUNT}/* {MOUNT}/.[!.]* {MOUNT}/..?*; do if [ -e "$f" ] || [ -L "$f" ]; then cp -a "$f" $d/; fi; done; '
    f"if [ -d /usr/local/bin ]; then cp -a /usr/local/bin/. $d/bin/; fi"
)
# The tree image: stage 0 is the harness image (ensure_image writes its FROM), the result holds only its install tree.
TREE_DOCKERFILE = f"FROM scratch\nCOPY --from=0 {MOUNT}/ /\nCOPY --from=0 /usr/local/bin/ /bin/\n"


def _tree_layer(harness_tag: str) -> ImageLayer:
    """The tree layer, named after the harness image (``forgetui/react:…`` → ``forgetui/react-tree:…``)."""
    repo = harness_tag.rpartition(":")[0].split("/", 1)[-1]
    return ImageLayer(name=f"{repo}-tree", dockerfile=TREE_DOCKERFILE)


def harness_image(base: str, layers: list[ImageLayer], ca: bytes | None = None) -> str:
    """The harness image's tag: its layers on the run's base (what the init container runs)."""
    return image_tag(base, layers, ca)


def tree_image(harness_tag: str) -> str:
    """The tag of the ``FROM scratch`` image holding the harness image's install tree at its root."""
    return image_tag(harness_tag, [_tree_layer(harness_tag)])


def mounted_image(base: str, layers: list[ImageLayer], ca: bytes | None, mode: Mode) -> str:
    """The image a pod mounts the harness from: the harness image (init) or its tree image (image volume)."""
    tag = harness_image(base, layers, ca)
    return tree_image(tag) if mode == "image" else tag


def build(client: Any, base: str, layers: list[ImageLayer], ca_bundle: Path | None, mode: Mode, platform: str | None = None) -> list[str]:
    """Build what pods of ``mode`` pull on the local Docker engine (for ``platform``, if given); returns those tags (to push)."""
    # recipes install on the host and only copy in: the build needs no network
    tag = ensure_image(client, base, layers, ca_bundle, network_mode="none", platform=platform)
    return [ensure_image(client, tag, [_tree_layer(tag)], network_mode="none", platform=platform)] if mode == "image" else [tag]


def pod_parts(
    sources: dict[str, str], cfg: KubernetesConfig, security: dict[str, Any], resources: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(init containers, pod volumes, task-container mounts) that bring each ``image → mount path`` into a pod."""
    inits: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for i, (image, path) in enumerate(sources.items()):
        name = VOLUME if i == 0 else f"{VOLUME}-{i}"
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
        if cfg.harness_mount == "image":
            volumes.append({"name": name, "image": {"reference": image, "pullPolicy": cfg.image_pull_policy}})
            continue
        volumes.append({"name": name, "emptyDir": {}})
        inits.append(
            {
                "name": INIT_CONTAINER if i == 0 else f"{INIT_CONTAINER}-{i}",
                "image": image,
                "imagePullPolicy": cfg.image_pull_policy,
                "command": ["sh", "-c", INIT_SCRIPT],
                "volumeMounts": [{"name": name, "mountPath": FILL_AT}],
                "resources": resources,
                "securityContext": security,
            }
        )
    return inits, volumes, mounts


__all__ = ["BIN", "INIT_CONTAINER", "INIT_SCRIPT", "build", "harness_image", "mounted_image", "pod_parts", "tree_image"]
