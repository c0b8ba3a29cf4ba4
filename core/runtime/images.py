"""Sandbox images: a debootstrapped base, and layers on top built once and cached by content hash.

Tags are ``forgetui/<layer names>:<hash12>`` where the hash covers the base image name, every
layer's Dockerfile text and context files, and the CA bundle if one is baked in: an unchanged
recipe reuses its image, a changed one gets a new tag. Images carry the label
``forgetui.image=true`` so `forgetui images` can list them.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

from core.errors import ConfigError, SandboxError
from core.runtime import labels as L
from core.runtime.base import as_bytes

log = logging.getLogger(__name__)

DEFAULT_BASE = "forgetui/base:bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_INCLUDE = ("python3", "ca-certificates", "bash", "coreutils", "procps")
CA_PATH = "/usr/local/share/ca-certificates/forgetui-ca.crt"
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "CURL_CA_BUNDLE")
_PROXY_ARGS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


class HostDir(NamedTuple):
    """A folder on the host copied into the build context; `key` stands for its content in the image hash."""

    path: Path
    key: str


class ImageLayer(NamedTuple):
    """One image layer: Dockerfile lines (no FROM) and the files and folders they COPY, by context-relative path.

    `dirs` carry big host-side installs (npm/pip trees cached under FORGETUI_HOME) without reading them
    into memory or hashing every byte: their cache key is hashed instead.
    """

    name: str
    dockerfile: str
    files: Mapping[str, bytes | str] = {}
    dirs: Mapping[str, HostDir] = {}


def _repo_name(layers: list[ImageLayer]) -> str:
    joined = "-".join(layer.name for layer in layers) or "image"
    name = re.sub(r"[^a-z0-9]+", "-", joined.lower()).strip("-")
    return (name or "image")[:100]


def image_tag(base: str, layers: list[ImageLayer], ca_bundle: bytes | None = None) -> str:
    """The content-hash tag of ``base`` + ``layers`` (+ a CA bundle): ``forgetui/<names>:<hash12>``."""
    h = hashlib.sha256()

    def feed(part: bytes) -> None:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)

    feed(base.encode())
    if ca_bundle is not None:
        feed(b"ca")
        feed(ca_bundle)
    for layer in layers:
        feed(layer.name.encode())
        feed(layer.dockerfile.encode())
        for path in sorted(layer.files):
            feed(path.encode())
            feed(as_bytes(layer.files[path]))
        for path in sorted(layer.dirs):
            feed(b"dir:" + path.encode())
            feed(layer.dirs[path].key.encode())
    return f"forgetui/{_repo_name(layers)}:{h.hexdigest()[:12]}"


def dockerfile_text(base: str, layers: list[ImageLayer], with_ca: bool) -> str:
    """The Dockerfile ``ensure_image`` builds: FROM base, the CA setup, then each layer in order."""
    lines = [f"FROM {base}"]
    if with_ca:
        lines.append(f"COPY ca.crt {CA_PATH}")
        lines.append("ENV " + " ".join(f"{var}={CA_PATH}" for var in CA_ENV))
        lines.append(
            "RUN (command -v update-ca-certificates >/dev/null && update-ca-certificates >/dev/null) || true"
        )
    for layer in layers:
        lines.append(f"# --- layer: {layer.name}")
        lines.append(layer.dockerfile.strip())
    return "\n".join(lines) + "\n"


def _context_tar(dockerfile: str, layers: list[ImageLayer], ca: bytes | None) -> IO[bytes]:
    files: dict[str, bytes] = {"Dockerfile": dockerfile.encode()}
    if ca is not None:
        files["ca.crt"] = ca
    for layer in layers:
        for path, data in layer.files.items():
            rel = path.lstrip("/")
            content = as_bytes(data)
            if rel in files and files[rel] != content:
                raise ConfigError(
                    f"image layers disagree about build-context file {rel!r} (layer {layer.name!r}); "
                    "give the files distinct names"
                )
            files[rel] = content
    # a spooled file: big host folders (hundreds of MB of node_modules) go to disk, not memory
    buf: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=64 * 1024 * 1024)
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel, content in sorted(files.items()):
            info = tarfile.TarInfo(rel)
            info.size = len(content)
            info.mode = 0o755 if rel.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(content))
        for layer in layers:
            for rel, host in sorted(layer.dirs.items()):
                if not Path(host.path).is_dir():
                    raise ConfigError(f"image layer {layer.name!r}: folder {host.path} is missing")
                tar.add(str(host.path), arcname=rel.strip("/"), recursive=True)
    buf.seek(0)
    return buf


def image_exists(client: Any, tag: str) -> bool:
    """True when the engine has ``tag`` locally."""
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def image_platform(client: Any, tag: str) -> str:
    """``os/architecture[/variant]`` of a local image (``linux/amd64``, ``linux/arm64/v8``)."""
    attrs = client.images.get(tag).attrs
    return "/".join(p for p in (attrs.get("Os"), attrs.get("Architecture"), attrs.get("Variant")) if p)


def platform_matches(actual: str, wanted: str) -> bool:
    """Whether an image of ``actual`` platform runs as ``wanted`` (a variant is compared only when both name one)."""
    a, w = actual.lower().split("/"), wanted.lower().split("/")
    return a[:2] == w[:2] and (len(a) < 3 or len(w) < 3 or a[2] == w[2])


def require_platform(client: Any, tag: str, platform: str | None) -> None:
    """SandboxError when ``tag`` is not built for ``platform`` (None: any): pods on other nodes would fail to start."""
    if platform is None:
        return
    actual = image_platform(client, tag)
    if not platform_matches(actual, platform):
        raise SandboxError(
            f"image {tag} is {actual}, not {platform}: the base image must exist for {platform} (runtime.base_image: a "
            f"multi-platform image from a registry, or one bootstrapped on a {platform} machine) and RUN steps of another "
            "architecture need QEMU emulation on this engine (binfmt_misc, e.g. the tonistiigi/binfmt image)"
        )


def ensure_image(
    client: Any,
    base: str,
    layers: list[ImageLayer],
    ca_bundle: Path | None = None,
    *,
    network_mode: str | None = None,
    platform: str | None = None,
) -> str:
    """Build ``base`` + ``layers`` unless its content-hash tag already exists (for ``platform``, if given); returns the tag.

    With ``ca_bundle`` (e.g. the host's /etc/ssl/certs/ca-certificates.crt behind a TLS-intercepting
    proxy) the bundle is copied into the image and SSL_CERT_FILE, REQUESTS_CA_BUNDLE,
    NODE_EXTRA_CA_CERTS and PIP_CERT point at it, so pip/npm/curl in build steps and at run time trust it.
    """
    if not layers and ca_bundle is None:
        return base
    ca = Path(ca_bundle).read_bytes() if ca_bundle is not None else None
    tag = image_tag(base, layers, ca)
    if image_exists(client, tag) and (platform is None or platform_matches(image_platform(client, tag), platform)):
        log.info("image %s exists; reusing it", tag)
        return tag
    if not image_exists(client, base):
        raise SandboxError(
            f"base image {base!r} is not on this Docker engine: build it with `forgetui images bootstrap` "
            f"(debootstrap) or pull/tag it from your registry"
        )
    context = _context_tar(dockerfile_text(base, layers, ca is not None), layers, ca)
    labels = {L.IMAGE: "true", "forgetui.layers": ",".join(x.name for x in layers), "forgetui.base": base}
    log.info("building image %s from %s (+%s)", tag, base, ", ".join(x.name for x in layers) or "CA bundle")
    _build(client, context, tag, labels, network_mode, platform)
    return tag


def _build(
    client: Any, context: IO[bytes], tag: str, labels: dict[str, str], network_mode: str | None = None, platform: str | None = None
) -> None:
    """Run one docker build from a tar context; a failure raises SandboxError with the build output's tail.

    ``platform``: the image's (``linux/arm64``); the engine's classic builder quietly builds on a local base of
    another platform, so the result is checked (``require_platform``).
    """
    import docker.errors

    buildargs = {k: v for k in _PROXY_ARGS if (v := os.environ.get(k))}
    output: list[str] = []
    try:
        stream = client.api.build(
            fileobj=context,
            custom_context=True,
            tag=tag,
            rm=True,
            forcerm=True,
            decode=True,
            buildargs=buildargs or None,
            network_mode=network_mode,
            labels=labels,
            platform=platform,
        )
        for chunk in stream:
            if "stream" in chunk:
                text = chunk["stream"]
                output.append(text)
                if text.strip():
                    log.debug("build %s: %s", tag, text.rstrip())
            if "error" in chunk:
                tail = "".join(output)[-3000:]
                raise SandboxError(f"building image {tag} failed: {chunk['error'].strip()}\n--- build output ---\n{tail}")
    except docker.errors.APIError as exc:
        raise SandboxError(f"building image {tag} failed: {exc}") from exc
    if not image_exists(client, tag):
        raise SandboxError(f"building image {tag} reported success but the engine has no such image")
    require_platform(client, tag, platform)
    log.info("built image %s", tag)


@dataclass(frozen=True)
class TaskImage:
    """A task that brings its own image recipe (harbor's environment/Dockerfile): any FROM it names.

    The base it names must be pullable or present on the engine. The env and harness layers are
    built on top of it, and the result is cached by content hash like every image.
    """

    dockerfile: str
    context: Path | None = None  # the build context folder (COPY sources), if any

    def digest(self) -> str:
        """sha256 of the Dockerfile and every file of its context (by relative path): what the image is built from."""
        h = hashlib.sha256(self.dockerfile.encode())
        if self.context is not None:
            for path in sorted(p for p in Path(self.context).rglob("*") if p.is_file()):
                h.update(str(path.relative_to(self.context)).encode() + b"\0" + path.read_bytes())
        return h.hexdigest()



def dockerfile_image_tag(name: str, dockerfile: str, context: Path | None) -> str:
    """Content-hash tag of a task's own Dockerfile and its build context folder."""
    return f"forgetui/task-{_repo_name([ImageLayer(name, '')])}:{TaskImage(dockerfile, context).digest()[:12]}"


def ensure_dockerfile_image(client: Any, name: str, dockerfile: str, context: Path | None = None, platform: str | None = None) -> str:
    """Build a task's own Dockerfile (any FROM: it must be pullable or present locally) once; returns its tag."""
    tag = dockerfile_image_tag(name, dockerfile, context)
    if image_exists(client, tag) and (platform is None or platform_matches(image_platform(client, tag), platform)):
        return tag
    buf: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=64 * 1024 * 1024)
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if context is not None:
            for path in sorted(Path(context).iterdir()):
                if path.name != "Dockerfile":
                    tar.add(str(path), arcname=path.name, recursive=True)
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    log.info("building task image %s for %s", tag, name)
    _build(client, buf, tag, {L.IMAGE: "true", "forgetui.task": name}, platform=platform)
    return tag


