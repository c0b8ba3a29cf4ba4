"""Docker fixtures for the runtime tests: a live engine and the base image, or a clear skip."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from core.runtime.docker.runtime import DockerRuntime
from core.runtime.images import DEFAULT_BASE, bootstrap_base, image_exists

BASE_IMAGE = os.environ.get("FORGETUI_TEST_BASE_IMAGE", DEFAULT_BASE)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A docker SDK client for a live engine; skips when none answers."""
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:  # engine down or socket missing
        if os.environ.get("FORGETUI_REQUIRE_DOCKER") == "1":  # CI starts an engine: a skip would hide a broken setup
            pytest.fail(f"FORGETUI_REQUIRE_DOCKER=1 but no Docker engine answers ({exc})")
        pytest.skip(f"no Docker engine answers ({exc}); start one with `sudo .ci/docker-up.sh`")
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    """The sandbox base image; built with debootstrap only when FORGETUI_TEST_BOOTSTRAP=1."""
    if not image_exists(docker_client, BASE_IMAGE):
        if os.environ.get("FORGETUI_TEST_BOOTSTRAP") == "1":
            return bootstrap_base(BASE_IMAGE, client=docker_client)
        if os.environ.get("FORGETUI_REQUIRE_DOCKER") == "1":
            pytest.fail(f"FORGETUI_REQUIRE_DOCKER=1 but image {BASE_IMAGE} is missing (run `forgetui images bootstrap`)")
        pytest.skip(
            f"image {BASE_IMAGE} is missing; build it with `python -m core.runtime.images bootstrap` "
            "(root, debootstrap; ~80 s) or set FORGETUI_TEST_BOOTSTRAP=1"
        )
    return BASE_IMAGE


@pytest.fixture()
def run_id() -> str:
    """A run id unique to one test, so reaping it never touches anything else."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest_asyncio.fixture()
async def docker_runtime(docker_client: Any, run_id: str) -> AsyncIterator[DockerRuntime]:
    """A DockerRuntime whose containers of this test's run are removed afterwards."""
    runtime = DockerRuntime(docker_client)
    yield runtime
    await runtime.reap(run_id=run_id)
