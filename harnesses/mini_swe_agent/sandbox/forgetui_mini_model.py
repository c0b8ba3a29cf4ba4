"""mini-swe-agent's model for forgetui's recording proxy: chat completions over `requests`, no LiteLLM.

This file runs inside the mini-swe-agent sandbox (copied into the image next to mini's own packages and
named with ``-c model.model_class=forgetui_mini_model.ProxyModel``); forgetui itself never imports it.
Why not mini's default LiteLLM model: ``import litellm`` costs every sandbox ~3 CPU-s before its first
call (3.3 of mini's 3.8 s of imports), and a two-call rollout cost the machine 6.6 busy CPU-s more with
it than with this class (benchmarks/mini_client.py, 2026-12-07). mini's own
OpenRouter model already speaks chat completions with `requests` -- its message preparation, tool-call
parsing, cost bookkeeping and retries are kept -- but posts to openrouter.ai with a 60 s limit; this
subclass posts to the proxy's URL with a limit of its own and stops retrying a request the proxy refused.
"""

from __future__ import annotations

import json
import os
from typing import Any

import requests
from minisweagent.models.openrouter_model import BASH_TOOL, OpenRouterAPIError, OpenRouterModel

DEFAULT_TIMEOUT_S = 600.0  # LiteLLM's default: a busy CPU sampler may take minutes for one call
RETRYABLE_4XX = {408, 409, 425, 429}  # timeout, conflict, too early, rate limit; every 5xx is retried too


class ProxyRejected(Exception):
    """The proxy answered 4xx (bad request, unknown rollout, body too large, ...): asking again cannot help."""


class ProxyModel(OpenRouterModel):
    """OpenRouterModel pointed at ``model_kwargs.api_base`` (else $OPENAI_BASE_URL), keyed by $OPENAI_API_KEY."""

    abort_exceptions = [*OpenRouterModel.abort_exceptions, ProxyRejected]

    def __init__(self, **kwargs: Any) -> None:
        model_kwargs = dict(kwargs.get("model_kwargs") or {})
        base = model_kwargs.pop("api_base", None) or os.environ.get("OPENAI_BASE_URL", "")
        if not base:
            raise ValueError("ProxyModel needs model.model_kwargs.api_base or OPENAI_BASE_URL")
        self.timeout_s = float(model_kwargs.pop("timeout", DEFAULT_TIMEOUT_S))
        super().__init__(**{**kwargs, "model_kwargs": model_kwargs})
        self._api_url = base.rstrip("/") + "/chat/completions"
        self._api_key = os.getenv("OPENAI_API_KEY", "")

    def _query(self, messages: list[dict[str, str]], **kwargs: Any) -> dict:
        payload = {"model": self.config.model_name, "messages": messages, "tools": [BASH_TOOL], **(self.config.model_kwargs | kwargs)}
        headers = {"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json"}
        try:
            response = requests.post(self._api_url, headers=headers, data=json.dumps(payload), timeout=self.timeout_s)
        except requests.exceptions.RequestException as e:
            raise OpenRouterAPIError(f"Request to {self._api_url} failed: {e}") from e
        if response.status_code >= 400:
            kind = OpenRouterAPIError if response.status_code >= 500 or response.status_code in RETRYABLE_4XX else ProxyRejected
            raise kind(f"HTTP {response.status_code} from {self._api_url}: {response.text[:2000]}")
        return response.json()