SANDBOX_USER = "forgetui"
SANDBOX_UID = 1000  # the uid of pod_security = "restricted" pods (core.runtime.k8s.manifest.RESTRICTED_UID)
SANDBOX_HOME = f"/home/{SANDBOX_USER}"


def add_sandbox_user(rootfs: Path) -> None:
    """Give ``rootfs`` the non-root sandbox user: a passwd entry and a home it owns (uid/gid SANDBOX_UID).

    A pod that runs as uid 1000 without one has HOME=/ (not writable) and no name; harnesses keep their
    state under a home. Written into the files directly: the rootfs is not booted, and no chroot is needed.
    """
    uid = SANDBOX_UID
    entries = {
        "etc/passwd": f"{SANDBOX_USER}:x:{uid}:{uid}:forgetui sandbox:{SANDBOX_HOME}:/bin/bash\n",
        "etc/group": f"{SANDBOX_USER}:x:{uid}:\n",
        "etc/shadow": f"{SANDBOX_USER}:*:19000:0:99999:7:::\n",
    }
    for rel, line in entries.items():
        path = rootfs / rel
        text = path.read_text() if path.exists() else ""
        if not any(row.split(":", 1)[0] == SANDBOX_USER for row in text.splitlines()):
            path.write_text(text + ("" if not text or text.endswith("\n") else "\n") + line)
    home = rootfs / SANDBOX_HOME.lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o755)
    if hasattr(os, "chown") and os.geteuid() == 0:
        os.chown(home, uid, uid)


