"""Per-task images × harnesses: disk and build time with the harness baked into every task image (before)
and with the harness in one shared read-only volume (after, `runtime.shared_harness`, the default).

    FORGETUI_HOME=.test-home .venv/bin/python benchmarks/suite_images.py [--tasks 20] [--before-tasks 3] \\
        [--harness react,claude-code,codex] [--json out.json]

Generates small harbor-style tasks (each its own Dockerfile FROM the base image with one task file
COPYed in), then for each harness:

* before — what forgetui did: build each task image, then the harness layer on top of it (a copy of
  the harness per task image). Measured on `--before-tasks` tasks (default 3: each copy costs the
  harness's full size, 20 × 3 harnesses would take ~25 GB on this disk); the per-task figures are
  exact, the 20-task totals are that figure × 20 and printed as extrapolated.
* after — build each task image alone, and fill the harness volume once (from the harness image,
  which is removed afterwards unless it was already on the engine).

Disk is what the engine reports (`docker system df -v`: an image's unique bytes, a volume's size).
Floor: the harness's bytes are stored once, and a task's sandbox image with the harness costs no
more than the task image alone + 10 MB (it *is* the task image: the harness is a mount). Build and
fill steps run with no network (recipes install on the host and only copy in). The benchmark's own
images are removed at the end; the harness volumes stay (they are forgetui's cache).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BASE = "forgetui/base:bookworm"
FLOOR_EXTRA_BYTES = 10 * 1024 * 1024


def make_tasks(root: Path, n: int, run_tag: str) -> list[tuple[str, str, Path]]:
    """`n` task recipes: (name, Dockerfile, context), each with its own small data file."""
    out = []
    for i in range(n):
        ctx = root / f"task-{i:02d}"
        ctx.mkdir(parents=True)
        (ctx / "data.txt").write_text(f"{run_tag} task {i}\n" + "x" * 2048 * (i + 1))
        out.append((f"bench-suite-{run_tag}-{i:02d}", f"FROM {BASE}\nWORKDIR /app\nCOPY data.txt /app/data.txt\n", ctx))
    return out


def unique_bytes(client, tags: list[str]) -> dict[str, int]:
    """tag → bytes only that image holds (Size − SharedSize, as `docker system df -v` shows)."""
    wanted = {client.images.get(t).id: t for t in tags}
    out = {}
    for image in client.df()["Images"]:
        if image["Id"] in wanted:
            shared = image.get("SharedSize", -1)
            out[wanted[image["Id"]]] = image["Size"] - (shared if shared and shared > 0 else 0)
    return out


def volume_bytes(client, name: str) -> int:
    for volume in client.df()["Volumes"] or []:
        if volume["Name"] == name:
            return int((volume.get("UsageData") or {}).get("Size", -1))
    return -1


def measure(client, harness_name: str, tasks: list[tuple[str, str, Path]], before_n: int) -> dict:
    from core.registry import load_harness
    from core.runtime import harness_volume as HV
    from core.runtime.images import ensure_dockerfile_image, ensure_image, image_exists, image_tag

    layer = load_harness(harness_name).image_layer()
    task_tags = []
    t = time.perf_counter()
    for name, dockerfile, ctx in tasks:
        task_tags.append(ensure_dockerfile_image(client, name, dockerfile, ctx))
    task_build_s = time.perf_counter() - t
    task_bytes = unique_bytes(client, task_tags)

    # before: a copy of the harness on top of each task image
    baked, baked_times = [], []
    for tag in task_tags[:before_n]:
        t = time.perf_counter()
        baked.append(ensure_image(client, tag, [layer], network_mode="none"))
        baked_times.append(time.perf_counter() - t)
    baked_bytes = unique_bytes(client, baked)
    per_task_baked = [baked_bytes[b] + task_bytes[t] for b, t in zip(baked, task_tags, strict=False)]

    # after: the harness once, in a volume (cold: an unused volume of this harness is removed first)
    name = HV.volume_name(BASE, [layer])
    try:
        client.volumes.get(name).remove()
        cold = True
    except Exception:  # noqa: BLE001 - absent (cold anyway) or in use by a live sandbox (then it is reused)
        cold = not any(v.name == name for v in client.volumes.list())
    had_image = image_exists(client, image_tag(BASE, [layer]))
    t = time.perf_counter()
    HV.ensure_harness_volume(client, BASE, [layer])
    fill_s = time.perf_counter() - t
    vol = volume_bytes(client, name)
    # proof it works: the harness's command resolves in a task image's sandbox with only the volume mounted
    probe = client.containers.run(task_tags[0], ["sh", "-c", "ls /opt/forgetui/bin | head -5"], volumes={name: {"bind": HV.MOUNT, "mode": "ro"}},
                                  environment={"PATH": HV.sandbox_path(client, task_tags[0])}, network_mode="none", remove=True).decode().split()
    for tag in baked:
        client.images.remove(tag)
    n = len(tasks)
    mean_task = sum(task_bytes.values()) / len(task_bytes)
    mean_baked = sum(per_task_baked) / len(per_task_baked) if per_task_baked else 0.0
    return {
        "harness": harness_name,
        "tasks": n,
        "task_image_bytes_mean": mean_task,
        "task_images_build_s": round(task_build_s, 2),
        "before_measured_tasks": len(baked),
        "before_per_task_bytes": mean_baked,
        "before_per_task_build_s": round(sum(baked_times) / len(baked_times), 2) if baked_times else None,
        "before_total_bytes_extrapolated": mean_baked * n,
        "before_total_build_s_extrapolated": round(sum(baked_times) / len(baked_times) * n + task_build_s, 1) if baked_times else None,
        "after_volume": name,
        "after_volume_bytes": vol,
        "after_volume_cold": cold,
        "after_harness_image_was_present": had_image,
        "after_fill_s": round(fill_s, 2),
        "after_per_task_bytes": mean_task,  # the sandbox image is the task image: the harness adds 0 bytes
        "after_total_bytes": vol + sum(task_bytes.values()),
        "after_total_build_s": round(fill_s + task_build_s, 1),
        "probe_bin": probe,
        "_task_tags": task_tags,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--before-tasks", type=int, default=3, help="tasks measured with the harness baked in (each copy is the harness's full size)")
    parser.add_argument("--harness", default="react,claude-code,codex")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import docker

    client = docker.from_env(timeout=600)
    run_tag = f"{int(time.time()) % 100000}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tasks = make_tasks(Path(tmp), args.tasks, run_tag)
        for name in args.harness.split(","):
            rows.append(measure(client, name.strip(), tasks, min(args.before_tasks, args.tasks)))
            print(f"measured {name}", file=sys.stderr, flush=True)
    for tag in {t for r in rows for t in r.pop("_task_tags")}:
        client.images.remove(tag)

    mb = 1e6
    n = args.tasks
    measured = rows[0]["before_measured_tasks"]
    how = "measured on every task" if measured == n else f"measured on {measured} tasks per harness, ×{n} extrapolated"
    print(f"\n{n} per-task-image tasks × {len(rows)} harnesses (before: {how})\n")
    print("| harness | harness in volume (MB, once) | before: task image + harness (MB) | after: task image, harness mounted (MB) | before: total (MB) | after: total (MB) | ratio | before: build (s) | after: build + fill (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["before_total_bytes_extrapolated"] / r["after_total_bytes"] if r["after_total_bytes"] > 0 else float("nan")
        print(f"| {r['harness']} | {r['after_volume_bytes'] / mb:.2f} | {r['before_per_task_bytes'] / mb:.2f} | {r['after_per_task_bytes'] / mb:.3f} | "
              f"{r['before_total_bytes_extrapolated'] / mb:.1f} | {r['after_total_bytes'] / mb:.1f} | {ratio:.1f}× | "
              f"{r['before_total_build_s_extrapolated']} | {r['after_total_build_s']} |")
    before = sum(r["before_total_bytes_extrapolated"] for r in rows)
    after = sum(r["after_total_bytes"] for r in rows)
    label = "measured" if measured == n else "extrapolated"
    print(f"\nall harnesses: before {before / 1e9:.2f} GB ({label}), after {after / 1e9:.3f} GB: {before / after:.0f}× less disk")
    b_s = sum(r["before_total_build_s_extrapolated"] or 0 for r in rows)
    a_s = sum(r["after_total_build_s"] for r in rows)
    print(f"build time: before {b_s:.0f} s ({label}), after {a_s:.0f} s: {b_s / a_s:.0f}× faster"
          f" (task images: {sum(r['task_images_build_s'] for r in rows):.1f} s in all; harness images already on the engine: "
          f"{', '.join(r['harness'] for r in rows if r['after_harness_image_was_present']) or 'none'} — their one build is not in 'after')")
    ok = all(r["after_per_task_bytes"] <= r["task_image_bytes_mean"] + FLOOR_EXTRA_BYTES and r["after_volume_bytes"] > 0 for r in rows)
    print(f"floor (harness stored once; a task image with the harness ≤ task image + 10 MB): {'met' if ok else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
