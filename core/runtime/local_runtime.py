"""Local "sandboxes": plain subprocesses in a temporary working directory. NOT isolated.

For development only: commands run as the current user with full access to this machine.
Absolute paths are mapped into the sandbox folder (``/workspace/x`` → ``<root>/workspace/x``)
so put/get behave as in a container; commands themselves see the real filesystem.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from core.errors import SandboxError
from core.runtime import _common as C
from core.runtime import labels as L
from core.runtime.base import Entry, EntryByExec, ExecResult, SandboxFile, SandboxSpec, shell_command

log = logging.getLogger(__name__)

MARKER = ".forgetui-sandbox"  # file in each sandbox root: the labels, one key=value per line


class LocalSandbox:
    """A temporary folder and the processes started in it."""

    def __init__(self, spec: SandboxSpec, base_dir: Path | None = None) -> None:
        self.spec = spec
        self.name = C.sandbox_name(spec.run_id, spec.rollout_id)
        self._base_dir = base_dir
        self.root: Path | None = None
        self._stopped = False
        self._procs: set[asyncio.subprocess.Process] = set()
        self._transcript: list[str] = []
        self._entry = EntryByExec()

    @property
    def id(self) -> str:
        return self.name

    def host_path(self, path: str) -> Path:
        """Where a sandbox path lives on the host (absolute paths are re-rooted under the sandbox folder)."""
        root = self._require()
        p = PurePosixPath(C.absolute(path, self.spec.workdir))
        return root.joinpath(*p.parts[1:])

    @property
    def workdir(self) -> Path:
        return self.host_path(self.spec.workdir)

    async def start(self, files: Sequence[SandboxFile] = (), entry: Entry | None = None) -> None:
        if self.root is None:
            self._make_root()
            await self._entry.begin(self, files, entry)

    async def wait_entry(self) -> ExecResult:
        return await self._entry.wait()

    def _make_root(self) -> None:
        log.warning(
            "LOCAL RUNTIME: sandbox %s is NOT isolated; commands run as %s with full access to this machine "
            "(development only; use the docker or kubernetes runtime for real runs)",
            self.name,
            L.default_owner(),
        )
        base = self._base_dir
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=base))
        (self.root / MARKER).write_text("".join(f"{k}={v}\n" for k, v in self.spec.all_labels().items()))
        self.workdir.mkdir(parents=True, exist_ok=True)

    def _require(self) -> Path:
        if self.root is None:
            raise SandboxError(f"sandbox {self.name} was not started (call start() first)")
        if self._stopped or not self.root.exists():
            raise SandboxError(f"sandbox {self.name} is gone: its folder {self.root} was removed")
        return self.root

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout_s: float,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self._require()
        argv = shell_command(cmd)
        cwd = self.host_path(workdir) if workdir else self.workdir
        full_env = {**os.environ, **self.spec.env, **(env or {}), "FORGETUI_SANDBOX_ROOT": str(self.root)}
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=full_env,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
            return ExecResult(127, "", f"{exc}", False)
        self._procs.add(proc)
        timed_out = False
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
        except asyncio.CancelledError:  # the run is stopping: the process group must not outlive it
            _kill_group(proc)
            raise
        except TimeoutError:
            timed_out = True
            _kill_group(proc)
            out, err = await proc.communicate()
        finally:
            self._procs.discard(proc)
        code = proc.returncode if proc.returncode is not None else -1
        result = ExecResult(code, out.decode(errors="replace"), err.decode(errors="replace"), timed_out)
        self._transcript.append(C.transcript_entry(argv, code, result.stdout, result.stderr, timed_out))
        return result

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = self.host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)

    async def put_dir(self, local_dir: Path | str, remote_dir: str) -> None:
        local = Path(local_dir)
        if not local.is_dir():
            raise FileNotFoundError(f"{local} is not a directory")
        await asyncio.to_thread(shutil.copytree, local, self.host_path(remote_dir), dirs_exist_ok=True)

    async def get_file(self, path: str) -> bytes:
        target = self.host_path(path)
        if not target.is_file():
            raise FileNotFoundError(f"{path} does not exist in sandbox {self.name}")
        return target.read_bytes()

    async def logs(self) -> str:
        return "\n\n".join(self._transcript)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._entry.cancel()
        for proc in list(self._procs):
            _kill_group(proc)
        if self.root is not None:
            await asyncio.to_thread(shutil.rmtree, self.root, True)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class LocalRuntime:
    """Runs sandboxes as local processes (no isolation; development only)."""

    name = "local"
    isolated = False
    images = "none"

    def __init__(self, base_dir: Path | None = None) -> None:
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.gettempdir()) / "forgetui-local"

    def available(self) -> bool:
        return True

    def create(self, spec: SandboxSpec) -> LocalSandbox:
        return LocalSandbox(spec, self.base_dir)

    async def reap(self, run_id: str | None = None, owner: str | None = None, *, stopped: bool = False) -> int:
        """Remove leftover sandbox folders under ``base_dir`` whose labels match.

        A folder has no running state of its own, so ``stopped`` selects nothing here.
        """
        if stopped or not self.base_dir.is_dir():
            return 0
        sel = L.selector(run_id, owner)
        removed = 0
        for marker in self.base_dir.glob(f"*/{MARKER}"):
            try:
                pairs = dict(line.split("=", 1) for line in marker.read_text().splitlines() if "=" in line)
            except OSError:
                continue
            if L.matches(pairs, sel):
                await asyncio.to_thread(shutil.rmtree, marker.parent, True)
                removed += 1
        return removed
