"""Failures that used to take minutes, in seconds: an unschedulable pod, an exceeded quota, missing permissions.

Each against the API stand-in with the real client: the stand-in answers as the API server does (a scripted
Unschedulable status with the scheduler's FailedScheduling event, 403 ``exceeded quota``, 403 Forbidden in RBAC's
words, SelfSubjectAccessReviews).
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from core.errors import SandboxError
from core.runtime.k8s.config import KubernetesConfig
from core.runtime.k8s.permissions import needs
from tests.k8s_apiserver import ApiServerStandIn
from tests.test_runtime_kubernetes import _live, _runtime

UNSCHEDULABLE = {
    "phase": "Pending",
    "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu."}],
}
SCHEDULER_SAYS = ("FailedScheduling", "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.")


@pytest.fixture()
def standin(docker_client, base_image):
    with ApiServerStandIn(docker_client) as server:
        yield server


async def test_an_unschedulable_pod_fails_with_the_schedulers_reason_in_seconds(standin, base_image, caplog):
    caplog.set_level(logging.WARNING, logger="core.runtime.k8s.sandbox")
    standin.script_next_pod([(60, UNSCHEDULABLE)], events=[SCHEDULER_SAYS])
    sb = _runtime(standin, unschedulable_s=2).create(_live(base_image))  # schedule_timeout_s stays 300
    started = time.monotonic()
    with pytest.raises(SandboxError, match=r"not scheduled within 2s \(Unschedulable: 0/3 nodes .*Insufficient cpu.*events: Warning FailedScheduling"):
        await sb.start()
    assert time.monotonic() - started < 20  # was schedule_timeout_s: 300 s of silence
    said = [r.getMessage() for r in caplog.records if "fits no node yet" in r.getMessage()]
    assert len(said) == 1 and "No preemption victims" in said[0]  # the scheduler's reason at once, from its event


async def test_an_autoscaler_adding_a_node_gets_the_schedule_timeout(standin, base_image):
    standin.script_next_pod([(60, UNSCHEDULABLE)], events=[SCHEDULER_SAYS, ("TriggeredScaleUp", "pod triggered scale-up: [{pool-1 1->2 (max: 5)}]")])
    sb = _runtime(standin, unschedulable_s=1, schedule_timeout_s=4).create(_live(base_image))
    started = time.monotonic()
    with pytest.raises(SandboxError, match="not scheduled within 4s"):
        await sb.start()
    assert time.monotonic() - started >= 4  # not cut at unschedulable_s: a node is on its way


async def test_a_quota_refusal_waits_for_quota_and_says_to_lower_concurrency(docker_client, base_image, caplog):
    caplog.set_level(logging.WARNING, logger="core.runtime.k8s.runtime")
    with ApiServerStandIn(docker_client, quota_pods=1) as server:
        rt = _runtime(server, quota_wait_s=60)
        first = rt.create(_live(base_image, rollout_id="a"))
        await first.start()
        second = rt.create(_live(base_image, rollout_id="b"))
        waiting = asyncio.ensure_future(second.start())
        await asyncio.sleep(2.0)
        assert not waiting.done() and len(server.requests("POST", "/pods$")) >= 3  # refused, asked again, not failed
        (said,) = [r.getMessage() for r in caplog.records if "exceeded quota" in r.getMessage()]
        assert "limited: pods=1" in said and "1 pod(s) of this run are live: lower run.concurrency to 1" in said
        await first.stop()  # its end frees the quota
        await asyncio.wait_for(waiting, 60)
        assert (await second.exec(["echo", "in"], timeout_s=10)).stdout == "in\n"
        await second.stop()
        # nothing frees it: the rollout fails after quota_wait_s, saying why
        rt = _runtime(server, quota_wait_s=1)
        third, fourth = rt.create(_live(base_image, run_id="run-q", rollout_id="c")), rt.create(_live(base_image, run_id="run-q", rollout_id="d"))
        await third.start()
        with pytest.raises(SandboxError, match=r"exceeded quota.*still over the namespace's ResourceQuota after 1s; 1 pod\(s\) of this run are live"):
            await fourth.start()
        await third.stop()


async def test_a_refused_exec_is_final_not_a_lost_stream(docker_client, base_image):
    with ApiServerStandIn(docker_client, denied={("create", "pods/exec")}) as server:
        sb = _runtime(server, check_permissions=False).create(_live(base_image))  # reattach_s stays 300
        started = time.monotonic()
        with pytest.raises(SandboxError, match=r"exec in pod \S+ was refused \(.*403.*\): this identity may not create/get pods/exec"):
            await sb.start()  # the first pod's probe is its first exec
        assert time.monotonic() - started < 20
        assert len(server.requests("GET", "/exec$")) == 1  # asked once: a 403 is not retried or reattached


async def test_missing_permissions_are_named_before_anything_is_created(docker_client, base_image, caplog):
    denied = {("create", "pods/exec"), ("create", "networkpolicies"), ("list", "events")}
    with ApiServerStandIn(docker_client, denied=denied) as server:
        sb = _runtime(server).create(_live(base_image))
        with pytest.raises(SandboxError, match=r"may not create pods/exec, create networkpolicies.networking.k8s.io in namespace sandboxes .*kubernetes-rbac.yaml.*network_policy = false"):
            await sb.start()
        assert not server.requests("POST", "/pods$") and not server.requests("POST", "/networkpolicies$")
        asked = {(r["verb"], r["resource"] + ("/" + r["subresource"] if r.get("subresource") else "")) for r in server.reviews}
        assert asked == {(n.verb, n.resource) for n in needs(KubernetesConfig())}
    caplog.set_level(logging.WARNING, logger="core.runtime.k8s.permissions")
    with ApiServerStandIn(docker_client, denied={("list", "events")}) as server:  # optional: warned, and the run goes on
        sb = _runtime(server).create(_live(base_image))
        await sb.start()
        assert any("may not list events" in r.getMessage() for r in caplog.records)
        await sb.stop()


async def test_unreadable_events_are_said_not_dropped(docker_client, base_image):
    with ApiServerStandIn(docker_client, denied={("list", "events")}) as server:
        sb = _runtime(server, check_permissions=False, pull_retry_s=0.5).create(_live("forgetui/no-such-image:1"))
        with pytest.raises(SandboxError, match=r"cannot pull image .*the pod's Events are unreadable: 403 .*cannot list resource \"events\".*grant list on events"):
            await sb.start()
