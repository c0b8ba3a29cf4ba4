"""An isolated Docker sandbox's ways out: the proxy's port and the egress proxy's, on the sandbox's own loopback.

Two ways to bring them in (see ``core.runtime.docker.network``): listeners opened inside the started container's network
namespace (root, local engine), or a forwarder container whose loopback-only namespace the sandbox joins.
`SandboxPorts` holds whichever one a sandbox uses, from before its container is created until it is removed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from core.errors import SandboxError
from core.runtime.base import SandboxSpec
from core.runtime.docker import egress as E
from core.runtime.docker import network as N

log = logging.getLogger(__name__)


class SandboxPorts:
    """The proxy's (and egress proxy's) ports of one sandbox: in its own namespace, or through a forwarder."""

    def __init__(
        self,
        client: Any,
        spec: SandboxSpec,
        name: str,
        *,
        relay: N.HostRelay | None = None,
        netns_target: tuple[str, int] | None = None,
        netns: bool = False,
        on_netns_unusable: Callable[[], None] | None = None,
        egress: E.EgressGate | None = None,
    ) -> None:
        self._client = client
        self.spec = spec
        self.name = name
        self._relay = relay  # forwarder mode: the host end of the way to the proxy
        self._netns_target = netns_target  # listener mode: the proxy's host address
        self._netns = netns or netns_target is not None  # listener mode (else a forwarder)
        self._on_netns_unusable = on_netns_unusable
        self._egress = egress  # with egress_allow: the gate serving the sandbox's egress port
        self.egress_port = E.sandbox_port(N.proxy_address(spec.proxy)[1] if spec.proxy else None) if egress else None
        self.proxy_listener: N.NetnsListener | None = None
        self._egress_listener: N.NetnsListener | N.UnixListener | None = None
        self.forwarder: Any = None  # the container whose namespace the sandbox joins

    def _isolated(self) -> bool:
        return self.spec.network == "isolated"

    def network_mode(self) -> str:
        """The sandbox container's ``network_mode``: the spec's network, the forwarder's namespace, or none."""
        if not self._isolated():
            return self.spec.network
        return f"container:{self.forwarder.id}" if self.forwarder is not None else "none"

    def start_forwarder(self, life: str, ensure_image: Callable[[], None]) -> None:
        """Forwarder mode: start the container whose namespace the sandbox will join (before the sandbox's own)."""
        if not self._isolated() or self._netns or self.forwarder is not None:
            return
        routes: list[tuple[int, N.UnixListener]] = []
        if self._relay is not None:
            routes.append((N.proxy_address(self.spec.proxy or "")[1], self._relay))
        if self._egress is not None and self.egress_port:
            self._egress_listener = N.UnixListener(self._egress.handler(self.spec.rollout_id), f"egress:{self.name}")
            routes.append((self.egress_port, self._egress_listener))
        if not routes:
            return
        kwargs = N.forwarder_kwargs(f"{self.name}-net", self.spec.image, routes, self.spec.all_labels(), life)
        import docker

        try:
            self.forwarder = N.start_forwarder(self._client, kwargs)
        except docker.errors.ImageNotFound:
            ensure_image()
            self.forwarder = N.start_forwarder(self._client, kwargs)

    def open_in_namespace(self, container: Any, rootfs: str | None) -> None:
        """Listener mode: the ports on the started container's loopback (before the harness runs)."""
        if not self._isolated() or not self._netns or (self._netns_target is None and self._egress is None):
            return
        pid = int(self._client.api.inspect_container(container.id)["State"]["Pid"] or 0)
        if not N.same_container(pid, rootfs):
            if self._on_netns_unusable is not None:
                self._on_netns_unusable()
            raise SandboxError(
                f"sandbox {self.name}: the engine's process {pid} is not visible from here (a remote engine or "
                f"another pid namespace); sandboxes of this run now use network forwarder containers instead"
            )
        if self._netns_target is not None:
            _host, port = N.proxy_address(self.spec.proxy or "")
            self.proxy_listener = N.NetnsListener(pid, port, N.relay_handler(self._netns_target))
        if self._egress is not None and self.egress_port:
            self._egress_listener = N.NetnsListener(pid, self.egress_port, self._egress.handler(self.spec.rollout_id))

    def close_listeners(self) -> None:
        """Close the ports opened in the namespace (the namespace can then go with its container)."""
        listener, self.proxy_listener = self.proxy_listener, None
        if listener is not None:
            listener.close()
        self._close_egress()

    def _close_egress(self) -> None:
        listener, self._egress_listener = self._egress_listener, None
        if listener is not None:
            listener.close()

    def remove_forwarder(self) -> None:
        """Remove the forwarder container (after the sandbox: it lives in the forwarder's namespace)."""
        import docker

        self._close_egress()
        forwarder, self.forwarder = self.forwarder, None
        if forwarder is not None:
            try:
                forwarder.remove(force=True)
            except docker.errors.NotFound:
                pass

    async def forwarder_lost(self) -> str | None:
        """Why the way to the proxy is gone (the forwarder removed or stopped), or None while it is up."""
        forwarder = self.forwarder
        if forwarder is None:
            return None
        import docker

        try:
            await asyncio.to_thread(forwarder.reload)
        except docker.errors.NotFound:
            return f"its network forwarder {forwarder.name} was removed"
        if forwarder.status != "running":
            return f"its network forwarder {forwarder.name} is {forwarder.status}"
        return None
