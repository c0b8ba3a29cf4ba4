"""Policy backend specs, parsed once: ``kind:target?option=value&...`` → a typed `PolicySpec`.

The kinds (builtin, scripted, vllm, litellm, replay, and any a package registers) are declared in
`core.backends.kinds`; a spec names one, a target (a model, a script file, a server URL, a rollout id)
and options. The config parses `policy.backend` into a `PolicySpec` when it loads, and every caller
reads that object instead of the string.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from core.backends.kinds import BACKENDS, BackendKind, backend_kind
from core.backends.vllm_server import ServerSettings, is_url
from core.errors import ConfigError
from core.models.precision import DTYPES
from core.options import positive, yes_no
from core.secrets import REDACTED, key_from_env, redact_text
from core.tokens.reasoning import check_reasoning_name

log = logging.getLogger(__name__)

DEFAULT_UPSTREAM_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class PolicySpec:
    """A parsed backend spec; `str(spec)` is the spec as written."""

    kind: str
    target: str
    options: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    raw: str = ""

    @classmethod
    def parse(cls, spec: str | PolicySpec) -> PolicySpec:
        """``kind:target?opt=v`` → a PolicySpec; ConfigError naming the kinds when it is not one."""
        if isinstance(spec, PolicySpec):
            return spec
        if Path(spec).expanduser().is_dir():  # a local model folder: the built-in backend serves it
            return cls("builtin", str(Path(spec).expanduser().resolve()), MappingProxyType({}), str(spec))
        kind_name, sep, rest = str(spec).partition(":")
        if not sep or not rest or kind_name not in BACKENDS:
            usages = ", ".join(backend_kind(n).usage for n in BACKENDS.names())
            raise ConfigError(f"backend spec {redact_text(str(spec))!r} is not one of {usages}")
        kind = backend_kind(kind_name)
        if kind.url_target:  # the target is a URL: its own query string holds the options
            parts = urlsplit(rest)
            options, rest = dict(parse_qsl(parts.query)), parts._replace(query="").geturl()
        else:
            rest, _, query = rest.partition("?")
            options = dict(parse_qsl(query))
        parsed = cls(kind_name, rest, MappingProxyType(options), str(spec))
        parsed.validate()
        return parsed

    def __str__(self) -> str:
        return self.raw

    def with_option(self, key: str, value: str) -> PolicySpec:
        """The same spec with one more option (as a config setting such as `policy.dtype` adds it)."""
        return PolicySpec(self.kind, self.target, MappingProxyType({**self.options, key: value}), self.raw)

    @property
    def declared(self) -> BackendKind:
        """What this spec's kind declares it can do."""
        return backend_kind(self.kind)

    @property
    def shown(self) -> str:
        """The spec as logs, reports and the TUI show it: any inline key redacted."""
        return redact_text(self.raw)

    def validate(self) -> None:
        """Options that must parse do (a bad timeout or flag fails when the config loads, not at the first call)."""
        self.timeout_s  # noqa: B018 - parses the option
        for key in ("vision", "token_ids"):
            self.flag(key)
        check_reasoning_name(self.options.get("reasoning"))
        if self.options.get("dtype", "auto") not in DTYPES:
            raise ConfigError(f"unknown dtype {self.options['dtype']!r} in the backend spec; use one of {', '.join(DTYPES)}")
        if "max_tokens" in self.options and not self.options["max_tokens"].isdigit():
            raise ConfigError(f"max_tokens={self.options['max_tokens']!r} in the backend spec must be a whole number")
        if self.managed:
            ServerSettings.from_options(self.target, self.options)  # a managed server's options parse now, not at its start

    @property
    def managed(self) -> bool:
        """A spec such as `vllm:MODEL` (not an http(s) URL): the project starts the server for MODEL itself."""
        return self.declared.managed_target and not is_url(self.target)

    def flag(self, key: str) -> bool | None:
        """A yes/no option (``1``/``true``/``yes`` or ``0``/``false``/``no``); None when it is not given."""
        return yes_no(self.options, key, "the backend spec")

    @property
    def timeout_s(self) -> float:
        """Seconds an upstream may stay silent before the call fails (`timeout=`; default 600)."""
        value = positive(self.options, "timeout", float, "the backend spec", unit="seconds")
        return DEFAULT_UPSTREAM_TIMEOUT_S if value is None else float(value)

    def api_key(self) -> str | None:
        """The upstream's key: from the environment variable `api_key_env` names, else an inline `api_key` (discouraged)."""
        if self.options.get("api_key_env"):
            return key_from_env(self.options["api_key_env"])
        inline = self.options.get("api_key")
        if inline == REDACTED:
            raise ConfigError("this backend spec's api_key was redacted when it was stored (keys never are): name the key's environment variable with api_key_env=NAME")
        if inline:
            log.warning("the backend spec carries its API key inline; it is redacted wherever shown, but prefer api_key_env=NAME (the key stays in the environment)")
        return inline

    def tokenizer_model(self, named: str | None = None) -> str | None:
        """The model whose tokenizer makes this policy's token ids: the kind says where it is named
        (the target, the `tokenizer` option, or `policy.tokenizer` = `named`); None when unknown."""
        source = self.declared.tokenizer_from
        if self.managed:  # the served model's own tokenizer, unless the spec names another
            return self.options.get("tokenizer") or self.target
        if source == "target":
            return self.target
        if source == "option-or-tiny":
            return self.options.get("tokenizer", named or "tiny")
        return self.options.get("tokenizer") or named

    def weights_source(self, named: str | None = None) -> str | None:
        """Where a trainer loads the policy's starting weights: the model folder, or the served model's local copy."""
        return self.target if self.declared.tokenizer_from == "target" or self.managed else self.tokenizer_model(named)

    @property
    def public_name(self) -> str:
        """The model name `/v1/models` shows: no options (keys), no host paths."""
        if self.managed:
            return self.options.get("model") or Path(self.target).name or self.kind
        if self.declared.url_target:
            return self.options.get("model") or self.kind
        if self.declared.path_target:
            return Path(self.target).name or self.kind
        return self.target

    def with_server_log(self, run_dir: Path) -> PolicySpec:
        """A managed server's spec with its log in the run's folder (`run_dir/vllm-server.log`) unless `log=` names one."""
        if not self.managed or "log" in self.options:
            return self
        return self.with_option("log", str(run_dir / "vllm-server.log"))

    def with_target(self, target: str) -> PolicySpec:
        """The same spec with another target (a relative script path made absolute, say)."""
        query = "&".join(f"{k}={v}" for k, v in self.options.items())
        return replace(self, target=target, raw=f"{self.kind}:{target}" + (f"?{query}" if query else ""))  # options already checked


def spec_or_none(spec: Any) -> PolicySpec | None:
    """A recorded run's spec (from `runs.config`), parsed; None when it is missing or no longer parses."""
    if not isinstance(spec, str):
        return None
    try:
        return PolicySpec.parse(spec)
    except ConfigError:
        return None


def build_backend(spec: PolicySpec, *, tokenizer: str | None = None) -> Any:
    """The backend a spec names, built (its model loaded, its server connected)."""
    return spec.declared.builder()(spec, tokenizer=tokenizer)


def build_token_backend(spec: PolicySpec, *, tokenizer: str | None = None) -> Any:
    """The token backend of a spec (what a trainer holds to swap its weights); ConfigError for a passthrough."""
    if spec.declared.path != "token":
        raise ConfigError(f"{spec.shown!r} is a passthrough backend: it returns text, not the token ids and logprobs training needs; use builtin:MODEL or vllm:URL|MODEL")
    return build_backend(spec, tokenizer=tokenizer)
