"""What the isolated sandbox network costs: sandboxes that each make one HTTP call, isolated vs host network.

    .venv/bin/python benchmarks/sandbox_network.py [--sandboxes 16] [--concurrency 4] [--repeat 2]

Each sandbox (base image, harness-like entry) sends one request to an HTTP server on the host's
loopback, which stands in for the proxy, then the sandbox is removed. `host` is the opt-in without
isolation, the baseline measured in the same script; `isolated` is the default (as root: the proxy's
port opened in the sandbox's own namespace); `forwarder` is isolation through a forwarder container
per sandbox (what runs when forgetui is not root). Prints sandboxes per minute, start-to-answer p50
and each ratio to host (floor for `isolated`: >= 0.5x). Most of the cost is the network namespace
itself: compare `docker run --network none` with `--network host` on the same engine.
Needs a Docker engine and `forgetui images bootstrap`.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.runtime.base import Entry, SandboxSpec  # noqa: E402
from core.runtime.docker.runtime import DockerRuntime  # noqa: E402

BASE = "forgetui/base:bookworm"
FLOOR = 0.5
CALL = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=30).read()"


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


async def one(runtime: DockerRuntime, network: str, url: str, run_id: str) -> float:
    network = "isolated" if network == "forwarder" else network
    spec = SandboxSpec(image=BASE, run_id=run_id, rollout_id=uuid.uuid4().hex[:8], network=network, proxy=url, timeout_s=120)
    sb = runtime.create(spec)
    t0 = time.perf_counter()
    await sb.start(entry=Entry(["python3", "-c", CALL, url], 60.0, {}, "/"))
    res = await sb.wait_entry()
    took = time.perf_counter() - t0
    await sb.stop()
    if res.exit_code != 0:
        raise SystemExit(f"{network}: the call failed: {res.stderr[-500:]}")
    return took


async def phase(runtime: DockerRuntime, network: str, url: str, n: int, concurrency: int) -> tuple[float, list[float]]:
    slots = asyncio.Semaphore(concurrency)
    run_id = f"bench-net-{uuid.uuid4().hex[:8]}"

    async def limited() -> float:
        async with slots:
            return await one(runtime, network, url, run_id)

    t0 = time.perf_counter()
    times = await asyncio.gather(*(limited() for _ in range(n)))
    wall = time.perf_counter() - t0
    await runtime.reap(run_id=run_id)
    return n / wall * 60, list(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2, help="phases of each network, alternating; the median counts")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    runtimes = {"host": DockerRuntime(), "isolated": DockerRuntime(), "forwarder": DockerRuntime(network_helper="forwarder")}
    rates: dict[str, list[float]] = {k: [] for k in runtimes}
    p50s: dict[str, list[float]] = {k: [] for k in runtimes}
    for _ in range(args.repeat):
        for network, runtime in runtimes.items():
            rate, times = asyncio.run(phase(runtime, network, url, args.sandboxes, args.concurrency))
            rates[network].append(rate)
            p50s[network].append(statistics.median(times))
    for runtime in runtimes.values():
        runtime.close()
    server.shutdown()
    med = {k: statistics.median(v) for k, v in rates.items()}
    for network in runtimes:
        print(f"{network:9s} {med[network]:6.1f} sandboxes/min  start-to-answer p50 {statistics.median(p50s[network]):.2f} s"
              f"  {med[network] / med['host']:.2f}x host")
    ratio = med["isolated"] / med["host"]
    print(f"isolated / host: {ratio:.2f}x (floor {FLOOR}x)")
    return 0 if ratio >= FLOOR else 1


if __name__ == "__main__":
    raise SystemExit(main())
