"""Build a policy from a backend SPEC: builtin:MODEL, scripted:FILE, vllm:URL, litellm:MODEL, replay:ROLLOUT_ID."""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from core.backends.base import TokenBackend
from core.errors import ConfigError
from core.proxy.policy import PassthroughPolicy, Policy, TokenPolicy
from core.secrets import REDACTED, key_from_env, redact_text

log = logging.getLogger(__name__)

BACKEND_KINDS = ("builtin", "scripted", "vllm", "litellm", "replay")
DEFAULT_UPSTREAM_TIMEOUT_S = 600.0


def parse_spec(spec: str) -> tuple[str, str, dict[str, str]]:
    """``kind:target?opt=v`` → (kind, target, options)."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in BACKEND_KINDS or not rest:
        raise ConfigError(f"backend spec {redact_text(spec)!r} is not one of builtin:MODEL, scripted:FILE, vllm:URL, litellm:MODEL, replay:ROLLOUT_ID")
    options: dict[str, str] = {}
    if kind in ("builtin", "scripted", "litellm", "replay") and "?" in rest:
        rest, _, query = rest.partition("?")
        options = dict(parse_qsl(query))
    elif kind == "vllm":
        parts = urlsplit(rest)
        options = dict(parse_qsl(parts.query))
        rest = parts._replace(query="").geturl()
    return kind, rest, options


def make_policy(spec: str, *, parser: str = "hermes", tokenizer: str | None = None, default_max_tokens: int | None = None) -> Policy:
    """The policy behind a proxy. `tokenizer` names the policy's model for vllm (it templates locally)."""
    kind, target, opts = parse_spec(spec)
    if kind == "litellm":
        from core.backends.litellm_backend import LiteLLMBackend

        return PassthroughPolicy(
            LiteLLMBackend(target, api_base=opts.get("api_base"), api_key=api_key(opts), token_ids=opts.get("token_ids") in ("1", "true"), timeout=upstream_timeout(opts), vision=flag(opts, "vision"))
        )
    backend = make_token_backend(spec, tokenizer=tokenizer)
    return token_policy(backend, spec, parser=parser, default_max_tokens=default_max_tokens)


def make_token_backend(spec: str, *, tokenizer: str | None = None) -> TokenBackend:
    """The token backend of a spec (builtin, scripted, vllm): what a trainer holds to swap its weights."""
    kind, target, opts = parse_spec(spec)
    if kind == "litellm":
        raise ConfigError(f"{redact_text(spec)!r} is a passthrough backend: it returns text, not the token ids and logprobs training needs; use builtin:MODEL or vllm:URL")
    if kind == "builtin":
        from core.backends.builtin import BuiltinBackend

        return BuiltinBackend(target, device=opts.get("device", "auto"))
    if kind == "scripted":
        from core.backends.scripted import ScriptedBackend

        path = Path(target).expanduser()
        if not path.is_file():
            raise ConfigError(f"scripted backend: no script file at {path}")
        return ScriptedBackend(path, tokenizer_model=opts.get("tokenizer", tokenizer or "tiny"))
    if kind == "replay":  # a recorded rollout's answers, token for token (`forgetui replay`); option store=PATH
        from core.analytics.replay import load_recording, replay_backend

        return replay_backend(load_recording(target, Path(opts["store"]) if "store" in opts else None))
    from core.backends.vllm import VllmBackend

    if not (tokenizer or opts.get("tokenizer")):
        raise ConfigError("vllm:URL needs the policy's tokenizer: pass --tokenizer MODEL (a local folder, 'tiny', or a hub id)")
    return VllmBackend(target, tokenizer_model=tokenizer or opts["tokenizer"], model_name=opts.get("model"), timeout=upstream_timeout(opts), api_key=api_key(opts))


def api_key(opts: dict[str, str]) -> str | None:
    """The upstream's key: from the environment variable `api_key_env` names, else an inline `api_key` (discouraged)."""
    if opts.get("api_key_env"):
        return key_from_env(opts["api_key_env"])
    if opts.get("api_key") == REDACTED:
        raise ConfigError("this backend spec's api_key was redacted when it was stored (keys never are): name the key's environment variable with api_key_env=NAME")
    if opts.get("api_key"):
        log.warning("the backend spec carries its API key inline; it is redacted wherever shown, but prefer api_key_env=NAME (the key stays in the environment)")
    return opts.get("api_key")


def flag(opts: dict[str, str], key: str) -> bool | None:
    """A yes/no spec option (``1``/``true``/``yes`` or ``0``/``false``/``no``); None when it is not given."""
    raw = opts.get(key)
    if raw is None:
        return None
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise ConfigError(f"{key}={raw!r} in the backend spec must be 1 or 0 (true or false)")


def upstream_timeout(opts: dict[str, str]) -> float:
    """Seconds an upstream may stay silent before the call fails (`timeout=` in the spec; default 600)."""
    raw = opts.get("timeout")
    if raw is None:
        return DEFAULT_UPSTREAM_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigError(f"timeout={raw!r} in the backend spec must be a number of seconds > 0")
    return value


def public_model_name(spec: str) -> str:
    """The model name `/v1/models` shows for a spec: no options (keys), no host paths."""
    kind, target, opts = parse_spec(spec)
    if kind in ("builtin", "scripted", "replay"):
        return Path(target).name or kind
    if kind == "vllm":
        return opts.get("model") or "vllm"
    return target


def token_policy(backend: TokenBackend, spec: str, *, parser: str = "hermes", default_max_tokens: int | None = None, temperature: float | None = None) -> TokenPolicy:
    """The token policy over a backend built from `spec` (its options pick the parser and the default cap)."""
    kind, target, opts = parse_spec(spec)
    max_tokens = int(opts.get("max_tokens", default_max_tokens or 0)) or None
    default = max_tokens or {"builtin": 64 if target in ("tiny", "tiny-vl") else 1024, "scripted": 4096}.get(kind, 2048)
    return TokenPolicy(backend, parser=opts.get("parser", parser), default_max_tokens=default, temperature=temperature)
