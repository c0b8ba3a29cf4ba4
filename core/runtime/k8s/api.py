"""The Kubernetes REST API through the official client: one configured client, timeouts, retries with backoff."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from core.errors import SandboxError
from core.runtime.k8s.config import KubernetesConfig

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_STATUSES = {429, 500, 502, 503, 504}
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 20.0


_TOKEN_LOCK = threading.Lock()
_locked_class: type | None = None


def _configuration_class() -> type:
    """``kubernetes.client.Configuration`` whose token lookups (where refresh hooks run) take one lock.

    The kubeconfig loader's hook runs an exec plugin (aws, gke-gcloud-auth-plugin, kubelogin) when the token is
    near its expiry, and the in-cluster one rereads the service-account token; neither locks, so concurrent
    execs and REST calls from many threads would each run the plugin at once and race on the token they
    store. A subclass rather than a wrapped hook: the loaders put their hook back on every refresh.
    """
    global _locked_class
    if _locked_class is None:
        from kubernetes import client

        class LockedConfiguration(client.Configuration):  # type: ignore[misc]
            def get_api_key_with_prefix(self, *args: Any, **kwargs: Any) -> str | None:  # (identifier[, alias]): 30.x has no alias
                with _TOKEN_LOCK:
                    return super().get_api_key_with_prefix(*args, **kwargs)

        _locked_class = LockedConfiguration
    return _locked_class


def load_configuration(cfg: KubernetesConfig) -> Any:
    """A ``kubernetes.client.Configuration`` from the kubeconfig (path, context) or the pod's service account."""
    from kubernetes import config

    conf = _configuration_class()()
    in_cluster = cfg.in_cluster
    if in_cluster is None:
        in_cluster = cfg.kubeconfig is None and _in_cluster_env()
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=conf)
        else:
            config.load_kube_config(config_file=cfg.kubeconfig, context=cfg.context, client_configuration=conf)
    except config.ConfigException as exc:
        raise SandboxError(
            f"cannot configure the Kubernetes client ({exc}): set runtime.kubernetes.kubeconfig (or $KUBECONFIG) "
            "and runtime.kubernetes.context, or run inside the cluster"
        ) from exc
    return conf


def _in_cluster_env() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and Path(
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ).exists()


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an ApiException (None for connection errors and timeouts)."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and status > 0 else None


def _retry_after(exc: BaseException) -> float | None:
    headers = getattr(exc, "headers", None) or {}
    try:
        value = headers.get("Retry-After") or headers.get("retry-after")
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def retryable(exc: BaseException) -> bool:
    """429/5xx answers, timeouts and dropped connections: worth another try."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        return exc.status in RETRY_STATUSES
    return isinstance(exc, (HTTPError, OSError, TimeoutError))


def backoff_s(attempt: int, exc: BaseException | None = None) -> float:
    """Exponential backoff with jitter; a server's Retry-After wins when it says longer."""
    delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**attempt) * (0.5 + random.random() / 2)
    hint = _retry_after(exc) if exc is not None else None
    return max(delay, min(hint, BACKOFF_MAX_S * 3)) if hint is not None else delay


class Api:
    """``CoreV1Api``/``NetworkingV1Api`` calls with a request timeout and retries (blocking; call from a thread)."""

    def __init__(self, cfg: KubernetesConfig, api_client: Any = None) -> None:
        self.cfg = cfg
        self._api_client = api_client
        self._core: Any = None
        self._net: Any = None

    @property
    def api_client(self) -> Any:
        if self._api_client is None:
            from kubernetes import client

            self._api_client = client.ApiClient(load_configuration(self.cfg))
        return self._api_client

    @property
    def configuration(self) -> Any:
        return self.api_client.configuration

    @property
    def core(self) -> Any:
        if self._core is None:
            from kubernetes import client

            self._core = client.CoreV1Api(self.api_client)
        return self._core

    @property
    def net(self) -> Any:
        if self._net is None:
            from kubernetes import client

            self._net = client.NetworkingV1Api(self.api_client)
        return self._net

    def call(self, what: str, fn: Callable[..., T], *args: Any, ok: tuple[int, ...] = (), **kwargs: Any) -> T | None:
        """``fn(*args, **kwargs)`` with a timeout, retried on 429/5xx/connection errors; a status in ``ok`` returns None.

        Any other failure raises SandboxError naming ``what``; the ApiException is its ``__cause__``.
        """
        timeout = self.cfg.request_timeout_s
        kwargs.setdefault("_request_timeout", (min(10.0, timeout), timeout))
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - sorted below: ok, retry, or a SandboxError
                status = status_of(exc)
                if status is not None and status in ok:
                    return None
                if not retryable(exc) or attempt >= self.cfg.api_retries:
                    raise SandboxError(f"{what} failed: {describe(exc)}") from exc
                delay = backoff_s(attempt, exc)
                log.info("%s: %s; retrying in %.1fs (%d/%d)", what, describe(exc), delay, attempt + 1, self.cfg.api_retries)
                time.sleep(delay)
                attempt += 1


def describe(exc: BaseException) -> str:
    """A one-line account of an API failure: status, reason and the Status message if any."""
    status = status_of(exc)
    if status is None:
        return f"{type(exc).__name__}: {exc}".strip()
    message = ""
    try:
        message = json.loads(getattr(exc, "body", "") or "{}").get("message", "")
    except (ValueError, AttributeError):
        pass
    return f"{status} {getattr(exc, 'reason', '')}{': ' + message if message else ''}"


__all__ = ["RETRY_STATUSES", "Api", "backoff_s", "describe", "load_configuration", "retryable", "status_of"]
