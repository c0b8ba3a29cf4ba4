"""Keep credentials out of everything forgetui shows or stores: backend specs, configs, logs.

Keys belong in the environment (`api_key_env=NAME` in a backend spec); a key written into a spec
(`api_key=sk-...`) or a URL's password still works but is replaced by `***` wherever it is shown.
"""

from __future__ import annotations

import os
import re
from typing import Any

from core.errors import ConfigError

REDACTED = "***"
SECRET_NAMES = ("api_key", "apikey", "key", "token", "access_token", "password", "secret", "client_secret")
_NAMES = "|".join(SECRET_NAMES)
_SECRET_OPTION = re.compile(rf"([?&;](?:{_NAMES})=)[^&#\s\"']*", re.I)
_URL_PASSWORD = re.compile(r"(://[^/:@\s\"']+:)[^@/\s\"']+@")
# config keys whose whole value is a secret (not bare `key`/`token`: a toleration's `key` is no secret)
_SECRET_KEY = re.compile(r"^(api_?key|access_token|auth_token|password|client_secret|secret_key)$", re.I)


def redact_text(text: str) -> str:
    """`text` with secret query options (`api_key=...`, `token=...`) and URL passwords replaced by `***`."""
    if "=" not in text and "@" not in text:
        return text
    return _URL_PASSWORD.sub(rf"\g<1>{REDACTED}@", _SECRET_OPTION.sub(rf"\g<1>{REDACTED}", text))


def redact(value: Any) -> Any:
    """A copy of a config-like value with secrets redacted: in every string, and whole values under secret-named keys."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and _SECRET_KEY.search(k) and v else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


def key_from_env(name: str | None) -> str | None:
    """The API key in environment variable `name` (None when no name is given); a ConfigError when it is unset."""
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"api_key_env={name}: the environment variable {name} is not set; export it before starting forgetui")
    return value
