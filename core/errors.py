"""One error hierarchy for forgetui; every message says what to do next."""

from __future__ import annotations

import re

# The HTTP status of each error kind: the one table every answer reads (the proxy's, each wire
# protocol's error shape, the live query endpoint's). An error class names its kind; its status follows.
KIND_STATUS: dict[str, int] = {
    "invalid_request": 400,
    "context_length": 400,
    "authentication": 401,
    "permission": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "too_large": 413,
    "rate_limit": 429,
    "server": 500,
    "backend": 502,
    "overloaded": 503,
    "timeout": 504,
    "insufficient_storage": 507,  # the store cannot record a call (a full disk): the proxy refuses it before running it
}


def status_of(kind: str) -> int:
    """The HTTP status of an error kind (500 for a kind the table does not know)."""
    return KIND_STATUS.get(kind, 500)


class ForgetuiError(Exception):
    """Base of every error forgetui raises on purpose; `kind` names it for an HTTP answer (its status: `status_of`)."""

    kind = "server"


class _Answered:
    """An error a server answers with: its `status` is its kind's, from `KIND_STATUS`."""

    kind: str

    @property
    def status(self) -> int:
        return status_of(self.kind)


class ConfigError(ForgetuiError):
    """A config file, a `--set` override or a CLI argument is wrong."""


class InvalidConfigError(ConfigError):
    """The run config does not validate; `problems` holds each (dotted key, message) pydantic reported."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class NoSuchVersionError(ConfigError):
    """A package version an install recipe asks for is not on its registry (npm, PyPI)."""


class StoreError(ForgetuiError):
    """The DuckDB store cannot be opened, written or queried."""


class StoreBusyError(StoreError):
    """A writer process holds the store and serves no live query endpoint now (starting or ending): try again shortly."""


class ModelError(ForgetuiError):
    """A model or tokenizer cannot be found, built or loaded."""


class ProtocolError(_Answered, ForgetuiError):
    """A request does not follow its wire protocol (HTTP 400)."""

    kind = "invalid_request"


class AuthError(ProtocolError):
    """The rollout token in the URL or API key is unknown (HTTP 401)."""

    kind = "authentication"


class NotFoundError(ProtocolError):
    """The route or model does not exist (HTTP 404)."""

    kind = "not_found"


class BodyTooLargeError(ProtocolError):
    """The request body is over the proxy's limit (HTTP 413)."""

    kind = "too_large"


class CallBudgetError(ProtocolError):
    """The rollout has made every model call `run.max_calls` allows (HTTP 403: clients do not retry it)."""

    kind = "permission"

    def __init__(self) -> None:
        # No number in the message: some harnesses retry an error whose text holds 429 or 5xx-like digits (pi does).
        super().__init__("this rollout has made every model call run.max_calls allows; forgetui ends it here and the verifier scores what it left")


class ContextLengthError(ProtocolError):
    """The rendered prompt does not fit the model's context (HTTP 400)."""

    kind = "context_length"

    def __init__(self, prompt_tokens: int | None = None, limit: int | None = None, *, upstream: str | None = None) -> None:
        """The proxy's own count against the limit, or an upstream provider's refusal (its message)."""
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        what = f"{prompt_tokens} tokens > {limit} maximum (this model's context length)" if upstream is None else f"the upstream model refused it: {upstream}"
        super().__init__(f"prompt is too long: {what}; shorten the conversation or use a model with a longer context")


class BackendError(_Answered, ForgetuiError):
    """The policy backend failed or could not be reached (HTTP 502)."""

    kind = "backend"


class RateLimitedError(BackendError):
    """The upstream provider refused the call for its rate limit (HTTP 429; its Retry-After is passed on)."""

    kind = "rate_limit"

    def __init__(self, message: str, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after_value(retry_after)


# Retry-After as RFC 9110 allows it: delay-seconds or an IMF-fixdate (the obsolete date forms are dropped)
_RETRY_AFTER = re.compile(r"[0-9]{1,10}|(Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-9]{2} [A-Z][a-z]{2} [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT")


def retry_after_value(value: object) -> str | None:
    """An upstream's Retry-After when it is one a client can be sent as it is; None for anything else (non-ASCII, bytes, junk)."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value if _RETRY_AFTER.fullmatch(value) else None


class SandboxError(ForgetuiError):
    """A sandbox could not be created, reached or cleaned up (an infrastructure error)."""


class TrainingDataError(ForgetuiError):
    """Recorded calls cannot become training samples (no token ids or no logprobs for what was sampled)."""


class UntrainableBackendError(TrainingDataError):
    """The policy backend does not return what training needs (sampled token ids, their logprobs): found before any rollout."""
