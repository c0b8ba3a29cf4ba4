"""runtime.egress_allow: an isolated Docker sandbox reaches named destinations through forgetui's egress proxy, and only those.

Only loopback and this test's own containers are contacted: the "outside" server is an HTTP server this test
starts on the host's loopback, reached under made-up names that the egress proxy's resolver hook maps; the
connector is instrumented, so a refused name is seen never to be connected to (nor even resolved). No test
connects to an outside or metadata address, not even to see it blocked.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from core.config import RunConfig
from core.errors import ConfigError
from core.runtime.base import SandboxSpec
from core.runtime.docker import egress as E
from tests.loopback import text_handler, threaded_http

# Runs in the sandbox: urllib requests (proxies from the environment, as any HTTP client takes them), a raw
# CONNECT tunnel to the egress port, and the sandbox's proxy variables; printed as one JSON object.
PROBE = r"""
import json, os, socket, sys, urllib.request, urllib.error
egress_port, proxy_url, urls = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
def get(url, body=None):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return {"status": r.status, "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode()}
    except Exception as e:
        return {"error": type(e).__name__ + ": " + str(e)}
out = {"env": {k: v for k, v in os.environ.items() if "proxy" in k.lower()}, "get": {u: get(u) for u in urls}}
if proxy_url:
    chat = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
    out["model"] = get(proxy_url, chat)
try:
    s = socket.create_connection(("127.0.0.1", egress_port), timeout=10)
    target = os.environ.get("TUNNEL", "")
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = s.recv(4096)
        if not data:
            break
        head += data
    status, _, rest = head.partition(b"\r\n\r\n")
    s.sendall(b"GET /through-the-tunnel HTTP/1.1\r\nHost: tunnel\r\nConnection: close\r\n\r\n")
    reply = rest
    while data := s.recv(65536):
        reply += data
    out["connect"] = {"status": status.split(b"\r\n")[0].decode(), "reply": reply.decode(errors="replace")}
except OSError as e:
    out["connect"] = {"error": type(e).__name__ + ": " + str(e)}
print(json.dumps(out))
"""


# stands for an outside service: answers with the path and Host header it saw
OUTSIDE = text_handler(lambda h: f"outside answers {h.path} for {h.headers.get('Host')}".encode())


@pytest.fixture
def outside() -> Iterator[int]:
    with threaded_http(OUTSIDE) as port:
        yield port


class Hooks:
    """The egress proxy's name lookup and connect, instrumented: made-up names map to addresses; every call is kept."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names
        self.resolved: list[str] = []
        self.connected: list[tuple[str, int]] = []

    def resolve(self, host: str, port: int) -> list[str]:
        self.resolved.append(host)
        if host not in self.names:
            raise socket.gaierror(f"{host}: unknown in this test")
        return self.names[host]

    def connect(self, address: str, port: int) -> socket.socket:
        self.connected.append((address, port))
        if address != "127.0.0.1":  # never: the proxy must have refused before connecting
            raise OSError(f"test refuses to connect to {address}")
        return socket.create_connection((address, port), timeout=5)


# --- patterns and addresses -------------------------------------------------------------------------------


def test_patterns_match_the_requested_name_and_port() -> None:
    policy = E.EgressPolicy(["pypi.org", "mirror.test:3142", "*.pythonhosted.org", "[::1]:8080"])
    assert policy.rule_for("pypi.org", 443) and policy.rule_for("pypi.org", 80)
    assert policy.rule_for("pypi.org", 8443) is None  # no port in the pattern: 80 and 443 only
    assert policy.rule_for("evil-pypi.org", 443) is None and policy.rule_for("pypi.org.evil.test", 443) is None
    assert policy.rule_for("mirror.test", 3142) and policy.rule_for("mirror.test", 443) is None
    assert policy.rule_for("files.pythonhosted.org", 443) and policy.rule_for("a.b.pythonhosted.org", 443)
    assert policy.rule_for("pythonhosted.org", 443) is None  # a wildcard is for subdomains only
    assert policy.rule_for("xpythonhosted.org", 443) is None
    assert policy.rule_for("::1", 8080)


@pytest.mark.parametrize(
    ("allow", "private", "message"),
    [
        (["10.0.0.0/8"], [], "runtime.kubernetes.egress_allow"),
        (["a.*.test"], [], "wildcard may only lead"),
        (["a.test:http"], [], "not a number"),
        (["*.a.test"], ["*.a.test"], "is a wildcard"),
        (["a.test"], ["b.test"], "add it there too"),
    ],
)
def test_bad_patterns_say_what_to_write(allow, private, message) -> None:
    with pytest.raises(ConfigError, match=message):
        E.EgressPolicy(allow, private)


def test_config_keys_and_where_they_apply() -> None:
    assert RunConfig().runtime.egress_allow == []  # nothing by default
    rc = RunConfig.model_validate({"runtime": {"egress_allow": "pypi.org, *.pythonhosted.org"}}).runtime
    assert rc.egress_allow == ["pypi.org", "*.pythonhosted.org"]
    for bad, message in [
        ({"network": "host"}, 'network = "isolated" only'),
        ({"kind": "kubernetes"}, "runtime.kubernetes.egress_allow"),
        ({"egress_allow_private": ["b.test"]}, "add it there too"),
    ]:
        with pytest.raises(Exception, match=message):
            RunConfig.model_validate({"runtime": {"egress_allow": ["a.test"], **bad}})


@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254", "fd20:ce::254", "100.100.100.200", "::ffff:169.254.169.254", "fe80::1"])
def test_metadata_and_link_local_are_refused_even_with_the_private_opt_in(address) -> None:
    assert "metadata" in (E.address_problem(address, private_ok=True) or "")


def test_private_addresses_need_the_opt_in() -> None:
    for address in ("127.0.0.1", "10.1.2.3", "192.168.0.1", "172.16.0.1", "::1", "100.64.0.1"):
        assert "egress_allow_private" in (E.address_problem(address, private_ok=False) or ""), address
        assert E.address_problem(address, private_ok=True) is None, address
    assert E.address_problem("0.0.0.0", private_ok=True) and E.address_problem("224.0.0.1", private_ok=True)
    assert E.address_problem("93.184.215.14", private_ok=False) is None  # a public address (classified, never contacted)


def test_sandbox_env_sends_http_clients_through_the_proxy_and_keeps_loopback_direct() -> None:
    env = E.sandbox_env(3128)
    assert {env[k] for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")} == {"http://127.0.0.1:3128"}
    assert env["NO_PROXY"] == env["no_proxy"] == "127.0.0.1,localhost"
    assert E.sandbox_port(8400) == 3128 and E.sandbox_port(3128) == 3129  # never the model proxy's port


# --- the proxy itself, over a socket pair (no Docker) ------------------------------------------------------


def _ask(gate: E.EgressGate, request: bytes) -> bytes:
    client, server = socket.socketpair()
    worker = threading.Thread(target=gate.handle, args=(server, "r1"), daemon=True)
    worker.start()
    client.sendall(request)
    reply = b""
    while data := client.recv(65536):
        reply += data
    client.close()
    worker.join(10)
    return reply


def test_gate_forwards_an_allowed_absolute_uri_and_refuses_the_rest_before_any_lookup(outside) -> None:
    hooks = Hooks({"allowed.test": ["127.0.0.1"]})
    gate = E.EgressGate(E.EgressPolicy([f"allowed.test:{outside}"], [f"allowed.test:{outside}"]), hooks.resolve, hooks.connect)
    ok = _ask(gate, f"GET http://allowed.test:{outside}/x?y=1 HTTP/1.1\r\nHost: elsewhere.test\r\nProxy-Connection: keep-alive\r\n\r\n".encode())
    assert ok.startswith(b"HTTP/1.1 200") and f"outside answers /x?y=1 for allowed.test:{outside}".encode() in ok
    denied = _ask(gate, f"GET http://other.test:{outside}/ HTTP/1.1\r\nHost: other.test\r\n\r\n".encode())
    assert denied.startswith(b"HTTP/1.1 403") and b"runtime.egress_allow" in denied
    https_uri = _ask(gate, f"GET https://allowed.test:{outside}/ HTTP/1.1\r\n\r\n".encode())
    assert https_uri.startswith(b"HTTP/1.1 400") and b"CONNECT" in https_uri
    assert hooks.resolved == ["allowed.test"] and hooks.connected == [("127.0.0.1", outside)]
    counts = gate.counts("r1")
    assert counts is not None and (counts["allowed"], counts["denied"]) == (1, 2)
    assert counts["destinations"][f"other.test:{outside}"] == {"denied": 1}


def test_the_run_writes_egress_counts_into_the_finished_rollout_meta() -> None:
    """RunSession._update_rollout: the counts go into the row that carries meta, and are taken out once written."""
    from core.session import RunSession

    gate = E.EgressGate(E.EgressPolicy(["a.test"]))
    gate._record(E.Decision("r1", "CONNECT", "b.test", 443, False, "not allowed"))
    written: list[dict] = []
    fake = SimpleNamespace(store=SimpleNamespace(upsert_rollout=written.append), runtime=SimpleNamespace(egress_counts=lambda rid: gate.counts(rid, pop=True)))
    RunSession._update_rollout(fake, {"rollout_id": "r1", "status": "running"})  # no meta: left alone
    RunSession._update_rollout(fake, {"rollout_id": "r1", "status": "done", "meta": {"exit_code": 0}})
    RunSession._update_rollout(fake, {"rollout_id": "r1", "status": "done", "meta": {"exit_code": 0}})
    assert "meta" not in written[0]
    assert written[1]["meta"] == {"exit_code": 0, "egress": {"allowed": 0, "denied": 1, "destinations": {"b.test:443": {"denied": 1}}}}
    assert written[2]["meta"] == {"exit_code": 0}


# --- from inside real isolated sandboxes ------------------------------------------------------------------


def _runtime(client, helper: str, hooks: Hooks | None = None):
    from core.runtime.docker.runtime import DockerRuntime

    runtime = DockerRuntime(client, network_helper=helper, egress_resolve=hooks and hooks.resolve, egress_connect=hooks and hooks.connect)
    if helper == "auto" and not runtime._netns_usable:
        pytest.skip("opening a port in a sandbox's namespace needs root and a local engine")
    return runtime


async def _probe(sb, egress_port: int, proxy_url: str, urls: list[str], tunnel: str = "") -> dict:
    res = await sb.exec(["python3", "-c", PROBE, str(egress_port), proxy_url, *urls], timeout_s=60, env={"TUNNEL": tunnel})
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.docker
@pytest.mark.parametrize("helper", ["auto", "forwarder"])
async def test_isolated_sandbox_reaches_allowed_names_only(helper, docker_client, base_image, run_id, live_proxy, script_file, outside):
    from core.runtime import labels as L

    hooks = Hooks({"allowed.test": ["127.0.0.1"], "meta.wild.test": ["169.254.169.254"], "ok.wild.test": ["127.0.0.1"]})
    runtime = _runtime(docker_client, helper, hooks)
    proxy = live_proxy(f"scripted:{script_file([{'text': 'model answers directly'}])}")
    spec = SandboxSpec(
        image=base_image, run_id=run_id, rollout_id="egress", owner="tester", proxy=proxy.url,
        egress_allow=[f"allowed.test:{outside}", f"*.wild.test:{outside}"], egress_allow_private=[f"allowed.test:{outside}"],
    )
    sb = runtime.create(spec)
    await sb.start()
    port = sb.egress_port
    allowed, denied, meta, wild = (f"http://{h}:{outside}/" for h in ("allowed.test", "denied.test", "meta.wild.test", "ok.wild.test"))
    try:
        seen = await _probe(sb, port, f"{proxy.url}/r/{proxy.token}/v1/chat/completions", [allowed + "hello", denied, meta, wild], f"allowed.test:{outside}")
    finally:
        await sb.stop()
        await runtime.reap(run_id=run_id)
    assert docker_client.containers.list(all=True, filters={"label": f"{L.RUN}={run_id}"}) == []

    assert seen["env"]["HTTP_PROXY"] == seen["env"]["https_proxy"] == f"http://127.0.0.1:{port}"
    assert seen["env"]["NO_PROXY"] == "127.0.0.1,localhost"
    got = seen["get"]
    assert got[allowed + "hello"] == {"status": 200, "body": f"outside answers /hello for allowed.test:{outside}"}
    assert got[denied]["status"] == 403 and f'"denied.test:{outside}"' in got[denied]["body"] and "runtime.egress_allow" in got[denied]["body"]
    assert got[meta]["status"] == 403 and "metadata" in got[meta]["body"]  # allowed by the wildcard, refused by address
    assert got[wild]["status"] == 403 and "egress_allow_private" in got[wild]["body"]  # a wildcard never opens loopback
    assert seen["connect"]["status"] == "HTTP/1.1 200 Connection established", seen["connect"]
    assert "outside answers /through-the-tunnel for tunnel" in seen["connect"]["reply"]
    # the model proxy answered directly (NO_PROXY), and recorded the call as usual
    assert seen["model"]["status"] == 200 and json.loads(seen["model"]["body"])["choices"][0]["message"]["content"] == "model answers directly"
    proxy.store.flush()
    assert proxy.store.cursor().execute("SELECT status FROM calls").fetchall() == [("ok",)]

    assert "denied.test" not in hooks.resolved  # refused on the name: not even looked up
    assert hooks.connected == [("127.0.0.1", outside)] * 2  # the GET and the tunnel; never the metadata address
    counts = runtime.egress_counts("egress")
    assert counts is not None and (counts["allowed"], counts["denied"]) == (2, 3)
    assert counts["destinations"][f"allowed.test:{outside}"] == {"allowed": 2}
    assert counts["destinations"][f"meta.wild.test:{outside}"] == {"denied": 1}
    assert runtime.egress_counts("egress") is None  # taken out once read


@pytest.mark.docker
async def test_without_egress_allow_there_is_no_proxy_variable_and_no_egress_port(docker_client, base_image, run_id, live_proxy, script_file, outside):
    runtime = _runtime(docker_client, "forwarder")  # works as any user; the listener mode is covered above
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    sb = runtime.create(SandboxSpec(image=base_image, run_id=run_id, rollout_id="plain", owner="tester", proxy=proxy.url))
    await sb.start()
    try:
        seen = await _probe(sb, E.SANDBOX_PORT, f"{proxy.url}/r/{proxy.token}/v1/chat/completions", [f"http://127.0.0.1:{outside}/"], f"allowed.test:{outside}")
    finally:
        await sb.stop()
        await runtime.reap(run_id=run_id)
    assert seen["env"] == {}
    assert seen["model"]["status"] == 200
    assert "error" in seen["get"][f"http://127.0.0.1:{outside}/"]  # the host's service stays out of reach
    assert "ConnectionRefused" in seen["connect"]["error"]  # nothing listens on the egress port
    assert runtime.egress_counts("plain") is None


# --- a whole run ------------------------------------------------------------------------------------------

SOLVE = r"""#!/bin/bash
# Fetch one allowed and one refused destination the way any tool would: through $HTTP_PROXY.
python3 - "$@" <<'PY'
import urllib.request, urllib.error
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        return f"refused {e.code}"
with open("/app/out.txt", "w") as f:
    f.write(get("http://127.0.0.2:PORT/data") + "\n" + get("http://127.0.0.3:PORT/data") + "\n")
PY
"""
CHECK = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/out.txt)" = "$(printf 'outside answers /data for 127.0.0.2:PORT\\nrefused 403')" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
cat /app/out.txt
"""


@pytest.mark.docker
def test_a_run_with_egress_allow_reaches_the_named_host_and_records_its_decisions(docker_client, base_image, tmp_path) -> None:
    """config → run → sandbox: a task's solution reaches an allowed address and is refused another; rollouts.meta.egress counts both."""
    import asyncio

    import duckdb

    from core.config import load_config
    from core.run import execute_run

    # the system resolver, no hook: an address literal
    with threaded_http(OUTSIDE, host="127.0.0.2") as port:
        task = tmp_path / "suite" / "fetch"
        for sub in ("environment", "solution", "tests"):
            (task / sub).mkdir(parents=True)
        (task / "task.toml").write_text("[agent]\ntimeout_sec = 60.0\n")
        (task / "instruction.md").write_text("fetch the data")
        (task / "environment" / "Dockerfile").write_text(f"FROM {base_image}\nWORKDIR /app\n")
        (task / "solution" / "solve.sh").write_text(SOLVE.replace("PORT", str(port)))
        (task / "tests" / "test.sh").write_text(CHECK.replace("PORT", str(port)))
        allowed = f'"127.0.0.2:{port}"'
        cfg = load_config(None, ["env.name=harbor", f"env.path={json.dumps(str(task.parent))}", 'harness.name="oracle"', "runtime.kind=docker",
                                 "run.max_retries=0", f"runtime.egress_allow=[{allowed}]", f"runtime.egress_allow_private=[{allowed}]"])
        summary = asyncio.run(execute_run(cfg))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        ((status, reward, verifier, egress),) = con.execute("SELECT status, reward, meta->>'verifier', meta->'$.egress' FROM rollouts").fetchall()
    finally:
        con.close()
    assert (status, reward) == ("done", 1.0), verifier
    assert json.loads(egress) == {
        "allowed": 1, "denied": 1,
        "destinations": {f"127.0.0.2:{port}": {"allowed": 1}, f"127.0.0.3:{port}": {"denied": 1}},
    }
