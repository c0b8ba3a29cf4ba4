"""An isolated Docker sandbox reaches the recording proxy and nothing else, seen from inside a real sandbox.

Only loopback and this test's own containers are ever contacted: the "other service" is an HTTP server
this test starts on the host, and the absence of routes is read from the sandbox's routing table, never
tested by connecting to an outside address.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from core.runtime import labels as L
from core.runtime.base import SandboxSpec
from tests.loopback import text_handler, threaded_http

pytestmark = pytest.mark.docker

# Runs in the sandbox: one HTTP request, printed as JSON (status and body, or the error's name).
FETCH = r"""
import json, sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode() if len(sys.argv) > 2 else None,
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "detail": str(e)}))
"""


@pytest.fixture
def host_service() -> Iterator[int]:
    """Another service on the host, listening on every address: an isolated sandbox must not reach it."""
    with threaded_http(text_handler(lambda h: b"host-only secret"), host="0.0.0.0") as port:
        yield port


async def fetch(sb, url: str, body: dict | None = None) -> dict:
    argv = ["python3", "-c", FETCH, url] + ([json.dumps(body)] if body is not None else [])
    res = await sb.exec(argv, timeout_s=30)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def runtime_with(client, helper: str):
    """A DockerRuntime whose isolated sandboxes use `helper`: "auto" (a listener in the namespace, as root) or "forwarder"."""
    from core.runtime.docker.runtime import DockerRuntime

    runtime = DockerRuntime(client, network_helper=helper)
    if helper == "auto" and not runtime._netns_usable:
        pytest.skip("opening a port in a sandbox's namespace needs root and a local engine")
    return runtime


@pytest.mark.parametrize("helper", ["auto", "forwarder"])
async def test_isolated_sandbox_reaches_the_proxy_and_nothing_else(
    helper, docker_client, base_image, run_id, live_proxy, script_file, host_service
):
    import urllib.request

    docker_runtime = runtime_with(docker_client, helper)

    with urllib.request.urlopen(f"http://127.0.0.1:{host_service}/", timeout=5) as r:  # the service is up
        assert r.read() == b"host-only secret"
    proxy = live_proxy(f"scripted:{script_file([{'text': 'hello from the proxy'}])}")
    port = int(proxy.url.rsplit(":", 1)[1])
    sb = docker_runtime.create(SandboxSpec(image=base_image, run_id=run_id, rollout_id="net", owner="tester", proxy=proxy.url))
    await sb.start()
    try:
        answer = await fetch(sb, f"http://127.0.0.1:{port}/r/{proxy.token}/v1/chat/completions",
                             {"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.get("status") == 200, answer
        assert json.loads(answer["body"])["choices"][0]["message"]["content"] == "hello from the proxy"
        proxy.store.flush()
        rows = proxy.store.cursor().execute("SELECT rollout_id, status FROM calls").fetchall()
        assert rows == [("rollout-1", "ok")]  # recorded like any call from the host

        for target in (f"http://127.0.0.1:{host_service}/", f"http://localhost:{host_service}/"):
            seen = await fetch(sb, target)
            assert "error" in seen and "secret" not in json.dumps(seen), (target, seen)

        routes = (await sb.exec(["cat", "/proc/net/route"], timeout_s=10)).stdout.splitlines()
        assert routes[0].startswith("Iface") and routes[1:] == [], routes  # no route at all, default or other
        links = (await sb.exec(["cat", "/proc/net/dev"], timeout_s=10)).stdout.splitlines()[2:]
        assert [line.split(":")[0].strip() for line in links] == ["lo"]
        v6 = (await sb.exec(["sh", "-c", "cat /proc/net/ipv6_route 2>/dev/null | grep -v ' lo$' || true"], timeout_s=10))
        assert v6.stdout.strip() == ""

        forwarders = docker_client.containers.list(filters={"label": [f"{L.RUN}={run_id}", "forgetui.role=network"]})
        sandbox = docker_client.containers.get(sb.id)
        if helper == "forwarder":
            assert len(forwarders) == 1 and forwarders[0].attrs["HostConfig"]["NetworkMode"] == "none"
            fwd_host = forwarders[0].attrs["HostConfig"]
            assert fwd_host["CapDrop"] == ["ALL"] and not fwd_host["CapAdd"] and fwd_host["ReadonlyRootfs"] is True
            assert "no-new-privileges" in fwd_host["SecurityOpt"] and fwd_host["Privileged"] is False
            assert sandbox.attrs["HostConfig"]["NetworkMode"] == f"container:{forwarders[0].id}"
            assert not any(m["Destination"].startswith("/run/forgetui-net") for m in sandbox.attrs["Mounts"])
        else:  # the port lives in the sandbox's own namespace; no second container
            assert forwarders == [] and sandbox.attrs["HostConfig"]["NetworkMode"] == "none"
    finally:
        await sb.stop()
        await docker_runtime.reap(run_id=run_id)
    assert docker_client.containers.list(all=True, filters={"label": f"{L.RUN}={run_id}"}) == []
    if helper == "auto":  # the listener went with the sandbox: the port is closed, the namespace can go
        assert sb._ports.proxy_listener is None


async def test_isolated_without_a_proxy_has_no_network(docker_runtime, base_image, run_id, host_service):
    sb = docker_runtime.create(SandboxSpec(image=base_image, run_id=run_id, rollout_id="none", owner="tester"))
    await sb.start()
    try:
        assert (await fetch(sb, f"http://127.0.0.1:{host_service}/")).get("error")
        assert (await sb.exec(["cat", "/proc/net/route"], timeout_s=10)).stdout.splitlines()[1:] == []
    finally:
        await sb.stop()


async def test_host_network_is_an_opt_in_with_a_warning(docker_runtime, base_image, run_id, host_service, caplog):
    sb = docker_runtime.create(SandboxSpec(image=base_image, run_id=run_id, rollout_id="host", owner="tester", network="host"))
    assert "can reach every service" in caplog.text
    await sb.start()
    try:  # what "isolated" prevents: with the host's network the same service answers
        seen = await fetch(sb, f"http://127.0.0.1:{host_service}/")
        assert seen.get("body") == "host-only secret"
    finally:
        await sb.stop()


def test_relay_carries_a_stream_both_ways() -> None:
    """The host end of the isolated network: bytes go through the unix socket to the proxy and back, unchanged."""
    from core.runtime.docker.network import HostRelay

    srv = socket.create_server(("127.0.0.1", 0))
    payload = bytes(range(256)) * 4096  # 1 MiB, every byte value

    def echo() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    relay = HostRelay("127.0.0.1", srv.getsockname()[1])
    try:
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(relay.path)
            threading.Thread(target=lambda: (c.sendall(payload), c.shutdown(socket.SHUT_WR)), daemon=True).start()
            got = bytearray()
            while data := c.recv(65536):
                got += data
        assert bytes(got) == payload
    finally:
        relay.close()
        srv.close()


async def test_a_killed_forwarder_is_the_sandbox_lost_not_the_harness_failing(
    docker_client, base_image, run_id, live_proxy, script_file
):
    from core.errors import SandboxError

    docker_runtime = runtime_with(docker_client, "forwarder")

    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    sb = docker_runtime.create(SandboxSpec(image=base_image, run_id=run_id, rollout_id="fwd", owner="tester", proxy=proxy.url))
    await sb.start()
    try:
        (forwarder,) = docker_client.containers.list(filters={"label": [f"{L.RUN}={run_id}", "forgetui.role=network"]})
        forwarder.kill()
        call = f"import urllib.request; urllib.request.urlopen('{proxy.url}/r/{proxy.token}/v1/models', timeout=5)"
        with pytest.raises(SandboxError, match="network forwarder"):
            await sb.exec(["python3", "-c", call], timeout_s=30)
    finally:
        await sb.stop()
        await docker_runtime.reap(run_id=run_id)
    assert docker_client.containers.list(all=True, filters={"label": f"{L.RUN}={run_id}"}) == []