def bootstrap_base(
    tag: str = DEFAULT_BASE,
    suite: str = "bookworm",
    include: Iterable[str] = DEFAULT_INCLUDE,
    mirror: str = DEFAULT_MIRROR,
    *,
    client: Any = None,
    workdir: Path | None = None,
) -> str:
    """Build a minimal Debian base image with debootstrap and `docker import` it; skipped when ``tag`` exists.

    Needs root and the ``debootstrap`` program (``apt-get install -y debootstrap``); takes about 80 s.
    """
    import docker

    client = client or docker.from_env()
    if image_exists(client, tag):
        log.info("base image %s exists; skipping debootstrap", tag)
        return tag
    if shutil.which("debootstrap") is None:
        raise SandboxError(
            "debootstrap is not installed: run `apt-get install -y debootstrap` (as root), then retry"
        )
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise SandboxError(
            "debootstrap needs root: run the base-image bootstrap as root (or build the base elsewhere)"
        )
    tmp = Path(tempfile.mkdtemp(prefix="forgetui-rootfs-", dir=workdir))
    rootfs = tmp / "rootfs"
    try:
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(include)}",
            suite,
            str(rootfs),
            mirror,
        ]
        log.info("debootstrap %s into %s (takes a minute or two)", suite, rootfs)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise SandboxError(
                f"debootstrap of {suite} from {mirror} failed (exit {proc.returncode}):\n{tail}"
            )
        for cache in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            cache.unlink()
        add_sandbox_user(rootfs)
        repo, _, version = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, "", "latest")
        log.info("importing %s as %s", rootfs, tag)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            assert tar.stdout is not None
            client.api.import_image_from_stream(
                tar.stdout,
                repository=repo,
                tag=version,
                changes=[f"LABEL {L.IMAGE}=true", 'CMD ["bash"]', "ENV LANG=C.UTF-8"],
            )
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            tar.wait()
        if tar.returncode != 0:
            raise SandboxError(f"tar of {rootfs} failed (exit {tar.returncode})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not image_exists(client, tag):
        raise SandboxError(f"docker import of {tag} did not produce the image")
    log.info("base image %s ready", tag)
    return tag


def list_images(client: Any = None) -> list[dict[str, Any]]:
    """forgetui's images (labelled ``forgetui.image`` or tagged ``forgetui/...``): tags, id, size, created."""
    import docker

    client = client or docker.from_env()
    seen: dict[str, Any] = {}
    for image in client.images.list(filters={"label": f"{L.IMAGE}=true"}):
        seen[image.id] = image
    for image in client.images.list():
        if any(t.startswith("forgetui/") for t in image.tags):
            seen[image.id] = image
    rows = []
    for image in seen.values():
        attrs = image.attrs
        rows.append(
            {
                "id": image.short_id,
                "tags": sorted(image.tags),
                "size": attrs.get("Size", 0),
                "created": attrs.get("Created", ""),
                "layers": (attrs.get("Config") or {}).get("Labels", {}).get("forgetui.layers", ""),
            }
        )
    return sorted(rows, key=lambda r: r["tags"])


def push_image(tag: str, registry: str, client: Any = None) -> str:
    """Tag ``tag`` as ``<registry>/<tag>`` and push it (uses the engine's configured credentials)."""
    import docker

    client = client or docker.from_env()
    repo, _, version = tag.rpartition(":")
    target_repo = f"{registry.rstrip('/')}/{repo}"
    client.images.get(tag).tag(target_repo, version)
    for chunk in client.images.push(target_repo, tag=version, stream=True, decode=True):
        if "error" in chunk:
            raise SandboxError(f"pushing {target_repo}:{version} failed: {chunk['error']}")
    return f"{target_repo}:{version}"


def main(argv: list[str] | None = None) -> int:
    """``python -m core.runtime.images bootstrap [--tag T] [--suite S] [--mirror URL]`` (for CI scripts)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m core.runtime.images")
    sub = parser.add_subparsers(dest="cmd", required=True)
    boot = sub.add_parser("bootstrap", help="debootstrap the base image unless it exists")
    boot.add_argument("--tag", default=DEFAULT_BASE)
    boot.add_argument("--suite", default="bookworm")
    boot.add_argument("--mirror", default=DEFAULT_MIRROR)
    sub.add_parser("list", help="list forgetui images")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.cmd == "bootstrap":
        print(bootstrap_base(args.tag, args.suite, mirror=args.mirror))
    else:
        for row in list_images():
            print(row["id"], " ".join(row["tags"]), row["size"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
