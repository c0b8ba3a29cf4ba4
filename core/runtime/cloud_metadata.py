"""Cloud metadata and credential endpoints: addresses no sandbox may reach, whatever else it is allowed.

One list for both ways forgetui isolates a sandbox: the Docker egress proxy (``core.runtime.docker.egress``) refuses
these (and all of link-local besides), and the Kubernetes NetworkPolicy (``core.runtime.k8s.manifest``) carves
each one out of every CIDR in ``runtime.kubernetes.egress_allow``. They hand out the node's or the task's cloud
credentials, so even an allowed ``0.0.0.0/0`` must not open them.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA_ADDRESSES: tuple[str, ...] = (
    "169.254.169.254",  # instance metadata: AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean, Hetzner, ...
    "169.254.170.2",  # AWS ECS task metadata and role credentials
    "169.254.170.23",  # AWS EKS Pod Identity agent (role credentials)
    "169.254.0.23",  # Tencent Cloud metadata
    "fd00:ec2::254",  # AWS instance metadata over IPv6
    "fd00:ec2::23",  # AWS EKS Pod Identity agent over IPv6
    "fd20:ce::254",  # GCP metadata over IPv6
    "100.100.100.200",  # Alibaba Cloud metadata (inside 100.64.0.0/10, not link-local)
    "168.63.129.16",  # Azure WireServer: platform agent and extension endpoints (a public address)
)
METADATA: frozenset[IPAddress] = frozenset(ipaddress.ip_address(a) for a in METADATA_ADDRESSES)


def is_metadata(ip: IPAddress) -> bool:
    """Whether ``ip`` (an IPv4-mapped IPv6 address too) is one of the metadata endpoints above."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip in METADATA


def metadata_blocks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Each metadata address as a one-address network (``/32`` or ``/128``), in the list's order."""
    return [ipaddress.ip_network(a) for a in METADATA_ADDRESSES]


__all__ = ["METADATA", "METADATA_ADDRESSES", "is_metadata", "metadata_blocks"]
