"""A Kubernetes API server stand-in for tests: pods run as containers on the local Docker engine.

HTTP on loopback (aiohttp), speaking what the runtime and the official client use:

* pods: create (201; 409 when the name exists), read, list (equality label selectors), delete
  (graceful: ``deletionTimestamp`` set, the container stopped with the grace period, then the object
  removed), logs; networkpolicies: create, list, delete.
* ``pods/exec`` over a websocket with the subprotocols ``v5.channel.k8s.io`` and
  ``v4.channel.k8s.io`` (``protocols`` picks which are offered): binary frames whose first byte is
  the channel (0 stdin, 1 stdout, 2 stderr, 3 error), an empty frame on stdout first (the API
  server's "stream ready"), the error channel's ``metav1.Status`` JSON at the end (``Success``, or
  ``NonZeroExitCode`` with the code in ``details.causes``), and ``255 <channel>`` closing stdin only
  under v5. Messages over 32 MiB are refused, as the API server's websocket limit does. The command
  runs with ``docker exec`` in the pod's container.
* the pod's securityContext applied to the container: capabilities dropped/added, ``runAsUser``/
  ``runAsGroup``, ``runAsNonRoot`` (refused for a root image: CreateContainerConfigError, as the
  kubelet does), ``allowPrivilegeEscalation: false`` as ``no-new-privileges``; CPU and memory limits.
  A missing image is an ErrImagePull then ImagePullBackOff (nothing is ever pulled).
* volumes as Docker volumes: an ``emptyDir`` (mode 1777, as the kubelet makes it) and an ``image``
  volume (the image's files copied in once per pod, without what Docker adds to a container's root;
  a missing image shows as a pull error on the pod's container), mounted read-only where asked.
* ``initContainers`` run in order to their end before the pod's container, with the same
  securityContext and mounts; one that exits non-zero fails the pod (``restartPolicy: Never``:
  phase Failed, its status ``terminated``/``Error`` — ``kubectl`` shows ``Init:Error``) and its
  logs stay readable (``/log?container=``); a missing image is a pull error on its status.
* a pod container that the engine cannot start (an ``exec format error``: a binary of another CPU
  architecture) is ``terminated`` with reason ``StartError``, exit 128 and the runtime's message, the
  pod Failed, as the kubelet reports a CRI start failure; a killed pod's container is ``terminated``
  with the reason given (``OOMKilled``, exit 137).
* Events (``/api/v1/namespaces/{ns}/events``, ``fieldSelector=involvedObject.name=…``): Scheduled,
  Pulling/Pulled or Failed pulls, Created, Started, Failed starts, Killing, and any a test adds.
* Pod Security admission (``namespace_security={"ns": "restricted"}``, as a namespace labelled
  ``pod-security.kubernetes.io/enforce``): a pod breaking the level is refused with 403 in the
  plugin's words (``tests/k8s_pod_security.py``).
* the kubelet's environment: ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` name this server.
* NetworkPolicy: ignored (pods on the host's network reach everything, as on a cluster whose network
  plugin does not enforce policies), or with ``enforce_network_policy=True`` enforced for the
  destinations forgetui uses here: a pod that a policy selects gets a network namespace of its own with
  loopback only, where the TCP ports of the policy's ``ipBlock`` rules covering 127.0.0.1 are relayed
  to the host's loopback (``core.runtime.docker.network``'s listener, so this needs root); nothing
  else answers. Policies replace (PUT); deleting one removes the pods it owns (``ownerReferences``), as
  the garbage collector does.
* emptyDir volumes hide what the image has at their mount path (Docker would copy it in).

* ``hostAliases`` as the container's /etc/hosts entries; ``spec.nodeName`` from ``nodes`` in turn.
* RBAC as far as forgetui meets it: ``denied`` (verb, resource) pairs are refused with 403 in the API
  server's words, and SelfSubjectAccessReviews answer for them; ``quota_pods`` refuses creates past a pod
  count with 403 ``exceeded quota``; ``default/endpoints/kubernetes`` names this server (or
  ``apiserver_endpoints``); ``policy_delay_s`` leaves the API server reachable from an isolated pod that long
  (a network plugin applying a new policy late).
* discovery (``tests/k8s_discovery.py``) and ``GET /api/v1/namespaces/{ns}``, and 404/405 as ``Status``
  objects: what ``kubectl`` reads around a get or exec.

Not emulated: scheduling (a scripted status stands in for Unschedulable), DNS resolvers (``dnsPolicy``),
ephemeral-storage limits, authentication. Faults: ``fail`` answers the next matching requests with a status (and
``Retry-After``), ``stall`` holds them before answering, ``drop_exec`` cuts the next exec websocket
(no close frame, no status) after some seconds, as a load balancer or API server restart does.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import socket
import struct
import tarfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from tests import k8s_discovery as discovery
from tests.k8s_pod_security import violations

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
MAX_MESSAGE = 32 * 1024 * 1024
LABEL = "forgetui-test.k8s-standin"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}
    return web.json_response(body, status=code)


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, mult in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * mult)
    return int(quantity)


def _nano_cpus(quantity: str) -> int:
    return int(float(quantity[:-1]) * 1e6) if quantity.endswith("m") else int(float(quantity) * 1e9)


IMAGE_AT = "/forgetui-standin-image-volume"
# what Docker adds to every container's root (not part of an image, so not part of an image volume)
DOCKER_ADDED = {".dockerenv", "dev", "proc", "sys", "etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/mtab", IMAGE_AT.lstrip("/")}


def _image_files(archive: bytes) -> bytes:
    """A container root's archive (Docker's ``/`` archive) re-rooted at ``.``, without what Docker adds to containers."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            name = member.name.lstrip("/").removeprefix("./")
            if name in ("", ".") or any(name == d or name.startswith(d + "/") for d in DOCKER_ADDED):
                continue
            member.name = name
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def _rbac_need(method: str, path: str) -> tuple[str, str, str] | None:
    """(verb, resource[/subresource], namespace) a namespaced request needs from RBAC (None: not namespaced)."""
    if "/namespaces/" not in path:
        return None
    parts = path.split("/namespaces/", 1)[1].split("/")  # ns, resource, [name, [subresource]]
    if len(parts) < 2:
        return None
    resource = parts[1] + (f"/{parts[3]}" if len(parts) > 3 else "")
    verbs = {"POST": "create", "DELETE": "delete", "PUT": "update", "GET": "get" if len(parts) > 2 else "list"}
    return verbs.get(method, "get"), resource, parts[0]


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    times: int
    status: int | None = None
    retry_after: float | None = None
    stall_s: float = 0.0


