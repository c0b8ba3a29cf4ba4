"""Two reference harnesses for checking environments: `oracle` runs a task's reference solution, `noop` does nothing.

An env supports the oracle by putting the host path of its task's `solve.sh` in
``Task.solution`` (claw-bench and harbor do). The solution's whole folder is copied to
/solution in the sandbox (harbor's convention) and run as ``bash /solution/solve.sh WORKDIR``
from the workdir (claw-bench's solutions read the workspace from $1; harbor's ignore it).
``Task.meta["workdir"]``, when set, overrides the run's workdir (a harbor image's WORKDIR).
Neither harness calls the model.
"""

from __future__ import annotations

from pathlib import Path

from core.adapter import ConfigError, Endpoint, Harness, LaunchSpec, NoOptions, Task

SOLUTION_DIR = "/solution"
MAX_SOLUTION_BYTES = 20 * 1024 * 1024
RUN_SOLUTION = 'R="${FORGETUI_SANDBOX_ROOT:-}"; exec bash "$R$1" "$R$2"'  # bash -c RUN_SOLUTION oracle SCRIPT WORKDIR


def solution_files(task: Task) -> dict[str, bytes]:
    """The files of the task's solution folder by their path under /solution; ConfigError when it has none."""
    where = task.solution
    if not where:
        raise ConfigError(f"task {task.id!r} has no reference solution (Task.solution is unset): the oracle harness needs one")
    script = Path(str(where))
    if not script.is_file():
        raise ConfigError(f"task {task.id!r}: its solution {script} does not exist on this machine")
    out: dict[str, bytes] = {}
    size = 0
    for path in sorted(script.parent.rglob("*")):
        rel = path.relative_to(script.parent)
        if path.is_file() and "__pycache__" not in rel.parts:
            data = path.read_bytes()
            size += len(data)
            out[f"{SOLUTION_DIR}/{rel.as_posix()}"] = data
    if size > MAX_SOLUTION_BYTES:
        raise ConfigError(f"task {task.id!r}: solution folder {script.parent} is over {MAX_SOLUTION_BYTES >> 20} MiB")
    return out


class OracleHarness(Harness):
    """Runs the task's reference solution; an env whose oracle fails has a broken task or verifier."""

    name = "oracle"
    version = "1"
    protocols = ()
    Options = NoOptions

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        files = solution_files(task)
        script = Path(str(task.solution)).name
        where = str(task.meta.get("workdir") or workdir)
        # $FORGETUI_SANDBOX_ROOT: the local runtime's root, under which it re-roots absolute paths
        command = ["bash", "-c", RUN_SOLUTION, "oracle", f"{SOLUTION_DIR}/{script}", where]
        return LaunchSpec(command=command, files=files, workdir=where)  # type: ignore[arg-type]


class NoopHarness(Harness):
    """Does nothing and exits 0: an untouched workspace must never pass."""

    name = "noop"
    version = "1"
    protocols = ()
    Options = NoOptions

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        return LaunchSpec(command=["true"])


__all__ = ["NoopHarness", "OracleHarness", "solution_files"]
