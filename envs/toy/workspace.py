"""Read-only probes of a sandbox workspace for verifiers (the agent's stdout is never trusted)."""

from __future__ import annotations

from pathlib import PurePosixPath

from core.adapter import Sandbox

PROBE_TIMEOUT_S = 30.0


class Workspace:
    """A sandbox's working directory, seen through `exec`/`get_file`."""

    def __init__(self, sandbox: Sandbox, workdir: str) -> None:
        self.sandbox = sandbox
        self.workdir = workdir

    def path(self, rel: str) -> str:
        return str(PurePosixPath(self.workdir) / rel)

    async def _test(self, flag: str, rel: str) -> bool:
        res = await self.sandbox.exec(["test", flag, rel], timeout_s=PROBE_TIMEOUT_S, workdir=self.workdir)
        return res.exit_code == 0 and not res.timed_out

    async def is_file(self, rel: str) -> bool:
        return await self._test("-f", rel)

    async def is_dir(self, rel: str) -> bool:
        return await self._test("-d", rel)

    async def exists(self, rel: str) -> bool:
        return await self._test("-e", rel)

    async def read(self, rel: str) -> str | None:
        """The file's text, or None when it is missing or not a regular file (one archive read, usually)."""
        try:
            data = await self.sandbox.get_file(self.path(rel))
        except FileNotFoundError:
            return None
        except IsADirectoryError:  # a folder, or a symlink: `test -f` follows links like a reader would
            if not await self.is_file(rel):
                return None
            res = await self.sandbox.exec(["cat", rel], timeout_s=PROBE_TIMEOUT_S, workdir=self.workdir)
            return res.stdout if res.ok else None
        return data.decode("utf-8", errors="replace")
