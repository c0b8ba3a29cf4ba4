"""Build a policy from a backend SPEC: builtin:MODEL, scripted:FILE, vllm:URL, litellm:MODEL."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from core.errors import ConfigError
from core.proxy.policy import PassthroughPolicy, Policy, TokenPolicy

BACKEND_KINDS = ("builtin", "scripted", "vllm", "litellm")


def parse_spec(spec: str) -> tuple[str, str, dict[str, str]]:
    """``kind:target?opt=v`` → (kind, target, options)."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in BACKEND_KINDS or not rest:
        raise ConfigError(f"backend spec {spec!r} is not one of builtin:MODEL, scripted:FILE, vllm:URL, litellm:MODEL")
    options: dict[str, str] = {}
    if kind in ("builtin", "scripted", "litellm") and "?" in rest:
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
    max_tokens = int(opts.get("max_tokens", default_max_tokens or 0)) or None
    if kind == "litellm":
        from core.backends.litellm_backend import LiteLLMBackend

        return PassthroughPolicy(
            LiteLLMBackend(target, api_base=opts.get("api_base"), api_key=opts.get("api_key"), token_ids=opts.get("token_ids") in ("1", "true"))
        )
    if kind == "builtin":
        from core.backends.builtin import BuiltinBackend

        backend = BuiltinBackend(target, device=opts.get("device", "auto"))
        default = max_tokens or (64 if target == "tiny" else 1024)
    elif kind == "scripted":
        from core.backends.scripted import ScriptedBackend

        path = Path(target).expanduser()
        if not path.is_file():
            raise ConfigError(f"scripted backend: no script file at {path}")
        backend = ScriptedBackend(path, tokenizer_model=opts.get("tokenizer", tokenizer or "tiny"))
        default = max_tokens or 4096
    else:
        from core.backends.vllm import VllmBackend

        if not (tokenizer or opts.get("tokenizer")):
            raise ConfigError("vllm:URL needs the policy's tokenizer: pass --tokenizer MODEL (a local folder, 'tiny', or a hub id)")
        backend = VllmBackend(target, tokenizer_model=tokenizer or opts["tokenizer"], model_name=opts.get("model"))
        default = max_tokens or 2048
    return TokenPolicy(backend, parser=opts.get("parser", parser), default_max_tokens=default)
