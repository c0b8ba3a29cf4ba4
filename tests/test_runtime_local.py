"""The local (unisolated, development-only) runtime."""

from __future__ import annotations

import logging

import pytest

from core.errors import SandboxError
from core.runtime.base import SandboxSpec
from core.runtime.local_runtime import LocalRuntime
from core.runtime.reaper import reap_orphans


def _spec(run: str = "run-l", rollout: str = "r0", **kw) -> SandboxSpec:
    return SandboxSpec(image="ignored", run_id=run, rollout_id=rollout, owner="tester", **kw)


async def test_roundtrip_and_warning(tmp_path, caplog):
    rt = LocalRuntime(tmp_path / "sandboxes")
    sb = rt.create(_spec(env={"GREETING": "hello"}))
    with caplog.at_level(logging.WARNING, logger="core.runtime.local_runtime"):
        await sb.start()
    assert "NOT isolated" in caplog.text
    res = await sb.exec("echo $GREETING $EXTRA; echo e >&2; exit 4", timeout_s=10, env={"EXTRA": "x"})
    assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (4, "hello x\n", "e\n", False)
    assert (await sb.exec(["pwd"], timeout_s=10)).stdout.strip() == str(sb.workdir)

    await sb.put_file("a/b.txt", b"data", mode=0o600)
    assert await sb.get_file("/workspace/a/b.txt") == b"data"
    assert (await sb.exec(["cat", "a/b.txt"], timeout_s=10)).stdout == "data"
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("F")
    await sb.put_dir(src, "/opt/task")
    assert await sb.get_file("/opt/task/f.txt") == b"F"
    res = await sb.exec(
        ["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], timeout_s=10, stdin=b"abc"
    )
    assert res.stdout == "cba\n"
    with pytest.raises(FileNotFoundError):
        await sb.get_file("missing")
    assert "echo $GREETING" in await sb.logs()

    root = sb.root
    await sb.stop()
    await sb.stop()
    assert root is not None and not root.exists()
    with pytest.raises(SandboxError, match="gone"):
        await sb.exec(["true"], timeout_s=5)


async def test_timeout_kills_the_process_group(tmp_path):
    sb = LocalRuntime(tmp_path).create(_spec())
    await sb.start()
    marker = sb.workdir / "survived"
    res = await sb.exec(f"(sleep 2; touch {marker}) & sleep 100", timeout_s=0.5)
    assert res.timed_out and res.exit_code == -9
    import asyncio

    await asyncio.sleep(2.5)
    assert not marker.exists()  # the background child died with its group
    await sb.stop()


async def test_reap_removes_matching_leftovers(tmp_path):
    rt = LocalRuntime(tmp_path)
    boxes = [rt.create(_spec("run-a", f"r{i}")) for i in range(2)] + [rt.create(_spec("run-b"))]
    for sb in boxes:
        await sb.start()
    assert await reap_orphans(rt, run_id="run-a") == 2
    assert [sb.root.exists() for sb in boxes] == [False, False, True]
    assert await rt.reap(owner="someone-else") == 0
    assert await rt.reap() == 1
