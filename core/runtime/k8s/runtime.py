"""Kubernetes sandboxes: one pod per rollout in one namespace, behind one NetworkPolicy per run."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from core.errors import SandboxError
from core.runtime import _common as C
from core.runtime import labels as L
from core.runtime.base import SandboxSpec
from core.runtime.k8s import checks, permissions
from core.runtime.k8s.api import Api, status_of
from core.runtime.k8s.config import KubernetesConfig
from core.runtime.k8s.manifest import (
    INSTALLATION,
    installation_id,
    needs_dns,
    network_policy_manifest,
    pod_manifest,
)
from core.runtime.k8s.sandbox import KubernetesSandbox

log = logging.getLogger(__name__)

GONE_WAIT_S = 30.0  # after the grace period: how long a run's end waits for its pods to go before it deletes their policy
UNENFORCED_HINT = (
    "the cluster's network plugin does not enforce NetworkPolicies (EKS: the VPC CNI's network policy agent is off; "
    "GKE Standard: network policy enforcement is off; k3s: --disable-network-policy; kind: an old kindnet), so pods "
    "reach everything, cloud metadata endpoints included"
)


class IsolationRefused(SandboxError):
    """The run's NetworkPolicy is not enforced and ``require_network_policy`` is on: no pod of the run may start."""


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
        self._policies: dict[str, asyncio.Future[dict[str, str]]] = {}  # run id -> its policy's name and uid
        self._checked: dict[tuple[str, str], IsolationRefused | None] = {}  # (run id, node) -> what its first pod there found
        self._refused: dict[str, IsolationRefused] = {}  # run id -> why it may not run
        self._gates: dict[str, asyncio.Future[str]] = {}  # run id -> its first pod's verdict ("ok", or "retry": it failed)
        self._permitted: bool | SandboxError | None = None  # the up-front permission check's outcome (once per runtime)
        self._permission_lock = asyncio.Lock()
        self._endpoints: list[tuple[str, int]] | None | bool = False  # the API server's endpoints (False: not read yet)
        self._aliases: dict[str, str] | None = None
        self._check_lock = asyncio.Lock()
        self._live: dict[str, int] = {}  # run id -> its pods created and not yet deleted
        self._quota_warned: set[str] = set()

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
        """The Pod object for ``spec`` (what `create` would send), owned by its run's NetworkPolicy once that exists."""
        pending = self._policies.get(spec.run_id)
        owner = pending.result() if pending is not None and pending.done() and pending.exception() is None else None
        return pod_manifest(
            spec, name or C.sandbox_name(spec.run_id, spec.rollout_id), self.cfg, self.proxy_public_url, self.registry, owner,
            self._aliases,
        )

    def _resolve_aliases(self) -> dict[str, str]:
        """The pods' /etc/hosts names: the proxy's host name resolved here, when pods have no resolver (dns = "never")."""
        if self._aliases is None:
            aliases: dict[str, str] = {}
            host = urlsplit(self.proxy_public_url).hostname if self.proxy_public_url else None
            named = False
            if host:
                try:
                    ipaddress.ip_address(host)
                except ValueError:
                    named = True
            if named and host not in self.cfg.hosts and self.cfg.network_policy and not needs_dns(self.cfg, self.proxy_public_url):
                try:
                    aliases[host] = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]  # type: ignore[assignment]
                except OSError as exc:
                    raise SandboxError(
                        f"proxy.public_url names {host}, which does not resolve here ({exc}); pods have no resolver "
                        f'(runtime.kubernetes.dns = "never"): set runtime.kubernetes.hosts = {{"{host}" = "ADDRESS"}} '
                        'or runtime.kubernetes.dns = "always" (the cluster DNS: any name resolves)'
                    ) from exc
                log.info("pods reach the proxy's host %s at %s (their /etc/hosts; no DNS)", host, aliases[host])
            self._aliases = aliases
        return self._aliases

    def live_pods(self, run_id: str) -> int:
        """How many pods of the run this process created and has not deleted."""
        return self._live.get(run_id, 0)

    def count_pod(self, run_id: str, delta: int) -> None:
        self._live[run_id] = max(0, self._live.get(run_id, 0) + delta)

    def warn_quota(self, run_id: str, message: str) -> None:
        """Say once per run that its pods wait for quota (each waiting pod would say the same)."""
        if run_id not in self._quota_warned:
            self._quota_warned.add(run_id)
            log.warning("%s", message)

    def create(self, spec: SandboxSpec) -> KubernetesSandbox:
        return KubernetesSandbox(self, spec)

    # -- once per run -----------------------------------------------------------------------

    async def prepare_run(self, spec: SandboxSpec) -> None:
        """Check permissions, create the run's NetworkPolicy before its first pod (once; later pods wait for it).

        A refused run stays refused.
        """
        refused = self._refused.get(spec.run_id)
        if refused is not None:
            raise refused
        if self.cfg.check_permissions:
            async with self._permission_lock:  # once: a missing permission stays missing for every rollout
                if self._permitted is None:
                    try:
                        await asyncio.to_thread(permissions.check, self.api, self.cfg)
                        self._permitted = True
                    except SandboxError as exc:
                        self._permitted = exc
            if isinstance(self._permitted, SandboxError):
                raise self._permitted
        await asyncio.to_thread(self._resolve_aliases)
        if not self.cfg.network_policy:
            return
        pending = self._policies.get(spec.run_id)
        if pending is None or (pending.done() and pending.exception() is not None):
            pending = asyncio.ensure_future(asyncio.to_thread(self._create_policy, spec.run_id, spec.owner))
            self._policies[spec.run_id] = pending
        await asyncio.shield(pending)

    def _create_policy(self, run_id: str, owner: str) -> dict[str, str]:
        """Create the run's policy, or replace the one a crashed or resumed run left (its rules may be stale)."""
        body = network_policy_manifest(run_id, owner, self.cfg, self.proxy_public_url)
        name, api = body["metadata"]["name"], self.api
        try:
            made = api.call(f"creating NetworkPolicy {self.namespace}/{name}", api.net.create_namespaced_network_policy, self.namespace, body, ok=(409,))
            if made is None:  # it exists (`--resume`, or our own create whose answer was lost): this config's rules win
                current = api.call(f"reading NetworkPolicy {self.namespace}/{name}", api.net.read_namespaced_network_policy, name, self.namespace)
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                made = api.call(f"replacing NetworkPolicy {self.namespace}/{name}", api.net.replace_namespaced_network_policy, name, self.namespace, body)
                log.info("replaced the existing NetworkPolicy %s/%s with this run's rules", self.namespace, name)
        except SandboxError as exc:
            if status_of(exc.__cause__ or exc) == 403:
                raise SandboxError(
                    f"{exc}: grant networkpolicies create/get/update/list/delete in {self.namespace} "
                    "(examples/kubernetes-rbac.yaml) or set runtime.kubernetes.network_policy = false"
                ) from exc
            raise
        return {"name": name, "uid": made.metadata.uid}

    async def admit(self, spec: SandboxSpec) -> bool:
        """Wait until the run's first pod has its verdict before creating another (True: this one is the first).

        No pod of a run but its first is created before that pod found the NetworkPolicy enforced (or the run is
        refused: IsolationRefused); a first pod that fails otherwise hands the turn to the next.
        """
        if not self.cfg.network_policy:
            return False
        run = spec.run_id
        while True:
            refused = self._refused.get(run)
            if refused is not None:
                raise refused
            gate = self._gates.get(run)
            if gate is None:
                self._gates[run] = asyncio.get_running_loop().create_future()
                return True
            if gate.done() and gate.result() == "ok":
                return False
            await asyncio.shield(gate)

    def admitted(self, spec: SandboxSpec, ok: bool) -> None:
        """The first pod's turn is over: its verdict passed (``ok``), or it failed and the next pod tries."""
        gate = self._gates.get(spec.run_id)
        if gate is None or gate.done():
            return
        if not ok:
            del self._gates[spec.run_id]
        gate.set_result("ok" if ok else "retry")

    async def check_pod(self, sandbox: KubernetesSandbox) -> None:
        """From the first Running pod of a run on each node: the proxy answers, and the policy keeps everything else out.

        A proxy the pod cannot reach is a SandboxError (an infra error), not an agent failure; an unenforced
        policy refuses the run (IsolationRefused, for every later pod too) unless ``require_network_policy`` is off.
        Each node the run uses is checked (its network plugin agent may differ); other pods there skip it.
        """
        run = sandbox.spec.run_id
        key = (run, sandbox.node or "")
        async with self._check_lock:
            if run in self._refused:
                raise self._refused[run]
            if key in self._checked:
                return
            if not any(k[0] == run for k in self._checked):
                await self._check_proxy(sandbox)
            try:
                await self._check_isolation(sandbox)
            except IsolationRefused as exc:
                self._refused[run] = exc
                raise
            self._checked[key] = None

    async def _check_proxy(self, sandbox: KubernetesSandbox) -> None:
        if not self.proxy_public_url or not self.cfg.check_proxy:
            return
        command = ["sh", "-c", checks.PROXY_CHECK, "sh", self.proxy_public_url]
        code, out, err = await sandbox._run_again_if_lost(f"checking the proxy from pod {sandbox.name}", command, None, 30.0)
        if code == 3:
            log.warning("pod %s has no curl, wget or python3: cannot check that it reaches the proxy", sandbox.name)
        elif code != 0:
            detail = (err or out).decode(errors="replace").strip()[-300:] or f"exit {code}"
            raise SandboxError(
                f"pods cannot reach the recording proxy at {self.proxy_public_url} ({detail}): set proxy.public_url "
                "to an address pods reach (a Service, a node IP; README 'Kubernetes') and proxy.host = 0.0.0.0"
            )

    def _apiserver_endpoints(self) -> list[tuple[str, int]] | None:
        """The API server's real addresses (``default/endpoints/kubernetes``), which a probe of its ClusterIP reaches after NAT.

        None when they cannot be read (RBAC: reading Endpoints in ``default`` is optional).
        """
        if self._endpoints is False:
            try:
                ep = self.api.core.read_namespaced_endpoints("kubernetes", "default", _request_timeout=self.cfg.request_timeout_s)
                found = [
                    (a.ip, p.port) for sub in ep.subsets or [] for a in sub.addresses or [] for p in sub.ports or []
                ]
                self._endpoints = found or None
            except Exception as exc:  # noqa: BLE001 - optional: the verdict then counts wide blocks as possibly covering it
                log.info("cannot read the API server's endpoints (default/endpoints/kubernetes: %s): the check judges its ClusterIP only", exc)
                self._endpoints = None
        return self._endpoints  # type: ignore[return-value]

    async def _probe(self, sandbox: KubernetesSandbox, endpoints: list[tuple[str, int]] | None) -> tuple[int | None, list[checks.Probe], bytes]:
        targets = checks.probe_args(self.cfg, sandbox.host_ip, endpoints)
        deadline = 10.0 + 2 * checks.PROBE_TIMEOUT_S * max(1, len(targets) // 2)
        command = ["sh", "-c", checks.PROBE, "sh", *targets]
        code, out, err = await sandbox._run_again_if_lost(f"checking the NetworkPolicy from pod {sandbox.name}", command, None, deadline)
        return code, checks.parse_probes(out.decode(errors="replace")) if code == 0 else [], err

    async def _check_isolation(self, sandbox: KubernetesSandbox) -> None:
        if not self.cfg.network_policy:
            return
        policy = network_policy_manifest(sandbox.spec.run_id, sandbox.spec.owner, self.cfg, self.proxy_public_url)
        endpoints = await asyncio.to_thread(self._apiserver_endpoints)
        settle = time.monotonic() + self.cfg.policy_settle_s
        while True:  # a plugin applies a new policy a moment late: a breach is tried again until policy_settle_s
            code, probes, err = await self._probe(sandbox, endpoints)
            verdict, where = checks.isolation_verdict(policy, probes, endpoints, node_ip=sandbox.host_ip)
            if verdict != "not-enforced" or not self.cfg.require_network_policy or time.monotonic() >= settle:  # a warning need not wait
                break
            log.info("pod %s reached %s, which the NetworkPolicy forbids: trying again (the plugin may apply it late)", sandbox.name, where)
            await asyncio.sleep(1.0)
        name = f"{self.namespace}/{policy['metadata']['name']}"
        node = f" on node {sandbox.node}" if sandbox.node else ""
        if verdict == "enforced":
            log.info("NetworkPolicy %s is enforced%s: pod %s could not reach %s", name, node, sandbox.name, where)
            return
        if verdict in ("unknown", "covered"):
            if verdict == "covered":
                why = (
                    f"every destination tried ({where}, the API server's endpoints {endpoints or 'unknown'}) is one the policy "
                    "may allow (egress_allow, after NAT)"
                )
            else:
                why = (err.decode(errors="replace").strip()[-200:] or f"exit {code}") if code != 0 else f"tried {where}"
                why = f"pod {sandbox.name} has no python3, bash or nc, or no destination the policy forbids was known ({why})"
            advice = "set runtime.kubernetes.network_policy_probe to a host:port outside egress_allow that answers when nothing is enforced"
            if self.cfg.require_network_policy:
                raise IsolationRefused(
                    f"refusing to run: cannot check that NetworkPolicy {name} is enforced{node}: {why}; {advice}, or set "
                    "runtime.kubernetes.require_network_policy = false to run unchecked"
                )
            log.warning("could not check that NetworkPolicy %s is enforced%s: %s; %s", name, node, why, advice)
            return
        if self.cfg.require_network_policy:
            raise IsolationRefused(
                f"refusing to run: NetworkPolicy {name} is not enforced{node}: pod {sandbox.name} reached {where}, which the "
                f"policy forbids (still after {self.cfg.policy_settle_s:g}s); {UNENFORCED_HINT}. Enable enforcement on the "
                "cluster, or set runtime.kubernetes.require_network_policy = false to run with pods that are not isolated"
            )
        log.warning(
            "\n%s\nNETWORK POLICY NOT ENFORCED%s: pod %s reached %s, which NetworkPolicy %s forbids; %s. Running anyway "
            "because runtime.kubernetes.require_network_policy = false: the harness and the task's code can reach "
            "every address the node reaches.\n%s", "!" * 100, node, sandbox.name, where, name, UNENFORCED_HINT, "!" * 100,
        )

    # -- cleanup ----------------------------------------------------------------------------

    def _selector(self, run_id: str | None, owner: str | None) -> dict[str, str]:
        """Labels selecting our pods: of a run, or of an owner in this installation (a login is shared by CI hosts)."""
        sel = {k: L.k8s_value(v) for k, v in L.selector(run_id, owner).items()}
        if owner is not None and run_id is None:
            sel[INSTALLATION] = installation_id()
        return sel

    async def reap(self, run_id: str | None = None, owner: str | None = None, *, stopped: bool = False) -> int:
        return await asyncio.to_thread(self._reap_blocking, self._selector(run_id, owner), stopped)

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
            # a pod's commands keep running through its grace period: its policy goes only after it is gone
            if self._wait_gone(sel, selector, self.cfg.termination_grace_s + GONE_WAIT_S):
                self._reap_policies(sel, selector)
            else:
                log.warning("pods of %s are still terminating: their NetworkPolicy stays until they are gone (`forgetui gc` removes it)", selector)
        if removed:
            log.info("reaped %d forgetui pod(s) in %s (%s)", removed, self.namespace, sel)
        return removed

    def _wait_gone(self, sel: dict[str, str], selector: str, timeout_s: float) -> bool:
        """Whether every pod ``sel`` selects is gone from the API within ``timeout_s`` (the kubelet confirmed its end)."""
        api, deadline = self.api, time.monotonic() + timeout_s
        while True:
            try:
                pods = api.call(f"listing pods in namespace {self.namespace}", api.core.list_namespaced_pod, self.namespace, label_selector=selector)
            except SandboxError as exc:
                log.warning("%s", exc)
                return False
            if not [p for p in (pods.items if pods else []) if L.matches(p.metadata.labels, sel)]:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_interval_s)

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
            self._gates.pop(key, None)


__all__ = ["IsolationRefused", "KubernetesRuntime"]
