"""The shared harness: installed once into a read-only volume that every task image's sandbox mounts.

Real engine, real images, real containers: a harness layer filled into a volume once, a task image
that stays exactly the task's, the harness's command on PATH in its sandbox, nothing writable.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import docker.errors
import duckdb
import pytest

from core.config import load_config
from core.runtime import harness_volume as HV
from core.runtime.images import ImageLayer, ensure_dockerfile_image, image_exists, image_tag

pytestmark = pytest.mark.docker


def _layer(marker: str) -> ImageLayer:
    """A tiny harness: a script under /opt/forgetui and its command linked into /usr/local/bin, as recipes do."""
    script = f"#!/bin/sh\necho {marker} \"$@\"\n"
    return ImageLayer(
        name="tiny-harness",
        dockerfile="COPY tiny.sh /opt/forgetui/tiny/tiny.sh\nRUN chmod 755 /opt/forgetui/tiny/tiny.sh && ln -sf /opt/forgetui/tiny/tiny.sh /usr/local/bin/tiny\n",
        files={"tiny.sh": script},
    )


@pytest.fixture()
def tiny_volume(docker_client, base_image):
    layer = _layer(f"harness-{uuid.uuid4().hex[:8]}")
    name = HV.volume_name(base_image, [layer])
    yield layer, name
    try:
        docker_client.volumes.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass


def test_volume_holds_the_harness_once_and_task_sandboxes_run_it_read_only(docker_client, base_image, tiny_volume, monkeypatch, tmp_path) -> None:
    layer, name = tiny_volume
    assert HV.ensure_harness_volume(docker_client, base_image, [layer]) == name
    # the harness image it was filled from is gone: its bytes are stored once, in the volume
    assert not image_exists(docker_client, image_tag(base_image, [layer]))
    volume = docker_client.volumes.get(name)
    assert volume.attrs["Labels"][HV.VOLUME_LABEL] == "true" and volume.attrs["Labels"]["forgetui.layers"] == "tiny-harness"

    # filled once: a second call neither builds nor fills
    def no_build(*args, **kwargs):
        raise AssertionError("the volume was complete: nothing should be built")

    monkeypatch.setattr(HV, "ensure_image", no_build)
    assert HV.ensure_harness_volume(docker_client, base_image, [layer]) == name

    context = tmp_path / "ctx"
    context.mkdir()
    (context / "task.txt").write_text("task\n")
    task_tag = ensure_dockerfile_image(docker_client, "shared-harness-probe", f"FROM {base_image}\nWORKDIR /app\nCOPY task.txt /app/task.txt\n", context)
    out = docker_client.containers.run(
        task_tag,
        ["sh", "-c", "tiny hello; cat /app/task.txt; touch /opt/forgetui/x 2>&1 || echo read-only"],
        volumes={name: {"bind": HV.MOUNT, "mode": "ro"}},
        environment={"PATH": HV.sandbox_path(docker_client, task_tag)},
        network_mode="none",
        remove=True,
    ).decode()
    lines = out.splitlines()
    assert lines[0].startswith("harness-") and lines[0].endswith(" hello")  # the harness's command, from the volume
    assert lines[1] == "task" and lines[-1] == "read-only"
    assert HV.sandbox_path(docker_client, task_tag).startswith(HV.BIN + ":/usr/local/sbin")


def test_an_interrupted_fill_is_redone(docker_client, base_image, tiny_volume, monkeypatch) -> None:
    layer, name = tiny_volume
    docker_client.volumes.create(name=name)  # exists, but never completed (a crash mid-fill)
    assert not HV._complete(docker_client, name, base_image)
    HV.ensure_harness_volume(docker_client, base_image, [layer])
    assert HV._complete(docker_client, name, base_image)
    # an engine whose volumes this process cannot read (remote, not root): a throwaway container looks
    monkeypatch.setattr(HV.os, "access", lambda *a: False)
    assert HV._complete(docker_client, name, base_image)
    docker_client.volumes.create(name=name + "-empty")
    try:
        assert not HV._complete(docker_client, name + "-empty", base_image)
    finally:
        docker_client.volumes.get(name + "-empty").remove(force=True)


def test_concurrent_callers_fill_a_volume_once(docker_client, base_image, tiny_volume, monkeypatch) -> None:
    """Tasks with different images ask for one harness at once: one fill, every caller gets the filled volume."""
    from concurrent.futures import ThreadPoolExecutor

    layer, name = tiny_volume
    fills: list[str] = []
    real_fill = HV._fill

    def counted(*args, **kwargs):
        fills.append(args[1])
        return real_fill(*args, **kwargs)

    monkeypatch.setattr(HV, "_fill", counted)
    with ThreadPoolExecutor(4) as pool:
        names = list(pool.map(lambda _: HV.ensure_harness_volume(docker_client, base_image, [layer]), range(4)))
    assert names == [name] * 4 and fills == [name]
    assert HV._complete(docker_client, name, base_image)


def _harbor_task(root: Path, name: str, dockerfile: str) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text('[metadata]\ncategory = "probe"\n[agent]\ntimeout_sec = 120.0\n')
    (task / "instruction.md").write_text("Create hello.txt containing hi.\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text('test "$(cat /app/hello.txt 2>/dev/null)" = hi && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n')
    return task


def test_a_react_run_on_task_images_mounts_the_shared_harness_and_records_what_ran(docker_client, base_image, tmp_path, monkeypatch) -> None:
    """Two tasks with their own images: each rollout runs in its own task image (recorded as such), the harness from one volume."""
    from core.run import execute_run
    from core.session.setup import RunImages, pick_runtime
    from envs.harbor import HarborEnv
    from harnesses.react import ReactHarness

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    suite = tmp_path / "suite"
    for i in range(2):
        _harbor_task(suite, f"probe-{i}", f"FROM {base_image}\nWORKDIR /app\nENV WHICH={i}\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"tool": "shell", "command": "echo hi > hello.txt"}, {"text": "done"}]}))
    overrides = ["env.name=harbor", f"env.path={json.dumps(str(suite))}", 'harness.name="react"', f'policy.backend="scripted:{script}"',
                 "runtime.kind=docker", "run.max_retries=0", "run.concurrency=2"]
    def no_shared_image(self):
        raise AssertionError("every task brings its own image: the run's shared env+harness image must not be built")

    with monkeypatch.context() as patch:
        patch.setattr(RunImages, "default_blocking", no_shared_image)
        summary = asyncio.run(execute_run(load_config(None, overrides)))
    assert (summary.passed, summary.infra_errors) == (2, 0), summary
    con = duckdb.connect(summary.store, read_only=True)
    try:
        rows = con.execute("SELECT task_id, image_digest, meta->>'harness_volume', meta->'timings', started_at FROM rollouts ORDER BY task_id").fetchall()
    finally:
        con.close()
    config = load_config(None, overrides)
    env, harness = HarborEnv(path=str(suite)), ReactHarness()
    expected_volume = HV.volume_name(base_image, [harness.image_layer()])
    digests = set()
    for (task_id, digest, volume, timings, started_at), task in zip(rows, env.tasks(), strict=True):
        own = ensure_dockerfile_image(docker_client, task.id, task.image.dockerfile, task.image.context)
        # the image it really ran in: the task's own, byte for byte (no harness copy on top)
        assert digest == f"{own}@{docker_client.images.get(own).id}", (task_id, digest)
        assert volume == expected_volume and started_at is not None
        assert set(json.loads(timings)) >= {"build_s", "sandbox_start_s", "harness_s", "verify_s"}
        digests.add(digest)
    assert len(digests) == 2  # one per task, not the run's shared image

    # the sandbox image of a task is the task image itself: the harness adds 0 bytes to it
    images = RunImages(pick_runtime(config), config, env, harness)
    chosen = asyncio.run(images.for_task(env.tasks()[0]))
    assert chosen.tag == ensure_dockerfile_image(docker_client, "probe-0", env.tasks()[0].image.dockerfile, env.tasks()[0].image.context)
    assert chosen.volumes == {expected_volume: HV.MOUNT} and chosen.env["PATH"].startswith(HV.BIN + ":")

    # runtime.shared_harness = false: the old way, the harness baked into a copy of each task image
    config.runtime.shared_harness = False
    baked = asyncio.run(RunImages(pick_runtime(config), config, env, harness).for_task(env.tasks()[0]))
    assert baked.tag != chosen.tag and baked.volumes == {}


def test_gc_prunes_older_unused_fills_of_a_harness(docker_client, base_image) -> None:
    """Older fills of a harness go; its newest fill and any volume a container mounts (even one never started) stay."""
    import time

    group = f"gc-probe-{uuid.uuid4().hex[:8]}"
    names = [f"forgetui-harness-{group}-{i}" for i in range(3)]
    labels = {HV.VOLUME_LABEL: "true", "forgetui.layers": group}
    container = None
    try:
        for name in names:
            docker_client.volumes.create(name=name, labels=labels)
            time.sleep(1.1)  # CreatedAt has one-second resolution
        container = docker_client.containers.create(base_image, ["true"], volumes={names[0]: {"bind": "/x", "mode": "ro"}})
        removed = HV.prune_harness_volumes(docker_client)
        assert names[1] in removed and names[0] not in removed and names[2] not in removed
        left = {v.name for v in docker_client.volumes.list(filters={"label": f"forgetui.layers={group}"})}
        assert left == {names[0], names[2]}
        # (gc --all, every unused harness volume, is not run here: it would empty other tests' filled harnesses)
    finally:
        if container is not None:
            container.remove(force=True)
        for name in names:
            try:
                docker_client.volumes.get(name).remove(force=True)
            except docker.errors.NotFound:
                pass
