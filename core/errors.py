"""One error hierarchy for forgetui; every message says what to do next."""

from __future__ import annotations


class ForgetuiError(Exception):
    """Base of every error forgetui raises on purpose."""


class ConfigError(ForgetuiError):
    """A config file, a `--set` override or a CLI argument is wrong."""


class NoSuchVersionError(ConfigError):
    """A package version an install recipe asks for is not on its registry (npm, PyPI)."""


class StoreError(ForgetuiError):
    """The DuckDB store cannot be opened, written or queried."""


class ModelError(ForgetuiError):
    """A model or tokenizer cannot be found, built or loaded."""


class ProtocolError(ForgetuiError):
    """A request does not follow its wire protocol (maps to HTTP 400)."""

    status = 400
    kind = "invalid_request"


class AuthError(ProtocolError):
    """The rollout token in the URL or API key is unknown (HTTP 401)."""

    status = 401
    kind = "authentication"


class NotFoundError(ProtocolError):
    """The route or model does not exist (HTTP 404)."""

    status = 404
    kind = "not_found"


class BodyTooLargeError(ProtocolError):
    """The request body is over the proxy's limit (HTTP 413)."""

    status = 413
    kind = "too_large"


class ContextLengthError(ProtocolError):
    """The rendered prompt does not fit the model's context (HTTP 400)."""

    status = 400
    kind = "context_length"

    def __init__(self, prompt_tokens: int | None = None, limit: int | None = None, *, upstream: str | None = None) -> None:
        """The proxy's own count against the limit, or an upstream provider's refusal (its message)."""
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        what = f"{prompt_tokens} tokens > {limit} maximum (this model's context length)" if upstream is None else f"the upstream model refused it: {upstream}"
        super().__init__(f"prompt is too long: {what}; shorten the conversation or use a model with a longer context")


class BackendError(ForgetuiError):
    """The policy backend failed or could not be reached (HTTP 502)."""

    status = 502
    kind = "backend"


class RateLimitedError(BackendError):
    """The upstream provider refused the call for its rate limit (HTTP 429; its Retry-After is passed on)."""

    status = 429
    kind = "rate_limit"

    def __init__(self, message: str, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SandboxError(ForgetuiError):
    """A sandbox could not be created, reached or cleaned up (an infrastructure error)."""


class TrainingDataError(ForgetuiError):
    """Recorded calls cannot become training samples (no token ids or no logprobs for what was sampled)."""


class UntrainableBackendError(TrainingDataError):
    """The policy backend does not return what training needs (sampled token ids, their logprobs): found before any rollout."""
