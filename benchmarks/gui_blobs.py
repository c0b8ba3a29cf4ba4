"""Screenshots are stored once: a 30-step GUI rollout through the real proxy and recorder, one new image per step.

    .venv/bin/python benchmarks/gui_blobs.py [--steps 30] [--kb 100]

A harness in GUI mode resends its whole history every call, so call k carries the k screenshots so
far (465 image parts over 30 calls). Each step sends an OpenAI chat request with a new `--kb` KB
PNG-signed image (incompressible bytes) through a live `ProxyApp` on loopback (scripted backend, a
real `Store`). The same conversation is run once without images as the baseline. Reported: store
bytes with images minus the baseline's, against the sum of the unique images' bytes (floor: ≤ 1.2×),
and the bytes the harness sent, for scale.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FLOOR = 1.2
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(folder: Path, steps: int, kb: int, images: bool) -> tuple[int, int, int]:
    """(store bytes, bytes sent, unique image bytes) of one conversation."""
    import httpx

    from core.backends.spec import PolicySpec
    from core.proxy.app import ProxyApp
    from core.proxy.factory import make_policy
    from core.proxy.server import BackgroundServer
    from core.proxy.sessions import SessionRegistry
    from core.store.writer import Store

    script = folder / "script.json"
    script.write_text(json.dumps({"turns": [{"tool_call": {"name": "click", "arguments": {"id": 4}}}], "loop": True}))
    path = folder / ("with.duckdb" if images else "without.duckdb")
    store = Store.open(path)
    store.insert_run("bench", {})
    sessions = SessionRegistry(run_id="bench", adhoc=False)
    session = sessions.register("rollout-1")
    store.upsert_rollout({"rollout_id": "rollout-1", "run_id": "bench", "status": "running", "token": session.token})
    server = BackgroundServer(ProxyApp(make_policy(PolicySpec.parse(f"scripted:{script}")), sessions, store))
    server.start()
    tools = [{"type": "function", "function": {"name": "click", "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}}}}]
    messages: list[dict] = [{"role": "system", "content": "You operate a web page."}]
    sent = unique = 0
    try:
        with httpx.Client(base_url=f"{server.url}/r/{session.token}/v1", timeout=120) as client:
            for step in range(steps):
                content: list[dict] = [{"type": "text", "text": f"screen {step}"}]
                if images:
                    shot = PNG_SIGNATURE + os.urandom(kb * 1024 - len(PNG_SIGNATURE))
                    unique += len(shot)
                    content.append({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(shot).decode()}})
                messages.append({"role": "user", "content": content})
                body = json.dumps({"model": "policy", "messages": messages, "tools": tools}).encode()
                sent += len(body)
                reply = client.post("/chat/completions", content=body, headers={"Content-Type": "application/json"})
                reply.raise_for_status()
                message = reply.json()["choices"][0]["message"]
                messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": message.get("tool_calls")})
                for call in message.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "clicked"})
    finally:
        server.stop()
        store.close()
    return path.stat().st_size, sent, unique


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kb", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with_bytes, sent, unique = run(folder, args.steps, args.kb, images=True)
        without_bytes, sent_text, _ = run(folder, args.steps, args.kb, images=False)
    extra = with_bytes - without_bytes
    ratio = extra / unique
    print(f"steps {args.steps}, one {args.kb} KB screenshot per step: {unique / 1e6:.2f} MB of unique images")
    print(f"harness sent {sent / 1e6:.1f} MB ({sent_text / 1e6:.2f} MB of it without the images)")
    print(f"store: {with_bytes / 1e6:.2f} MB with images, {without_bytes / 1e6:.2f} MB without: +{extra / 1e6:.2f} MB")
    print(f"ratio (store growth / unique image bytes): {ratio:.3f}  (floor ≤ {FLOOR}: {'met' if ratio <= FLOOR else 'NOT met'})")
    return 0 if ratio <= FLOOR else 1


if __name__ == "__main__":
    raise SystemExit(main())
