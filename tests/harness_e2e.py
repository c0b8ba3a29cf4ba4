"""End-to-end harness checks: the toy `hello` task in a real Docker sandbox against the recording proxy."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from core.config import load_config
from core.eval.summary import RunSummary
from core.run import execute_run
from core.train.samples import samples_for_run
from core.train.types import Sample

HELLO_SCRIPT = [{"tool": "shell", "command": "echo hi > hello.txt"}, {"text": "I created hello.txt containing hi."}]


@dataclass
class HelloResult:
    summary: RunSummary
    rollout: dict[str, Any]
    calls: list[dict[str, Any]]
    samples: list[Sample]

    @property
    def merged(self) -> bool | None:
        """Whether the second call's prompt extended the first one token for token (a finding per harness)."""
        return self.calls[1]["extends_parent"] if len(self.calls) > 1 else None

    @property
    def first_request(self) -> dict[str, Any]:
        """The harness's first request body, as recorded."""
        return self.body(0, "request")

    def body(self, i: int, column: str) -> dict[str, Any]:
        """Call `i`'s recorded request or response body."""
        value = self.calls[i][column]
        return json.loads(value) if isinstance(value, str) else value

    def assert_one_sample(self) -> None:
        """Every call merged into one sample on one branch (each later call extends the one before)."""
        assert len(self.calls) >= 2 and len(self.samples) == 1, [(c["branch"], c["extends_parent"]) for c in self.calls]
        assert self.samples[0].n_calls == len(self.calls)
        assert {c["branch"] for c in self.calls} == {0} and all(c["extends_parent"] for c in self.calls[1:])

    def assert_solved(self, api: str) -> None:
        """The scripted run passed, over at least two recorded calls, each in `api` and token-exact."""
        assert self.rollout["status"] == "done", (self.rollout["error"], self.rollout["meta"])
        assert self.rollout["passed"] is True and self.rollout["reward"] == 1.0
        assert len(self.calls) >= 2
        for call in self.calls:
            assert call["api"] == api and call["status"] == "ok", call["error"]
            assert call["prompt_tokens"] > 0 and call["completion_tokens"] > 0

    def assert_protocol_kept(self, api: str) -> None:
        """A real (random) model's run: no infrastructure error, and every recorded call answered in `api`."""
        assert self.rollout["status"] != "infra_error", (self.rollout["error"], self.rollout["meta"])
        assert self.calls, self.rollout["meta"]
        for call in self.calls:
            assert call["api"] == api and call["status"] == "ok", call["error"]


def run_hello(
    harness: str, backend: str, tmp_path: Path, *, options: dict | None = None, timeout_s: float = 300, script: list | None = None, tokenizer: str | None = None,
    overrides: tuple[str, ...] = (),
) -> HelloResult:
    """Run the `hello` task once with `harness` in Docker; `backend` may be "scripted" for `script` (HELLO_SCRIPT) in `tokenizer`'s tokens.

    `overrides`: more `key=value` settings of the run config (e.g. "run.max_calls=1")."""
    if backend == "scripted":
        path = tmp_path / "hello-script.json"
        path.write_text(json.dumps({"turns": script or HELLO_SCRIPT}))
        backend = f"scripted:{path}" + (f"?tokenizer={tokenizer}" if tokenizer else "")
    config = load_config(
        None,
        [
            "env.name=toy",
            'env.tasks="hello"',
            f'harness.name="{harness}"',
            f'policy.backend="{backend}"',
            "runtime.kind=docker",
            f"run.timeout_s={timeout_s}",
            "run.max_retries=0",
            *overrides,
        ],
    )
    config.harness.options = options or {}
    summary = asyncio.run(execute_run(config))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        cols = [d[0] for d in con.execute("SELECT * FROM rollouts").description]
        rollout = dict(zip(cols, con.execute("SELECT * FROM rollouts").fetchone(), strict=True))
        cur = con.execute(
            "SELECT seq, api, status, error, len(prompt_token_ids) AS prompt_tokens, len(completion_token_ids) AS completion_tokens, "
            "completion_token_ids, extends_parent, branch, request, response FROM calls_full ORDER BY seq"
        )
        names = [d[0] for d in cur.description]
        calls = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        samples = samples_for_run(con, summary.run_id)
    finally:
        con.close()
    return HelloResult(summary, rollout, calls, samples)
