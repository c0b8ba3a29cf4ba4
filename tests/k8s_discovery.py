"""The stand-in's discovery documents: what `kubectl` reads before any get or exec (legacy, unaggregated discovery).

``/version``, ``/api`` (APIVersions), ``/api/v1`` (APIResourceList), ``/apis`` (APIGroupList) and each group's
``/apis/<group>/<version>``. A client asking for aggregated discovery (``Accept: …as=APIGroupDiscoveryList``)
gets the legacy documents with ``Content-Type: application/json``, which real clients fall back to, as they do
with an API server older than 1.26.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

VERSION = {"major": "1", "minor": "30", "gitVersion": "v1.30.0-forgetui-standin", "platform": "linux/amd64"}
POD_VERBS = ["create", "delete", "get", "list"]
CORE = [
    {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace", "verbs": ["get"], "shortNames": ["ns"]},
    {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": POD_VERBS, "shortNames": ["po"]},
    {"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions", "verbs": ["create", "get"]},
    {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
    {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event", "verbs": ["list"], "shortNames": ["ev"]},
    {"name": "endpoints", "singularName": "endpoints", "namespaced": True, "kind": "Endpoints", "verbs": ["get"], "shortNames": ["ep"]},
]
GROUPS: dict[str, list[dict[str, Any]]] = {
    "networking.k8s.io/v1": [
        {"name": "networkpolicies", "singularName": "networkpolicy", "namespaced": True, "kind": "NetworkPolicy",
         "verbs": ["create", "delete", "get", "list", "update"], "shortNames": ["netpol"]},
    ],
    "authorization.k8s.io/v1": [
        {"name": "selfsubjectaccessreviews", "singularName": "selfsubjectaccessreview", "namespaced": False,
         "kind": "SelfSubjectAccessReview", "verbs": ["create"]},
    ],
}


def _group_list() -> dict[str, Any]:
    groups = []
    for gv in GROUPS:
        group, version = gv.split("/")
        entry = {"groupVersion": gv, "version": version}
        groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def add_routes(app: web.Application, server: Any) -> None:
    """Serve the discovery documents on ``app``."""
    async def version(_: web.Request) -> web.Response:
        return web.json_response(VERSION)

    async def api(_: web.Request) -> web.Response:
        address = server.url.removeprefix("http://")
        return web.json_response({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
        })

    async def core_v1(_: web.Request) -> web.Response:
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": CORE})

    async def apis(_: web.Request) -> web.Response:
        return web.json_response(_group_list())

    async def group_version(request: web.Request) -> web.Response:
        gv = f"{request.match_info['group']}/{request.match_info['version']}"
        if gv not in GROUPS:
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}, status=404)
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": GROUPS[gv]})

    app.router.add_get("/version", version)
    app.router.add_get("/api", api)
    app.router.add_get("/api/v1", core_v1)
    app.router.add_get("/apis", apis)
    app.router.add_get("/apis/{group}/{version}", group_version)


__all__ = ["CORE", "GROUPS", "VERSION", "add_routes"]
