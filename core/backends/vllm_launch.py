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


def _watch(parent: int) -> None:
    """End this process group once the parent that started it has exited."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(os.getpgid(0), signal.SIGTERM)
    time.sleep(GRACE_S)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def main() -> None:
    parent = int(os.environ.get("FORGETUI_VLLM_PARENT", "0")) or os.getppid()
    threading.Thread(target=_watch, args=(parent,), name="forgetui-parent-watch", daemon=True).start()
    here = os.path.dirname(os.path.abspath(__file__))  # run by path, this folder is sys.path[0]: its vllm.py is not vLLM
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.argv = [SERVER_MODULE, *sys.argv[1:]]
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
