"""The policy behind a proxy, from a parsed backend spec: a token policy over a token backend, or a passthrough."""

from __future__ import annotations

import logging

from core.backends.base import TokenBackend
from core.backends.spec import PolicySpec, build_backend
from core.models.resolve import declared_max_tokens
from core.proxy.policy import PassthroughPolicy, Policy, TokenPolicy

log = logging.getLogger(__name__)


def make_policy(spec: PolicySpec, *, parser: str = "hermes", tokenizer: str | None = None, default_max_tokens: int | None = None) -> Policy:
    """The policy behind a proxy. `tokenizer` names the policy's model where the spec does not (vllm templates locally)."""
    backend = build_backend(spec, tokenizer=tokenizer)
    if spec.declared.path == "passthrough":
        return PassthroughPolicy(backend)
    return token_policy(backend, spec, parser=parser, default_max_tokens=default_max_tokens)


def default_max_tokens_for(spec: PolicySpec, configured: int | None = None) -> int:
    """The completion cap when the harness asks for none — the one rule, for every proxy, replay and veRL worker:
    the spec's `max_tokens`, else `policy.max_tokens`, else what a built-in model declares, else the kind's default."""
    if "max_tokens" in spec.options:
        return int(spec.options["max_tokens"])
    if configured:
        return configured
    declared = declared_max_tokens(spec.target) if spec.kind == "builtin" else None
    return declared or spec.declared.default_max_tokens


def token_policy(backend: TokenBackend, spec: PolicySpec, *, parser: str = "hermes", default_max_tokens: int | None = None, temperature: float | None = None) -> TokenPolicy:
    """The token policy over a backend built from `spec` (its options pick the tool-call and reasoning parsers and the default cap).

    The only place a `TokenPolicy` is made: the proxy, replay and the veRL worker all come here with the run's spec."""
    return TokenPolicy(
        backend,
        parser=spec.options.get("parser", parser),
        default_max_tokens=default_max_tokens_for(spec, default_max_tokens),
        temperature=temperature,
        reasoning=spec.options.get("reasoning"),
    )
