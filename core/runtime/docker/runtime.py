"""Docker sandboxes: one container per rollout (`DockerSandbox`), made and reaped by `DockerRuntime`.

The runtime holds what its sandboxes share: the docker client, one host relay per proxy address and one
egress proxy per egress policy (isolated networks), and whether ports can be opened inside sandbox
network namespaces on this host (else each isolated sandbox gets a forwarder container).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from core.errors import SandboxError
from core.runtime import labels as L
from core.runtime.base import SandboxSpec
from core.runtime.docker import egress as E
from core.runtime.docker import network as N
from core.runtime.docker.sandbox import DockerSandbox, _docker

log = logging.getLogger(__name__)


class DockerRuntime:
    """Sandboxes as local Docker containers (``docker.from_env()`` unless a client is given)."""

    name = "docker"
    isolated = True
    images = "engine"

    def __init__(
        self,
        client: Any = None,
        *,
        pull: bool = True,
        network_helper: str = "auto",
        egress_resolve: E.Resolver | None = None,
        egress_connect: E.Connector | None = None,
    ) -> None:
        self._client = client
        self.pull = pull  # pull a missing image from its registry before failing
        self._relays: dict[tuple[str, int], N.HostRelay] = {}  # one per proxy address (isolated networks)
        # isolated networks: open the proxy's port inside each sandbox's namespace (root, local engine), or
        # fall back to a forwarder container per sandbox ("forwarder" forces that)
        self.network_helper = network_helper
        self._netns_usable = network_helper == "auto" and N.can_enter_namespaces()
        self._warned_host = False
        self._gates: dict[tuple[tuple[str, ...], tuple[str, ...]], E.EgressGate] = {}  # one per egress policy
        self._egress_hooks = (egress_resolve, egress_connect)  # name lookup and connect of the egress proxy (tests instrument them)

    @property
    def client(self) -> Any:
        if self._client is None:
            docker = _docker()
            try:
                self._client = docker.from_env()
            except docker.errors.DockerException as exc:
                raise SandboxError(
                    f"cannot reach a Docker engine ({exc}); start one (`sudo dockerd`, or .ci/docker-up.sh) "
                    "or set DOCKER_HOST"
                ) from exc
        return self._client

    def available(self) -> bool:
        """Whether the engine answers on a new connection: a pooled keep-alive one goes on answering pings
        while a daemon shuts down, after its socket stopped taking new connections."""
        try:
            self.client.api.close()  # drops idle pooled connections only; the session stays usable
            return bool(self.client.ping())
        except Exception:
            return False

    def create(self, spec: SandboxSpec) -> DockerSandbox:
        relay = None
        gate = self.egress_gate(spec)
        if spec.network == "isolated" and (spec.proxy or gate):
            address = N.proxy_address(spec.proxy) if spec.proxy else None
            if self._netns_usable:
                return DockerSandbox(self.client, spec, pull=self.pull, netns_target=address, netns=True, on_netns_unusable=self._no_netns, egress=gate)
            if address is not None:
                relay = self._relays.get(address)
                if relay is None:
                    relay = self._relays[address] = N.HostRelay(*address)
            return DockerSandbox(self.client, spec, pull=self.pull, relay=relay, egress=gate)
        if spec.network == "host" and not self._warned_host:
            self._warned_host = True
            log.warning("runtime.network = \"host\": sandboxes share the host's network and can reach every service "
                        "on this machine (the store's live endpoint, local databases, metadata addresses); "
                        "use the default \"isolated\" unless you trust what runs in them")
        return DockerSandbox(self.client, spec, pull=self.pull, relay=relay)

    def egress_gate(self, spec: SandboxSpec) -> E.EgressGate | None:
        """The egress proxy serving `spec`'s named destinations (one per policy), or None without egress_allow."""
        if not spec.egress_allow:
            return None
        if spec.network != "isolated":
            raise SandboxError(f"runtime.egress_allow applies to runtime.network = \"isolated\" only (a {spec.network} network already reaches everything)")
        key = (tuple(spec.egress_allow), tuple(spec.egress_allow_private))
        if key not in self._gates:
            resolve, connect = self._egress_hooks
            self._gates[key] = E.EgressGate(E.EgressPolicy(*key), resolve, connect)
        return self._gates[key]

    def egress_counts(self, rollout_id: str) -> dict[str, Any] | None:
        """What a rollout's sandboxes asked of the egress proxy (taken out: the next call starts from zero)."""
        found = [c for gate in self._gates.values() if (c := gate.counts(rollout_id, pop=True))]
        return found[0] if found else None  # a rollout's sandboxes all share the run's one policy

    def _no_netns(self) -> None:
        if self._netns_usable:
            log.warning("cannot open ports in sandbox network namespaces (remote engine or other pid namespace); "
                        "isolated sandboxes use a network forwarder container each from now on")
        self._netns_usable = False

    def close(self) -> None:
        """Stop the proxy relays of isolated sandboxes (their sandboxes must be stopped first)."""
        relays, self._relays = self._relays, {}
        for relay in relays.values():
            relay.close()

    async def reap(self, run_id: str | None = None, owner: str | None = None, *, stopped: bool = False) -> int:
        sel = L.selector(run_id, owner)
        filters: dict[str, Any] = {"label": [f"{k}={v}" for k, v in sel.items()]}
        if stopped:  # not "created": a live run's container is briefly created-not-started
            filters["status"] = ["exited", "dead"]
        docker = _docker()
        # sparse: a full listing inspects every container, and one removed meanwhile (another run's removal in
        # flight) fails the whole listing with NotFound; the list answer already carries the labels
        containers = await asyncio.to_thread(self.client.containers.list, all=True, sparse=True, filters=filters)
        removed = 0
        for container in containers:
            if not L.matches(container.attrs.get("Labels") or {}, sel):
                continue
            try:
                await asyncio.to_thread(container.remove, force=True)
                removed += 1
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                log.warning("could not remove container %s: %s", container.short_id, exc)
        if removed:
            log.info("reaped %d forgetui container(s) (%s)", removed, sel)
        return removed
