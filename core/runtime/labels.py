"""Label keys every forgetui container/pod carries, and helpers to build and match them."""

from __future__ import annotations

import getpass
import os
import re

RUN = "forgetui.run"
ROLLOUT = "forgetui.rollout"
OWNER = "forgetui.owner"
MANAGED = "forgetui.managed"  # always "true": marks a container/pod as ours even without a run id
IMAGE = "forgetui.image"  # "true" on images forgetui built (not MANAGED: containers inherit image labels)

_K8S_VALUE = re.compile(r"[^A-Za-z0-9._-]")


def default_owner() -> str:
    """The owner recorded on sandboxes: $FORGETUI_OWNER, else the login name."""
    owner = os.environ.get("FORGETUI_OWNER")
    if owner:
        return owner
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def sandbox_labels(
    run_id: str, rollout_id: str, owner: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The labels of one rollout's sandbox; ``extra`` cannot override the forgetui keys."""
    labels = dict(extra or {})
    labels.update({MANAGED: "true", RUN: run_id, ROLLOUT: rollout_id, OWNER: owner})
    return labels


def selector(run_id: str | None = None, owner: str | None = None) -> dict[str, str]:
    """Labels that select our sandboxes, optionally of one run and/or one owner."""
    sel = {MANAGED: "true"}
    if run_id is not None:
        sel[RUN] = run_id
    if owner is not None:
        sel[OWNER] = owner
    return sel


def matches(labels: dict[str, str] | None, sel: dict[str, str]) -> bool:
    """True when ``labels`` carry every key/value of ``sel``."""
    labels = labels or {}
    return all(labels.get(k) == v for k, v in sel.items())


def k8s_value(value: str) -> str:
    """A label value Kubernetes accepts: [A-Za-z0-9._-], ≤63 chars, alphanumeric at both ends."""
    cleaned = _K8S_VALUE.sub("_", value)[:63].strip("._-")
    return cleaned or "x"


def k8s_selector(sel: dict[str, str]) -> str:
    """A Kubernetes label selector string (``k=v,k2=v2``)."""
    return ",".join(f"{k}={k8s_value(v)}" for k, v in sel.items())
