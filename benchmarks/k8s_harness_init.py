"""What the `init` harness mount costs a Kubernetes pod: the init container's copy, against a bare container start.

    .venv/bin/python benchmarks/k8s_harness_init.py --image forgetui/openclaw:<hash> [--repeat 3] [--uid 1000] [--json out.json]

With ``runtime.kubernetes.harness_mount = "init"`` every pod first runs the harness image as an init
container that copies ``/opt/forgetui`` and ``/usr/local/bin`` into an emptyDir (core.runtime.k8s.harness
INIT_SCRIPT). This runs exactly that script on the local Docker engine, into a fresh volume, the way a
kubelet would (the image already on the node), and times it against ``true`` in the same image (the
container start every pod pays anyway); it reports the bytes copied. ``image`` volumes copy nothing.
The image must be a harness image (a harness layer on the base image); nothing is pulled, nothing is
removed but the volumes it makes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _timed(client, image: str, command: list[str], volume: str | None, uid: int | None) -> float:
    volumes = {volume: {"bind": "/mnt/forgetui-harness", "mode": "rw"}} if volume else None
    started = time.perf_counter()
    client.containers.run(image, command, volumes=volumes, remove=True, network_mode="none", user=None if uid is None else f"{uid}:{uid}")
    return time.perf_counter() - started


def _size(client, volume: str) -> int:
    mountpoint = client.volumes.get(volume).attrs["Mountpoint"]
    out = subprocess.run(["du", "-sb", mountpoint], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def main() -> int:
    import docker

    from core.runtime.k8s.harness import INIT_SCRIPT

    parser = argparse.ArgumentParser()
    parser.add_argument("--image", required=True, help="a harness image on this engine (forgetui/<harness>:<hash>)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--uid", type=int, default=None, help="copy as this uid (pod_security = restricted runs as 1000)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    client = docker.from_env()
    start_s, copy_s, size = [], [], 0
    for _ in range(args.repeat):
        start_s.append(_timed(client, args.image, ["true"], None, args.uid))
        volume = client.volumes.create(name=f"forgetui-bench-init-{uuid.uuid4().hex[:8]}").name
        try:
            if args.uid is not None:  # an emptyDir is world-writable
                client.containers.run(args.image, ["chmod", "1777", "/v"], volumes={volume: {"bind": "/v", "mode": "rw"}}, remove=True, network_mode="none")
            copy_s.append(_timed(client, args.image, ["sh", "-c", INIT_SCRIPT], volume, args.uid))
            size = _size(client, volume)
        finally:
            client.volumes.get(volume).remove(force=True)
    result = {
        "image": args.image,
        "uid": args.uid,
        "copied_mb": round(size / 1e6, 1),
        "container_start_s": round(statistics.median(start_s), 2),
        "init_copy_s": round(statistics.median(copy_s), 2),
        "init_over_start": round(statistics.median(copy_s) / statistics.median(start_s), 2),
        "repeat": args.repeat,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