@dataclass
class Pod:
    obj: dict[str, Any]
    container: Any = None
    killed: bool = False
    script: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    volumes: dict[str, str] = field(default_factory=dict)  # pod volume name -> Docker volume
    init_containers: dict[str, Any] = field(default_factory=dict)  # name -> its (exited) Docker container
    relays: list[Any] = field(default_factory=list)  # an enforced policy's ports, open in the pod's namespace


@dataclass
class Seen:
    method: str
    path: str
    query: list[tuple[str, str]]
    authorization: str | None = None


class ApiServerStandIn:
    """Start with ``with ApiServerStandIn(docker_client) as server:``; ``server.url`` is the API's address."""

    def __init__(
        self,
        docker_client: Any,
        *,
        protocols: tuple[str, ...] = (V5, V4),
        network_mode: str = "host",
        namespace_security: dict[str, str] | None = None,
        enforce_network_policy: bool = False,
        nodes: tuple[str, ...] = ("standin-node",),
        policy_delay_s: float = 0.0,
        quota_pods: int | None = None,
        denied: set[tuple[str, str]] | None = None,
        apiserver_endpoints: list[tuple[str, int]] | None = None,
    ) -> None:
        self.docker = docker_client
        self.protocols = protocols
        self.network_mode = network_mode
        self.namespace_security = dict(namespace_security or {})
        self.enforce_network_policy = enforce_network_policy
        self.nodes = nodes  # pods are assigned to these in turn (spec.nodeName; every one is this host)
        self._next_node = 0
        self.policy_delay_s = policy_delay_s  # an enforced policy leaves the API server reachable this long (a late plugin)
        self.quota_pods = quota_pods  # a ResourceQuota on pods: creates past it are refused with 403 "exceeded quota"
        self.denied = set(denied or ())  # (verb, resource or resource/subresource) this identity may not do: 403, and SSAR says so
        self.apiserver_endpoints = apiserver_endpoints  # default/endpoints/kubernetes (None: this server's own address)
        self.reviews: list[dict[str, Any]] = []  # the SelfSubjectAccessReviews asked
        self.pods: dict[tuple[str, str], Pod] = {}
        self.policies: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.policy_deletions: list[tuple[str, list[str]]] = []  # (policy, the pods it selected that still existed)
        self.dropped: list[str] = []  # pods whose exec stream drop_exec cut
        self._drops: list[tuple[float, str | None]] = []
        self.seen: list[Seen] = []
        self.created: list[dict[str, Any]] = []  # every pod body as created
        self.stdin_frames: list[int] = []  # sizes of the stdin messages received
        self.stdin_closed: list[str] = []  # protocol of each exec whose stdin was closed with 255 0
        self.exec_status: dict[str, Any] | None = None  # sent instead of the real status when set
        self._faults: list[Fault] = []
        self._scripts: list[list[tuple[float, dict[str, Any]]]] = []
        self._script_events: list[list[tuple[str, str]]] = []
        self._lock = threading.RLock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""
        self._id = uuid.uuid4().hex[:12]  # labels this server's containers (tests may run side by side)

    # -- test controls --------------------------------------------------------------------

    def fail(self, method: str, path: str, status: int, times: int = 1, retry_after: float | None = None) -> None:
        """Answer the next ``times`` requests matching ``method`` and the ``path`` regex with ``status``."""
        self._faults.append(Fault(method, re.compile(path), times, status=status, retry_after=retry_after))

    def stall(self, method: str, path: str, seconds: float, times: int = 1) -> None:
        """Hold the next ``times`` matching requests ``seconds`` before handling them (they still take effect)."""
        self._faults.append(Fault(method, re.compile(path), times, stall_s=seconds))

    def script_next_pod(self, statuses: list[tuple[float, dict[str, Any]]], events: list[tuple[str, str]] = ()) -> None:
        """The next created pod shows each status for its seconds before its container starts.

        ``events``: (reason, message) Warning events the pod gets when it is created (a FailedMount, say).
        """
        self._scripts.append(statuses)
        self._script_events.append(list(events))

    def drop_exec(self, after_s: float, times: int = 1, only: str | None = None) -> None:
        """Cut the next ``times`` exec websockets ``after_s`` seconds in: the TCP connection is aborted, no status sent.

        ``only``: cut only execs one of whose command arguments is this string (a script, say).
        """
        self._drops.extend([(after_s, only)] * times)

    def stop_dropping(self) -> None:
        self._drops.clear()

    def kill_pod(self, namespace: str, name: str, reason: str = "Evicted") -> None:
        """Kill the pod's container (as an eviction or OOM would): phase Failed, execs end without a status.

        ``reason`` OOMKilled: the container's own state says so (exit 137); otherwise the pod's (an eviction).
        """
        pod = self.pods[(namespace, name)]
        pod.killed = True
        terminated = {"exitCode": 137, "reason": "OOMKilled" if reason == "OOMKilled" else "Error", "finishedAt": _now()}
        with self._lock:
            if reason == "OOMKilled":
                pod.obj["status"].update({"phase": "Failed"})
            else:
                pod.obj["status"].update({"phase": "Failed", "reason": reason, "message": "The node was low on resource: memory."})
            pod.obj["status"]["containerStatuses"] = self._container_status(pod, {"terminated": terminated})
        self.add_event(pod, "Killing" if reason == "OOMKilled" else reason, f"Stopping container {pod.obj['spec']['containers'][0]['name']}", "Warning")
        if pod.container is not None:
            pod.container.kill()

    def add_event(self, pod: Pod | tuple[str, str], reason: str, message: str, type_: str = "Normal") -> None:
        """Record an Event about ``pod`` (a Pod, or its namespace and name), as the kubelet and scheduler do."""
        ns, name = pod if isinstance(pod, tuple) else (pod.obj["metadata"]["namespace"], pod.obj["metadata"]["name"])
        with self._lock:
            self.events.append({
                "apiVersion": "v1", "kind": "Event", "type": type_, "reason": reason, "message": message, "count": 1,
                "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": ns},
                "involvedObject": {"kind": "Pod", "namespace": ns, "name": name, "apiVersion": "v1"},
                "firstTimestamp": _now(), "lastTimestamp": _now(), "source": {"component": "kubelet"},
            })

    def requests(self, method: str | None = None, path: str = "") -> list[Seen]:
        return [r for r in self.seen if (method is None or r.method == method) and re.search(path, r.path)]

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> ApiServerStandIn:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        import docker.errors

        # sparse: the SDK would inspect each listed container, and one a delete's grace period removes meanwhile
        # makes that inspect (not the remove) fail with NotFound (seen in CI)
        for c in self.docker.containers.list(all=True, sparse=True, filters={"label": f"{LABEL}={self._id}"}):
            try:
                c.remove(force=True)
            except docker.errors.APIError:  # removed (or being removed) by a delete's grace period meanwhile
                pass
        for _ in range(20):  # a volume a delete's container still holds is freed a moment later
            left = self.docker.volumes.list(filters={"label": f"{LABEL}={self._id}"})
            for v in left:
                with contextlib.suppress(docker.errors.APIError):
                    v.remove(force=True)
            if not left:
                break
            time.sleep(0.25)

    async def _start(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=MAX_MESSAGE)
        pods = "/api/v1/namespaces/{ns}/pods"
        pols = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
        app.router.add_post(pods, self._create)
        app.router.add_get(pods, self._list)
        app.router.add_get(pods + "/{name}", self._read)
        app.router.add_delete(pods + "/{name}", self._delete)
        app.router.add_get(pods + "/{name}/log", self._log)
        app.router.add_route("*", pods + "/{name}/exec", self._exec)
        app.router.add_post(pols, self._policy_create)
        app.router.add_get(pols, self._policy_list)
        app.router.add_get(pols + "/{name}", self._policy_read)
        app.router.add_put(pols + "/{name}", self._policy_replace)
        app.router.add_delete(pols + "/{name}", self._policy_delete)
        app.router.add_get("/api/v1/namespaces/{ns}/events", self._events)
        app.router.add_get("/api/v1/namespaces/{ns}/endpoints/{name}", self._endpoints)
        app.router.add_get("/api/v1/namespaces/{ns}", self._namespace)
        app.router.add_post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", self._access_review)
        discovery.add_routes(app, self)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.seen.append(Seen(request.method, request.path, list(request.query.items()), request.headers.get("Authorization")))
        need = _rbac_need(request.method, request.path)
        if need is not None and need[0] in self.denied_for(need[1], need[2]):
            verb, resource, ns = need[0], need[1], need[2]
            group = "networking.k8s.io" if "networkpolicies" in resource else ""
            sub = resource.split("/")
            what = f'{sub[0]}.{group}' if group else sub[0]
            return _status(
                403, "Forbidden",
                f'{what} is forbidden: User "standin-user" cannot {verb} resource "{resource}" in API group "{group}" in the namespace "{ns}"',
            )
        for fault in self._faults:
            if fault.times > 0 and fault.method == request.method and fault.path.search(request.path):
                fault.times -= 1
                if fault.stall_s:
                    await asyncio.sleep(fault.stall_s)
                    break
                resp = _status(fault.status or 500, "TooManyRequests" if fault.status == 429 else "InternalError", "injected fault")
                if fault.retry_after is not None:
                    resp.headers["Retry-After"] = str(fault.retry_after)
                return resp
        try:
            return await handler(request)
        except web.HTTPNotFound:  # an unknown path: a Status, as the API server answers (clients decode it)
            return _status(404, "NotFound", "the server could not find the requested resource")
        except web.HTTPMethodNotAllowed:
            return _status(405, "MethodNotAllowed", f"the server does not allow this method on the requested resource ({request.method})")

    def denied_for(self, resource: str, namespace: str) -> set[str]:
        """The verbs denied on ``resource`` (exec: denying either of get/create denies the websocket, as RBAC does)."""
        del namespace
        verbs = {v for v, r in self.denied if r == resource}
        return verbs | ({"get", "create"} if resource == "pods/exec" and verbs else set())

    async def _access_review(self, request: web.Request) -> web.Response:
        body = await request.json()
        attrs = body["spec"]["resourceAttributes"]
        self.reviews.append(attrs)
        resource = attrs["resource"] + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
        allowed = (attrs["verb"], resource) not in self.denied
        body["status"] = {"allowed": allowed, **({} if allowed else {"reason": "no RBAC rule allows it"})}
        return self._json(body, 201)

    async def _namespace(self, request: web.Request) -> web.Response:
        """Every namespace exists (kubectl reads one after a 404 to say which is missing); its Pod Security label as set."""
        ns = request.match_info["ns"]
        labels = {"kubernetes.io/metadata.name": ns}
        if ns in self.namespace_security:
            labels["pod-security.kubernetes.io/enforce"] = self.namespace_security[ns]
        return self._json({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}, "status": {"phase": "Active"}})

    async def _endpoints(self, request: web.Request) -> web.Response:
        if (request.match_info["ns"], request.match_info["name"]) != ("default", "kubernetes"):
            return _status(404, "NotFound", f'endpoints "{request.match_info["name"]}" not found')
        port = int(self.url.rsplit(":", 1)[1])
        pairs = self.apiserver_endpoints or [("127.0.0.1", port)]
        subsets = [{"addresses": [{"ip": ip}], "ports": [{"name": "https", "port": p, "protocol": "TCP"}]} for ip, p in pairs]
        return self._json({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "kubernetes", "namespace": "default"}, "subsets": subsets})

    # -- pods -------------------------------------------------------------------------------

    def _json(self, obj: dict[str, Any], status: int = 200) -> web.Response:
        with self._lock:
            return web.json_response(json.loads(json.dumps(obj)), status=status)

    async def _create(self, request: web.Request) -> web.Response:
        ns, body = request.match_info["ns"], await request.json()
        name = body["metadata"]["name"]
        if (ns, name) in self.pods:
            return _status(409, "AlreadyExists", f'pods "{name}" already exists')
        refusal = violations(body, self.namespace_security.get(ns, "privileged"))
        if refusal:
            return _status(403, "Forbidden", refusal)
        used = sum(1 for (pns, _), p in list(self.pods.items()) if pns == ns and not p.obj["metadata"].get("deletionTimestamp"))
        if self.quota_pods is not None and used >= self.quota_pods:
            return _status(
                403, "Forbidden",
                f'pods "{name}" is forbidden: exceeded quota: pod-count, requested: pods=1, used: pods={used}, limited: pods={self.quota_pods}',
            )
        meta = body["metadata"]
        meta.update({"namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": _now(), "resourceVersion": "1"})
        body["status"] = {"phase": "Pending", "conditions": [], "qosClass": "Guaranteed"}
        self.created.append(json.loads(json.dumps(body)))
        pod = Pod(body, script=self._scripts.pop(0) if self._scripts else [])
        self.pods[(ns, name)] = pod
        for reason, message in self._script_events.pop(0) if self._script_events else []:
            self.add_event(pod, reason, message, "Warning")
        threading.Thread(target=self._run_pod, args=(pod,), daemon=True).start()
        return self._json(body, 201)

    def _set_status(self, pod: Pod, **status: Any) -> None:
        with self._lock:
            pod.obj["status"].update(status)

    def _container_status(self, pod: Pod, state: dict[str, Any], ready: bool = False) -> list[dict[str, Any]]:
        c = pod.obj["spec"]["containers"][0]
        return [{"name": c["name"], "image": c["image"], "imageID": "", "ready": ready, "restartCount": 0, "started": ready, "state": state}]

    def _init_status(self, pod: Pod, index: int, state: dict[str, Any]) -> None:
        """Set init container ``index``'s state; the ones before it completed, the ones after wait."""
        inits = pod.obj["spec"].get("initContainers", [])
        done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        waiting = {"waiting": {"reason": "PodInitializing"}}
        statuses = [
            {"name": c["name"], "image": c["image"], "imageID": "", "ready": i < index, "restartCount": 0,
             "state": done if i < index else state if i == index else waiting}
            for i, c in enumerate(inits)
        ]
        self._set_status(pod, initContainerStatuses=statuses, containerStatuses=self._container_status(pod, waiting))

    def _run_pod(self, pod: Pod) -> None:
        """What scheduler + kubelet do: the scripted statuses, then the container (or why it cannot start)."""
        import docker.errors

        for seconds, status in pod.script:
            self._set_status(pod, **status)
            time.sleep(seconds)
        scheduled = [{"type": "PodScheduled", "status": "True"}]
        with self._lock:
            node = self.nodes[self._next_node % len(self.nodes)]
            self._next_node += 1
            pod.obj["spec"]["nodeName"] = node
        self._set_status(pod, conditions=scheduled, hostIP="127.0.0.1")
        self.add_event(pod, "Scheduled", f"Successfully assigned {pod.obj['metadata']['namespace']}/{pod.obj['metadata']['name']} to {node}")
        spec = pod.obj["spec"]
        c = spec["containers"][0]
        user = self._security(spec, c).get("runAsUser")
        try:
            image = self.docker.images.get(c["image"])
        except docker.errors.ImageNotFound:
            return self._pull_failure(pod, c)
        if self._security(spec, c).get("runAsNonRoot") and user is None and (image.attrs["Config"].get("User") or "root") in ("", "root", "0"):
            waiting = {"reason": "CreateContainerConfigError", "message": "container has runAsNonRoot and image will run as root"}
            return self._set_status(pod, containerStatuses=self._container_status(pod, {"waiting": waiting}))
        missing = self._make_volumes(pod)
        if missing is not None:  # an image volume whose image is not there: the kubelet cannot set up the pod
            return self._pull_failure(pod, {**c, "image": missing})
        for index, init in enumerate(spec.get("initContainers", [])):
            if not self._run_init(pod, index, init):
                return
        with self._lock:
            if pod.obj["metadata"].get("deletionTimestamp"):
                return
            pod.container = self._create_container(pod, c)
        self.add_event(pod, "Created", f"Created container {c['name']}")
        try:
            pod.container.start()
        except docker.errors.APIError as exc:  # the CRI's start failed (an exec format error, say): StartError
            message = str(exc.explanation or exc)
            terminated = {"exitCode": 128, "reason": "StartError", "message": message, "finishedAt": _now()}
            self.add_event(pod, "Failed", f"Error: {message}", "Warning")
            return self._set_status(pod, phase="Failed", containerStatuses=self._container_status(pod, {"terminated": terminated}))
        self._open_policy_ports(pod)
        self.add_event(pod, "Started", f"Started container {c['name']}")
        running = {"running": {"startedAt": _now()}}
        self._set_status(
            pod, phase="Running", podIP="127.0.0.1", startTime=_now(),
            conditions=[*scheduled, {"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
            containerStatuses=self._container_status(pod, running, ready=True),
        )
        threading.Thread(target=self._watch, args=(pod,), daemon=True).start()

    def _watch(self, pod: Pod) -> None:
        """A pod container that ends on its own (its process failed: an ``exec format error``, a crash) ends the pod."""
        try:
            code = pod.container.wait().get("StatusCode", 1)
            pod.container.reload()
            oom = pod.container.attrs["State"].get("OOMKilled")
        except Exception:  # noqa: BLE001 - removed by a delete meanwhile
            return
        with self._lock:
            if pod.killed or pod.obj["metadata"].get("deletionTimestamp"):
                return
        reason = "OOMKilled" if oom else "Completed" if code == 0 else "Error"
        terminated = {"exitCode": code, "reason": reason, "finishedAt": _now()}
        self._set_status(pod, phase="Succeeded" if code == 0 else "Failed", containerStatuses=self._container_status(pod, {"terminated": terminated}))

    @staticmethod
    def _security(spec: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
        return {**spec.get("securityContext", {}), **c.get("securityContext", {})}

    def _create_container(self, pod: Pod, c: dict[str, Any]) -> Any:
        """A Docker container for Pod container ``c``: its securityContext, limits and volume mounts applied."""
        sc = self._security(pod.obj["spec"], c)
        user = sc.get("runAsUser")
        limits = c.get("resources", {}).get("limits", {})
        caps = sc.get("capabilities", {})
        from docker.types import Mount

        # no_copy: an emptyDir (or an image volume) hides what the image has at that path; Docker would copy it in
        mounts = [
            Mount(m["mountPath"], pod.volumes[m["name"]], type="volume", read_only=bool(m.get("readOnly")), no_copy=True)
            for m in c.get("volumeMounts", [])
        ]
        fs_group = pod.obj["spec"].get("securityContext", {}).get("fsGroup")
        env = {e["name"]: e["value"] for e in c.get("env", [])}
        env.update({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": self.url.rsplit(":", 1)[1]})  # as the kubelet adds
        return self.docker.containers.create(
            c["image"],
            command=c.get("command"),
            name=f"k8s-standin-{uuid.uuid4().hex[:10]}",
            labels={LABEL: self._id, "pod": pod.obj["metadata"]["name"]},
            environment=env,
            working_dir=c.get("workingDir"),
            user=None if user is None else f"{user}:{sc.get('runAsGroup', user)}",
            group_add=[str(fs_group)] if fs_group else None,
            cap_drop=caps.get("drop"),
            cap_add=caps.get("add"),
            security_opt=["no-new-privileges"] if sc.get("allowPrivilegeEscalation") is False else None,
            privileged=bool(sc.get("privileged")),
            mem_limit=_bytes(limits["memory"]) if "memory" in limits else None,
            nano_cpus=_nano_cpus(limits["cpu"]) if "cpu" in limits else None,
            network_mode="none" if self._policy_ports(pod) is not None else self.network_mode,
            mounts=mounts or None,
            # hostAliases: the kubelet writes them into the pod's /etc/hosts
            extra_hosts={n: a["ip"] for a in pod.obj["spec"].get("hostAliases", []) for n in a["hostnames"]} or None,
        )

    def _policy_ports(self, pod: Pod) -> list[int] | None:
        """With ``enforce_network_policy``: the loopback ports the policies selecting ``pod`` open (None: no policy selects it)."""
        if not self.enforce_network_policy:
            return None
        import ipaddress

        labels = pod.obj["metadata"].get("labels") or {}
        ns = pod.obj["metadata"]["namespace"]
        selecting = [
            p for (pns, _), p in list(self.policies.items())
            if pns == ns and "Egress" in p["spec"].get("policyTypes", [])
            and all(labels.get(k) == v for k, v in p["spec"]["podSelector"].get("matchLabels", {}).items())
        ]
        if not selecting:
            return None
        loopback = ipaddress.ip_address("127.0.0.1")
        ports: list[int] = []
        for policy in selecting:
            for rule in policy["spec"].get("egress", []):
                for peer in rule.get("to", []):
                    block = peer.get("ipBlock")
                    if block is None or loopback not in ipaddress.ip_network(block["cidr"], strict=False):
                        continue
                    if any(loopback in ipaddress.ip_network(x, strict=False) for x in block.get("except", [])):
                        continue
                    ports += [p["port"] for p in rule.get("ports", []) if p.get("protocol", "TCP") == "TCP" and isinstance(p.get("port"), int)]
        return sorted(set(ports))

    def _open_policy_ports(self, pod: Pod) -> None:
        """Relay the ports an enforced policy opens from the pod's own loopback to the host's (a listener in its namespace)."""
        from core.runtime.docker.network import NetnsListener, relay_handler

        ports = self._policy_ports(pod)
        if ports is None:
            return
        pod.container.reload()
        pid = pod.container.attrs["State"]["Pid"]
        pod.relays = [NetnsListener(pid, port, relay_handler(("127.0.0.1", port))) for port in ports]
        if self.policy_delay_s > 0:  # the plugin has not applied the policy yet: the API server still answers, for a while
            api = int(self.url.rsplit(":", 1)[1])
            late = NetnsListener(pid, api, relay_handler(("127.0.0.1", api)))
            pod.relays.append(late)
            threading.Timer(self.policy_delay_s, late.close).start()

    def _make_volumes(self, pod: Pod) -> str | None:
        """Docker volumes for the pod's ``emptyDir`` (world-writable, as the kubelet makes them) and ``image`` volumes.

        An image volume is the image's filesystem: copied out of a created (never started) container of
        it into a fresh volume, leaving out what Docker adds to every container (/dev, /proc, /etc/hosts, ...).
        Returns the image of an image volume that is not on the engine (None when all are ready).
        """
        import docker.errors

        for vol in pod.obj["spec"].get("volumes", []):
            name = f"k8s-standin-{uuid.uuid4().hex[:10]}"
            self.docker.volumes.create(name=name, labels={LABEL: self._id})
            pod.volumes[vol["name"]] = name
            if "emptyDir" in vol:
                self._world_writable(name, pod.obj["spec"]["containers"][0]["image"])
            elif "image" in vol:
                reference = vol["image"]["reference"]
                try:
                    self.docker.images.get(reference)
                except docker.errors.ImageNotFound:
                    return reference
                self._fill_from_image(name, reference)
        return None

    def _world_writable(self, volume: str, image: str) -> None:
        """Mode 1777 on the volume's root, as an emptyDir has (on the host when readable here, else from a container)."""
        mountpoint = Path(self.docker.volumes.get(volume).attrs.get("Mountpoint") or "/nonexistent")
        if mountpoint.is_dir() and os.access(mountpoint, os.W_OK):
            mountpoint.chmod(0o1777)
            return
        self.docker.containers.run(image, ["chmod", "1777", "/v"], volumes={volume: {"bind": "/v", "mode": "rw"}}, remove=True, network_mode="none", user="0")

    def _fill_from_image(self, volume: str, image: str) -> None:
        """Copy ``image``'s files into ``volume``: archive a created container's root, unpack it through another's mount."""
        source = self.docker.containers.create(image, command=["/nonexistent"], network_mode="none")
        target = self.docker.containers.create(image, command=["/nonexistent"], network_mode="none", volumes={volume: {"bind": IMAGE_AT, "mode": "rw"}})
        try:
            stream, _ = source.get_archive("/")
            target.put_archive(IMAGE_AT, _image_files(b"".join(stream)))
        finally:
            source.remove(force=True)
            target.remove(force=True)

    def _run_init(self, pod: Pod, index: int, c: dict[str, Any]) -> bool:
        """Run init container ``c`` to its end; False (the pod Failed, or waiting on a pull) when it cannot start or fails."""
        import docker.errors

        try:
            self.docker.images.get(c["image"])
        except docker.errors.ImageNotFound:
            self._pull_failure(pod, c, init=index)
            return False
        with self._lock:
            if pod.obj["metadata"].get("deletionTimestamp"):
                return False
            container = self._create_container(pod, c)
            pod.init_containers[c["name"]] = container
        self._init_status(pod, index, {"running": {"startedAt": _now()}})
        container.start()
        code = container.wait().get("StatusCode", 1)
        if code == 0:
            self._init_status(pod, index + 1, {"waiting": {"reason": "PodInitializing"}})
            return True
        # restartPolicy Never: the pod fails (kubectl shows Init:Error; with restarts it would be Init:CrashLoopBackOff)
        self._init_status(pod, index, {"terminated": {"exitCode": code, "reason": "Error", "finishedAt": _now()}})
        self._set_status(pod, phase="Failed", conditions=[{"type": "PodScheduled", "status": "True"},
                                                           {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized"}])
        return False

    def _pull_failure(self, pod: Pod, c: dict[str, Any], init: int | None = None) -> None:
        """Report ``c``'s image as not pullable (on init container ``init`` when given) until the pod goes."""
        image = c["image"]

        def show(state: dict[str, Any]) -> None:
            if init is None:
                self._set_status(pod, containerStatuses=self._container_status(pod, state))
            else:
                self._init_status(pod, init, state)

        if c.get("imagePullPolicy") == "Never":
            return show({"waiting": {"reason": "ErrImageNeverPull", "message": f'Container image "{image}" is not present with pull policy of Never'}})
        reasons = [("ErrImagePull", f'failed to pull and unpack image "{image}": not found'), ("ImagePullBackOff", f'Back-off pulling image "{image}"')]
        self.add_event(pod, "Failed", f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found', "Warning")
        for i in range(10_000):
            if pod.obj["metadata"].get("deletionTimestamp") or (pod.obj["metadata"]["namespace"], pod.obj["metadata"]["name"]) not in self.pods:
                return
            reason, message = reasons[0 if i == 0 else i % 2]  # ErrImagePull, then back-off and retries
            show({"waiting": {"reason": reason, "message": message}})
            time.sleep(0.3)

    async def _read(self, request: web.Request) -> web.Response:
        pod = self.pods.get((request.match_info["ns"], request.match_info["name"]))
        if pod is None:
            return _status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        return self._json(pod.obj)

    async def _list(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        sel = dict(p.split("=", 1) for p in request.query.get("labelSelector", "").split(",") if "=" in p)
        items = [
            p.obj for (pns, _), p in list(self.pods.items())
            if pns == ns and all((p.obj["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())
        ]
        limit = int(request.query.get("limit", "0") or 0)
        return self._json({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items[:limit] if limit else items})

    async def _delete(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        pod = self.pods.get(key)
        if pod is None:
            return _status(404, "NotFound", f'pods "{key[1]}" not found')
        body = await request.json() if request.can_read_body else {}
        grace = int(request.query.get("gracePeriodSeconds", body.get("gracePeriodSeconds", pod.obj["spec"].get("terminationGracePeriodSeconds", 30))))
        with self._lock:
            if not pod.obj["metadata"].get("deletionTimestamp"):
                pod.obj["metadata"].update({"deletionTimestamp": _now(), "deletionGracePeriodSeconds": grace})
        threading.Thread(target=self._terminate, args=(key, pod, grace), daemon=True).start()
        return self._json(pod.obj)

    def _terminate(self, key: tuple[str, str], pod: Pod, grace: int) -> None:
        with self._lock:
            container = pod.container
        self.add_event(pod, "Killing", f"Stopping container {pod.obj['spec']['containers'][0]['name']}")
        for relay in pod.relays:
            relay.close()
        if container is not None:
            try:
                container.stop(timeout=grace)
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        for init in pod.init_containers.values():
            with contextlib.suppress(Exception):
                init.remove(force=True)
        for volume in pod.volumes.values():
            with contextlib.suppress(Exception):
                self.docker.volumes.get(volume).remove(force=True)
        self.pods.pop(key, None)

    async def _log(self, request: web.Request) -> web.Response:
        pod = self.pods.get((request.match_info["ns"], request.match_info["name"]))
        if pod is None:
            return _status(404, "NotFound", "pod not found")
        name = request.query.get("container")
        container = pod.init_containers.get(name) if name in pod.init_containers else pod.container
        text = await asyncio.to_thread(container.logs) if container else b""
        return web.Response(body=text, content_type="text/plain")

    # -- networkpolicies --------------------------------------------------------------------

    async def _policy_create(self, request: web.Request) -> web.Response:
        ns, body = request.match_info["ns"], await request.json()
        key = (ns, body["metadata"]["name"])
        if key in self.policies:
            return _status(409, "AlreadyExists", f'networkpolicies.networking.k8s.io "{key[1]}" already exists')
        body["metadata"].update({"namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": _now(), "resourceVersion": "1"})
        self.policies[key] = body
        return self._json(body, 201)

    async def _policy_read(self, request: web.Request) -> web.Response:
        obj = self.policies.get((request.match_info["ns"], request.match_info["name"]))
        return self._json(obj) if obj else _status(404, "NotFound", f'networkpolicies.networking.k8s.io "{request.match_info["name"]}" not found')

    async def _policy_replace(self, request: web.Request) -> web.Response:
        """PUT: the new spec and labels under the old object's identity (uid kept, resourceVersion bumped)."""
        ns, name, body = request.match_info["ns"], request.match_info["name"], await request.json()
        old = self.policies.get((ns, name))
        if old is None:
            return _status(404, "NotFound", f'networkpolicies.networking.k8s.io "{name}" not found')
        version = body["metadata"].get("resourceVersion")
        if version and version != old["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified; please apply your changes to the latest version and try again")
        body["metadata"].update({
            "namespace": ns, "uid": old["metadata"]["uid"], "creationTimestamp": old["metadata"]["creationTimestamp"],
            "resourceVersion": str(int(old["metadata"]["resourceVersion"]) + 1),
        })
        self.policies[(ns, name)] = body
        return self._json(body)

    async def _policy_list(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        sel = dict(p.split("=", 1) for p in request.query.get("labelSelector", "").split(",") if "=" in p)
        items = [p for (pns, _), p in self.policies.items() if pns == ns and all(p["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        return self._json({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicyList", "metadata": {}, "items": items})

    async def _policy_delete(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        obj = self.policies.pop((ns, request.match_info["name"]), None)
        if obj is None:
            return _status(404, "NotFound", "networkpolicy not found")
        selector = obj["spec"]["podSelector"].get("matchLabels", {})
        alive = [
            name for (pns, name), pod in list(self.pods.items())
            if pns == ns and all((pod.obj["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
        ]
        self.policy_deletions.append((obj["metadata"]["name"], alive))
        self._collect_garbage(obj["metadata"]["uid"])
        return self._json(obj)

    def _collect_garbage(self, owner_uid: str) -> None:
        """Delete (gracefully) the pods whose ownerReferences name ``owner_uid``, as the garbage collector does."""
        for key, pod in list(self.pods.items()):
            owners = pod.obj["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == owner_uid for o in owners) and not pod.obj["metadata"].get("deletionTimestamp"):
                grace = pod.obj["spec"].get("terminationGracePeriodSeconds", 30)
                with self._lock:
                    pod.obj["metadata"].update({"deletionTimestamp": _now(), "deletionGracePeriodSeconds": grace})
                threading.Thread(target=self._terminate, args=(key, pod, grace), daemon=True).start()

    # -- events -----------------------------------------------------------------------------

    async def _events(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        wanted = dict(p.split("=", 1) for p in request.query.get("fieldSelector", "").split(",") if "=" in p)
        fields: dict[str, Callable[[dict[str, Any]], Any]] = {
            "involvedObject.name": lambda e: e["involvedObject"]["name"],
            "involvedObject.kind": lambda e: e["involvedObject"]["kind"],
            "involvedObject.namespace": lambda e: e["involvedObject"]["namespace"],
            "type": lambda e: e["type"],
            "reason": lambda e: e["reason"],
        }
        with self._lock:
            items = [e for e in self.events if e["metadata"]["namespace"] == ns and all(fields[k](e) == v for k, v in wanted.items())]
        return self._json({"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": items})

    # -- exec -------------------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        pod = self.pods.get((request.match_info["ns"], name))
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        if pod.container is None or pod.killed or pod.obj["status"].get("phase") != "Running":
            return _status(400, "BadRequest", f"container sandbox is not valid for pod {name}")
        command = request.query.getall("command", [])
        stdin = request.query.get("stdin") == "true"
        ws = web.WebSocketResponse(protocols=self.protocols, max_msg_size=MAX_MESSAGE, autoping=True)
        await ws.prepare(request)
        protocol = ws.ws_protocol or ""
        api = self.docker.api
        exec_id = await asyncio.to_thread(api.exec_create, pod.container.id, command, stdin=stdin, stdout=True, stderr=True, tty=False)
        # keep the SDK's wrapper alive as long as the socket: it holds the HTTP response, whose collection by the garbage
        # collector would close the connection under the running exec (its output lost, its status still Success)
        hijacked = await asyncio.to_thread(api.exec_start, exec_id["Id"], socket=True)
        raw = hijacked._sock
        await ws.send_bytes(b"\x01")  # "stream ready": an empty message on the lowest output channel
        loop = asyncio.get_running_loop()
        cut = next((d for d in self._drops if d[1] is None or d[1] in command), None)
        drop = None
        if cut is not None:
            self._drops.remove(cut)
            drop = loop.call_later(cut[0], self._drop, request, name)
        output = asyncio.ensure_future(asyncio.to_thread(self._pump_output, raw, ws, loop))
        inbound = asyncio.ensure_future(self._pump_input(ws, raw, protocol))
        await output
        inspect = await asyncio.to_thread(api.exec_inspect, exec_id["Id"])
        for _ in range(100):  # the output can end a moment before Docker records the exit code
            if pod.killed or (not inspect.get("Running") and inspect.get("ExitCode") is not None):
                break
            await asyncio.sleep(0.05)
            inspect = await asyncio.to_thread(api.exec_inspect, exec_id["Id"])
        if pod.killed or (request.match_info["ns"], name) not in self.pods:
            pass  # the container died with the pod: the stream just ends, no status
        elif not ws.closed:
            code = inspect.get("ExitCode")
            try:
                await ws.send_bytes(b"\x03" + json.dumps(self.exec_status or self._exit_status(command, code)).encode())
            except ConnectionError:  # the client left first
                pass
        inbound.cancel()
        raw.close()
        del hijacked
        if drop is not None:
            drop.cancel()
        await ws.close()
        return ws

    def _drop(self, request: web.Request, pod: str) -> None:
        """Abort the exec's TCP connection: no close frame, no status (what a load balancer reset looks like)."""
        self.dropped.append(pod)
        if request.transport is not None:
            request.transport.abort()

    @staticmethod
    def _exit_status(command: list[str], code: int | None) -> dict[str, Any]:
        if code == 0:
            return {"metadata": {}, "status": "Success"}
        return {
            "metadata": {},
            "status": "Failure",
            "message": f"command terminated with non-zero exit code: error executing command {command}, exit code {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }

    def _pump_output(self, raw: socket.socket, ws: web.WebSocketResponse, loop: asyncio.AbstractEventLoop) -> None:
        """Docker's multiplexed exec output (8-byte headers) to channel-prefixed websocket messages."""

        def read_exact(n: int) -> bytes:
            buf = bytearray()
            while len(buf) < n:
                chunk = raw.recv(n - len(buf))
                if not chunk:
                    return b""
                buf += chunk
            return bytes(buf)

        while True:
            try:
                header = read_exact(8)
            except OSError:
                return
            if not header:
                return
            stream, size = header[0], struct.unpack(">I", header[4:])[0]
            payload = read_exact(size)
            if stream in (1, 2) and payload:
                try:
                    asyncio.run_coroutine_threadsafe(ws.send_bytes(bytes([stream]) + payload), loop).result(30)
                except Exception:  # noqa: BLE001 - the client went away
                    return

    async def _pump_input(self, ws: web.WebSocketResponse, raw: socket.socket, protocol: str) -> None:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or not msg.data:
                continue
            data = msg.data
            if data[0] == 255 and protocol == V5:  # v5 only: close a channel
                if data[1:2] == b"\x00":
                    self.stdin_closed.append(protocol)
                    raw.shutdown(socket.SHUT_WR)
                continue
            if data[0] == 0:
                self.stdin_frames.append(len(data))
                try:
                    await asyncio.to_thread(raw.sendall, data[1:])
                except OSError:
                    pass
        with contextlib.suppress(OSError):  # the client went away: its stdin ends, as the kubelet does
            raw.shutdown(socket.SHUT_WR)
