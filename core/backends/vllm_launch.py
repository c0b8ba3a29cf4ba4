"""Runs vLLM's OpenAI server in the child process `core.backends.vllm_server` starts, and ends it if that parent dies.

Executed by path with the vLLM environment's interpreter (``.venv-vllm/bin/python vllm_launch.py ARGS``), so it
imports nothing from forgetui. A watchdog thread sees the parent go (the child is re-parented) and ends the
server's whole process group: a parent killed with SIGKILL leaves no vLLM behind. PR_SET_PDEATHSIG would fire
when the parent's *thread* that started the child ends (a policy loads on a short-lived thread), so it is not used.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
GRACE_S = 10.0
SPIN_ENV = "FORGETUI_VLLM_SPIN_S"  # seconds a shared-memory queue's reader spins after a read (vLLM's own: 1)


def _watch(parent: int) -> None:
    """End this process group once the parent that started it has exited."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(os.getpgid(0), signal.SIGTERM)
    time.sleep(GRACE_S)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _limit_spin(seconds: float) -> None:
    """Give every shared-memory queue's reader a busy loop of `seconds` instead of vLLM's 1 s.

    vLLM's processes hand each step's work and results over shared-memory queues whose reader spins
    (`os.sched_yield` in a loop) for 1 s after every read before it blocks on the writer's notification.
    With the model on one core and the scheduler on the other, the scheduler's spin took ~0.5 of a core
    during an eval on 2 cores, the core the sandboxes and the harness run on (py-spy, 2026-12-07). The
    constant has no setting of its own; the processes are forked from this one (vLLM's default on a CPU),
    so a default changed here holds in all of them. 0: the reader blocks at once and the writer's
    notification (sent on every write) wakes it.
    """
    from vllm.distributed.device_communicators import shm_broadcast

    spin_condition = shm_broadcast.SpinCondition
    original = spin_condition.__init__

    def init(self, is_reader, context, notify_address, busy_loop_s: float = seconds):  # noqa: ANN001
        original(self, is_reader, context, notify_address, busy_loop_s)

    spin_condition.__init__ = init


def main() -> None:
    parent = int(os.environ.get("FORGETUI_VLLM_PARENT", "0")) or os.getppid()
    threading.Thread(target=_watch, args=(parent,), name="forgetui-parent-watch", daemon=True).start()
    here = os.path.dirname(os.path.abspath(__file__))  # run by path, this folder is sys.path[0]: its vllm.py is not vLLM
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    if os.environ.get(SPIN_ENV):
        _limit_spin(float(os.environ[SPIN_ENV]))
    sys.argv = [SERVER_MODULE, *sys.argv[1:]]
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
