"""Reading a starting pod's state: scheduled or not, pulling, failed for good, or Running."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from core.errors import SandboxError
from core.runtime.k8s.config import KubernetesConfig
from core.runtime.k8s.diagnose import terminated_detail

PULL_TRANSIENT = {"ErrImagePull", "ImagePullBackOff"}  # the first is often a registry hiccup: retried a while
PULL_FATAL = {"InvalidImageName", "ErrImageNeverPull"}
CRASHING = {"CrashLoopBackOff"}  # an init container failing again and again (restartPolicy other than Never)
CONFIG_FATAL = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
PUSH_HINT = (
    "build and push it with `forgetui images build CONFIG --push` (runtime.registry set), or "
    "`forgetui images push TAG REGISTRY`; on kind: `kind load docker-image TAG`"
)


@dataclass(frozen=True)
class PodState:
    """One look at a pod: ``running``, ``scheduled``, a waiting reason and message, or a terminal ``ended``.

    ``container``/``image``: the container the waiting reason or failure is about, when it is an init
    container (the shared harness's copy step), so errors name it and the image it could not pull.
    ``stage``: where a pod that is neither failing nor Running is (ContainerCreating, PodInitializing, Pending).
    """

    running: bool
    scheduled: bool
    deleting: bool
    ended: str | None = None
    waiting: str | None = None
    message: str = ""
    container: str | None = None
    image: str | None = None
    stage: str = ""


NOT_A_PROBLEM = ("ContainerCreating", "PodInitializing")


def _init_state(status: Any, deleting: bool) -> PodState | None:
    """What the init containers say: one failed (the pod cannot start) or waits for a reason worth reporting."""
    for cs in status.init_container_statuses or []:
        state = cs.state
        done = state.terminated if state else None
        if done is not None and done.exit_code != 0:
            detail = f"exit {done.exit_code}, {done.reason or 'Error'}{': ' + done.message if done.message else ''}"
            return PodState(False, True, deleting, ended=f"init container {cs.name} failed ({detail})", container=cs.name, image=cs.image)
        waiting = state.waiting if state else None
        if waiting is not None and waiting.reason and waiting.reason not in NOT_A_PROBLEM:
            return PodState(False, True, deleting, waiting=waiting.reason, message=waiting.message or "", container=cs.name, image=cs.image)
    return None


def read_state(pod: Any) -> PodState:
    """The state of a ``V1Pod`` (from ``read_namespaced_pod``)."""
    status = pod.status
    deleting = bool(pod.metadata and pod.metadata.deletion_timestamp)
    phase = (status.phase if status else None) or "Pending"
    init = _init_state(status, deleting) if status else None
    if init is not None and (init.ended or phase != "Running"):
        return init
    containers = terminated_detail(status.container_statuses) if status else ""
    if phase in ("Failed", "Succeeded") or containers:
        pod_reason = f"{status.reason or ''} {status.message or ''}".strip()
        return PodState(False, True, deleting, ended="; ".join(x for x in (f"{phase}: {pod_reason}".strip().rstrip(":"), containers) if x))
    scheduled, message, stage = bool(status and status.host_ip), "", phase
    for cond in (status.conditions or []) if status else []:
        if cond.type == "PodScheduled":
            scheduled = cond.status == "True"
            if not scheduled:
                message = f"{cond.reason or 'not scheduled'}: {cond.message or ''}".strip()
    for cs in (status.container_statuses or []) if status else []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason and waiting.reason not in NOT_A_PROBLEM:
            return PodState(False, True, deleting, waiting=waiting.reason, message=waiting.message or "")
        if waiting is not None and waiting.reason:
            stage = waiting.reason
    return PodState(phase == "Running", scheduled, deleting, message=message, stage=stage)


class StartWatch:
    """Decides, look after look, whether a starting pod is fine to wait for; raises SandboxError when not."""

    def __init__(self, name: str, image: str, cfg: KubernetesConfig) -> None:
        self.name, self.image, self.cfg = name, image, cfg
        self.created = time.monotonic()
        self.scheduled_at: float | None = None
        self.pull_failing_since: float | None = None
        self.unschedulable_since: float | None = None  # when the scheduler first said why the pod fits no node
        self.autoscaling = False  # a cluster autoscaler is adding a node for it (TriggeredScaleUp): schedule_timeout_s applies

    def check(self, state: PodState, now: float | None = None) -> bool:
        """True once Running; False to keep waiting."""
        now = time.monotonic() if now is None else now
        if state.deleting:
            raise SandboxError(f"pod {self.name} is being deleted while starting (by someone else, or evicted)")
        if state.ended:
            raise SandboxError(f"pod {self.name} ended while starting ({state.ended})")
        if state.waiting in CRASHING:
            raise SandboxError(f"pod {self.name}: {state.container or 'its container'} keeps failing ({state.waiting}: {state.message})")
        if state.running:
            return True
        if not state.scheduled:
            if state.message:  # the scheduler said why (Unschedulable: 0/3 nodes are available: 3 Insufficient cpu)
                self.unschedulable_since = self.unschedulable_since or now
            waited = now - self.created
            said = now - self.unschedulable_since if self.unschedulable_since is not None else 0.0
            if waited > self.cfg.schedule_timeout_s or (not self.autoscaling and said > self.cfg.unschedulable_s):
                limit = self.cfg.schedule_timeout_s if waited > self.cfg.schedule_timeout_s else self.cfg.unschedulable_s
                raise SandboxError(
                    f"pod {self.name} was not scheduled within {limit:g}s "
                    f"({state.message or 'no node took it'}): free or add nodes, lower runtime.cpus/memory, or "
                    "check runtime.kubernetes.node_selector/tolerations"
                )
            return False
        self.scheduled_at = self.scheduled_at or now
        if state.waiting in CONFIG_FATAL:
            raise SandboxError(
                f"pod {self.name} cannot create its container: {state.waiting}: {state.message} "
                "(a missing secret, or runAsNonRoot with an image whose user is root: set runtime.kubernetes.run_as_user)"
            )
        image = state.image or self.image
        whose = f" (init container {state.container})" if state.container else ""
        if state.waiting in PULL_FATAL:
            raise SandboxError(f"pod {self.name} cannot use image {image!r}{whose}: {state.waiting}: {state.message}; {PUSH_HINT}")
        if state.waiting in PULL_TRANSIENT:
            self.pull_failing_since = self.pull_failing_since or now
            if now - self.pull_failing_since > self.cfg.pull_retry_s:
                raise SandboxError(
                    f"pod {self.name} cannot pull image {image!r}{whose} ({state.waiting}: {state.message}) for "
                    f"{self.cfg.pull_retry_s:g}s: is it in a registry the cluster can pull from? {PUSH_HINT}"
                )
        else:
            self.pull_failing_since = None
        if now - self.scheduled_at > self.cfg.start_timeout_s:
            raise SandboxError(
                f"pod {self.name} was scheduled but not Running after {self.cfg.start_timeout_s:g}s "
                f"(still {state.waiting or state.stage or 'Pending'}{': ' + state.message if state.message else ''})"
            )
        return False


__all__ = ["PodState", "StartWatch", "read_state"]
