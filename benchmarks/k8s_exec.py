"""What running commands detached costs a Kubernetes pod: an exec that survives a cut stream, against a plain one.

    .venv/bin/python benchmarks/k8s_exec.py [--n 40] [--json out.json]

``KubernetesSandbox.exec`` runs each command detached in the pod (core.runtime.k8s.detached): the launch exec
starts it in the background with its output going to files, waits for it, then reports the bytes; a cut
stream costs a poll instead of the rollout. Before, a command ran attached: one exec that unpacked its
script and ran it in the foreground (``ATTACHED`` below, the same upload). Both go through the same
websocket client to the API server stand-in (tests/k8s_apiserver.py), whose execs are ``docker exec``s in a
real container, so the ratio is what the extra shell work in the pod costs per command, not a cluster's
round trip (which both pay once for a short command). Printed: median ms per command for each, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# what `exec` ran before: unpack the script, run it in the foreground on the same stream
ATTACHED = 'head -c "$1" | tar xf - -C / || exit 126; exec sh "$2" </dev/null'


async def _measure(n: int) -> dict[str, float]:
    import docker
    from kubernetes import client

    from core.runtime import _common as C
    from core.runtime.base import SandboxSpec
    from core.runtime.k8s.runtime import KubernetesRuntime
    from core.runtime.k8s.sandbox import command_script
    from tests.k8s_apiserver import ApiServerStandIn

    with ApiServerStandIn(docker.from_env()) as server:
        api = client.ApiClient(client.Configuration(host=server.url))
        rt = KubernetesRuntime(namespace="bench", api_client=api, poll_interval_s=0.05, network_policy=False)
        sb = rt.create(SandboxSpec(image="forgetui/base:bookworm", run_id="bench", rollout_id="exec", owner="bench"))
        await sb.start()

        async def attached() -> None:
            script = f"/tmp/.forgetui-exec-{secrets.token_hex(6)}.sh"
            archive = C.tar_files([(script.lstrip("/"), command_script(["true"], "/workspace", {}, 30, script, None).encode(), 0o600)])
            code, _, _ = await sb._run(["sh", "-c", ATTACHED, "sh", str(len(archive)), script], archive, 60)
            assert code == 0

        async def detached() -> None:
            assert (await sb.exec(["true"], timeout_s=30)).exit_code == 0

        times: dict[str, list[float]] = {"attached": [], "detached": []}
        for _ in range(3):  # warm up both
            await attached()
            await detached()
        for _ in range(n):  # interleaved: the machine's load moves both alike
            for name, run in (("attached", attached), ("detached", detached)):
                started = time.perf_counter()
                await run()
                times[name].append(time.perf_counter() - started)
        await sb.stop()
    out = {f"{k}_ms": round(statistics.median(v) * 1000, 1) for k, v in times.items()}
    out["ratio"] = round(out["detached_ms"] / out["attached_ms"], 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="commands of each kind")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args()
    result = asyncio.run(_measure(args.n))
    print(f"attached {result['attached_ms']} ms, detached {result['detached_ms']} ms per `true` (median of {args.n}): {result['ratio']}x")
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
