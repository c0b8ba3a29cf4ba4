"""`forgetui images push` against a registry: a small Docker Registry v2 server on loopback, pushed to
by the real engine (the engine treats 127.0.0.0/8 as an insecure registry, so plain HTTP works)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from core.proxy.server import BackgroundServer
from core.serving import read_body

pytestmark = pytest.mark.docker


class Registry:
    """The push half of the Registry v2 API: blob uploads (monolithic or chunked) and manifests, digests checked."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.uploads: dict[str, bytearray] = {}
        self.manifests: dict[tuple[str, str], tuple[str, bytes]] = {}  # (repo, tag) -> (media type, body)
        self.bad_digests: list[str] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        query = dict(p.split("=", 1) for p in scope["query_string"].decode().split("&") if "=" in p)
        body = await read_body(scope, receive, 1 << 31)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if path == "/v2/":
            return await self._send(send, 200, b"{}")
        if m := re.fullmatch(r"/v2/(.+)/blobs/(sha256:[0-9a-f]{64})", path):
            found = m[2] in self.blobs
            extra = [(b"docker-content-digest", m[2].encode()), (b"content-length", str(len(self.blobs.get(m[2], b""))).encode())]
            return await self._send(send, 200 if found else 404, self.blobs.get(m[2], b"") if method == "GET" else b"", extra, length=False)
        if m := re.fullmatch(r"/v2/(.+)/blobs/uploads/", path):
            upload = uuid.uuid4().hex
            self.uploads[upload] = bytearray(body)
            return await self._send(send, 202, b"", [(b"location", f"/v2/{m[1]}/blobs/uploads/{upload}".encode()), (b"docker-upload-uuid", upload.encode()), (b"range", b"0-0")])
        if m := re.fullmatch(r"/v2/(.+)/blobs/uploads/([0-9a-f]+)", path):
            data = self.uploads[m[2]]
            data += body
            if method == "PATCH":
                return await self._send(send, 202, b"", [(b"location", path.encode()), (b"docker-upload-uuid", m[2].encode()), (b"range", f"0-{max(len(data) - 1, 0)}".encode())])
            digest = query["digest"].replace("%3A", ":").replace("%3a", ":")
            if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
                self.bad_digests.append(digest)
                return await self._send(send, 400, b'{"errors": [{"code": "DIGEST_INVALID"}]}')
            self.blobs[digest] = bytes(self.uploads.pop(m[2]))
            return await self._send(send, 201, b"", [(b"location", f"/v2/{m[1]}/blobs/{digest}".encode()), (b"docker-content-digest", digest.encode())])
        if m := re.fullmatch(r"/v2/(.+)/manifests/([^/]+)", path):
            if method == "PUT":
                self.manifests[(m[1], m[2])] = (headers.get("content-type", ""), body)
                digest = "sha256:" + hashlib.sha256(body).hexdigest()
                return await self._send(send, 201, b"", [(b"docker-content-digest", digest.encode()), (b"location", path.encode())])
            return await self._send(send, 404, b'{"errors": [{"code": "MANIFEST_UNKNOWN"}]}')
        await self._send(send, 404, b"{}")

    @staticmethod
    async def _send(send: Any, status: int, body: bytes, extra: list | None = None, *, length: bool = True) -> None:
        headers = [(b"content-type", b"application/json"), (b"docker-distribution-api-version", b"registry/2.0"), *(extra or [])]
        if length:
            headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def test_push_sends_every_layer_and_the_manifest(docker_client, base_image, tmp_path):
    registry = Registry()
    with BackgroundServer(registry) as server:
        address = server.url.removeprefix("http://")
        env = {**os.environ, "FORGETUI_HOME": str(tmp_path / "home"), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        out = subprocess.run([sys.executable, "-m", "forgetui.cli", "images", "push", base_image, address], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        repo, _, tag = base_image.rpartition(":")
        assert out.stdout.strip() == f"{address}/{repo}:{tag}"
    ((key, (media_type, body)),) = registry.manifests.items()
    assert key == (repo, tag) and "manifest" in media_type
    manifest = json.loads(body)
    wanted = [manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])]
    assert wanted and all(d in registry.blobs for d in wanted) and registry.bad_digests == []
    config = json.loads(registry.blobs[manifest["config"]["digest"]])
    local = docker_client.images.get(base_image)
    assert config["rootfs"]["diff_ids"] == local.attrs["RootFS"]["Layers"]  # the same image, layer for layer
    docker_client.images.remove(f"{address}/{repo}:{tag}")
