"""Kubernetes sandboxes: one pod per rollout in one namespace, behind one NetworkPolicy per run."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from core.errors import SandboxError
from core.runtime import _common as C
from core.runtime import labels as L
from core.runtime.base import SandboxSpec
from core.runtime.k8s.api import Api, status_of
from core.runtime.k8s.config import KubernetesConfig
from core.runtime.k8s.manifest import network_policy_manifest, pod_manifest
from core.runtime.k8s.sandbox import KubernetesSandbox

log = logging.getLogger(__name__)

# Asks the proxy's /health from inside a pod with whatever client the image has (exit 3: none).
PROXY_CHECK = (
    'u="$1/health"; '
    'if command -v curl >/dev/null 2>&1; then curl -fsS -m 10 -o /dev/null "$u"; '
    'elif command -v wget >/dev/null 2>&1; then wget -q -T 10 -O /dev/null "$u"; '
    "elif command -v python3 >/dev/null 2>&1; then python3 -c 'import sys, urllib.request; "
    "urllib.request.urlopen(sys.argv[1], timeout=10)' \"$u\"; "
    "else exit 3; fi"
)


class KubernetesRuntime:
    """Makes pods; keyword arguments override fields of ``config`` (``KubernetesRuntime(namespace="x")``).

    ``registry``: pods pull ``<registry>/<image>`` for images named without a registry (as `images push` names them).
    """

    name = "kubernetes"
    isolated = True
    images = "cluster"

    def __init__(
        self,
        config: KubernetesConfig | None = None,
        *,
        proxy_public_url: str | None = None,
        registry: str | None = None,
        api_client: Any = None,
        poll_interval_s: float = 1.0,
        **overrides: Any,
    ) -> None:
        base = config or KubernetesConfig()
        self.cfg = KubernetesConfig.model_validate({**base.model_dump(), **overrides}) if overrides else base
        self.proxy_public_url = proxy_public_url.rstrip("/") if proxy_public_url else None
        self.registry = registry
        self.poll_interval_s = poll_interval_s
        self.api = Api(self.cfg, api_client)
        self._policies: dict[str, asyncio.Future[None]] = {}
        self._proxy_ok = False
        self._proxy_lock = asyncio.Lock()

    @property
    def namespace(self) -> str:
        return self.cfg.namespace

    @property
    def core(self) -> Any:
        """The ``CoreV1Api`` (REST only: exec has its own connection per command)."""
        return self.api.core

    def available(self) -> bool:
        try:
            self.api.core.list_namespaced_pod(self.namespace, limit=1, _request_timeout=5)
            return True
        except Exception:  # noqa: BLE001 - any failure means "not usable now"
            return False

    def build_pod_manifest(self, spec: SandboxSpec, name: str | None = None) -> dict[str, Any]:
        """The Pod object for ``spec`` (what `create` would send)."""
        return pod_manifest(spec, name or C.sandbox_name(spec.run_id, spec.rollout_id), self.cfg, self.proxy_public_url, self.registry)

    def create(self, spec: SandboxSpec) -> KubernetesSandbox:
        return KubernetesSandbox(self, spec)

    # -- once per run -----------------------------------------------------------------------

    async def prepare_run(self, spec: SandboxSpec) -> None:
        """Create the run's NetworkPolicy before its first pod (once; later pods wait for it)."""
        if not self.cfg.network_policy:
            return
        pending = self._policies.get(spec.run_id)
        if pending is None or (pending.done() and pending.exception() is not None):
            pending = asyncio.ensure_future(asyncio.to_thread(self._create_policy, spec.run_id, spec.owner))
            self._policies[spec.run_id] = pending
        await asyncio.shield(pending)

    def _create_policy(self, run_id: str, owner: str) -> None:
        body = network_policy_manifest(run_id, owner, self.cfg, self.proxy_public_url)
        try:
            self.api.call(
                f"creating NetworkPolicy {self.namespace}/{body['metadata']['name']}",
                self.api.net.create_namespaced_network_policy, self.namespace, body, ok=(409,),
            )
        except SandboxError as exc:
            if status_of(exc.__cause__ or exc) == 403:
                raise SandboxError(
                    f"{exc}: grant networkpolicies create/list/delete in {self.namespace} "
                    "(examples/kubernetes-rbac.yaml) or set runtime.kubernetes.network_policy = false"
                ) from exc
            raise

    async def check_proxy(self, sandbox: KubernetesSandbox) -> None:
        """From the first Running pod: does ``proxy_public_url`` answer? If not, a SandboxError (infra), not an agent failure."""
        if self._proxy_ok or not self.proxy_public_url or not self.cfg.check_proxy:
            return
        async with self._proxy_lock:
            if self._proxy_ok:
                return
            code, out, err = await sandbox._run(["sh", "-c", PROXY_CHECK, "sh", self.proxy_public_url], None, 30.0)
            if code == 3:
                log.warning("pod %s has no curl, wget or python3: cannot check that it reaches the proxy", sandbox.name)
            elif code != 0:
                detail = (err or out).decode(errors="replace").strip()[-300:] or f"exit {code}"
                raise SandboxError(
                    f"pods cannot reach the recording proxy at {self.proxy_public_url} ({detail}): set proxy.public_url "
                    "to an address pods reach (a Service, a node IP; README 'Kubernetes') and proxy.host = 0.0.0.0"
                )
            self._proxy_ok = True

    # -- cleanup ----------------------------------------------------------------------------

    async def reap(self, run_id: str | None = None, owner: str | None = None, *, stopped: bool = False) -> int:
        sel = {k: L.k8s_value(v) for k, v in L.selector(run_id, owner).items()}
        return await asyncio.to_thread(self._reap_blocking, sel, stopped)

    def _reap_blocking(self, sel: dict[str, str], stopped: bool) -> int:
        api, selector = self.api, L.k8s_selector(sel)
        pods = api.call(f"listing pods in namespace {self.namespace}", api.core.list_namespaced_pod, self.namespace, label_selector=selector)
        removed = 0
        for pod in pods.items if pods else []:
            if not L.matches(pod.metadata.labels, sel):  # belt and braces: never touch what is not ours
                continue
            if stopped and (pod.status is None or pod.status.phase not in ("Succeeded", "Failed")):
                continue
            if pod.metadata.deletion_timestamp:  # already terminating: its grace period runs
                continue
            try:
                api.call(
                    f"deleting pod {pod.metadata.name}", api.core.delete_namespaced_pod, pod.metadata.name, self.namespace,
                    grace_period_seconds=self.cfg.termination_grace_s, propagation_policy="Background", ok=(404,),
                )
                removed += 1
            except SandboxError as exc:
                log.warning("%s", exc)
        if not stopped and self.cfg.network_policy:
            self._reap_policies(sel, selector)
        if removed:
            log.info("reaped %d forgetui pod(s) in %s (%s)", removed, self.namespace, sel)
        return removed

    def _reap_policies(self, sel: dict[str, str], selector: str) -> None:
        api = self.api
        try:
            policies = api.call("listing NetworkPolicies", api.net.list_namespaced_network_policy, self.namespace, label_selector=selector)
        except SandboxError as exc:
            log.warning("%s", exc)
            return
        for pol in policies.items if policies else []:
            if L.matches(pol.metadata.labels, sel):
                try:
                    api.call(f"deleting NetworkPolicy {pol.metadata.name}", api.net.delete_namespaced_network_policy, pol.metadata.name, self.namespace, ok=(404,))
                except SandboxError as exc:
                    log.warning("%s", exc)
        run = sel.get(L.RUN)
        for key in [r for r in self._policies if run is None or L.k8s_value(r) == run]:
            del self._policies[key]  # a later pod of that run creates it again


__all__ = ["KubernetesRuntime"]
