"""Helpers shared by the sandbox backends: names, tar packing, exec transcripts."""

from __future__ import annotations

import errno
import io
import math
import os
import posixpath
import re
import secrets
import stat
import tarfile
import time
from pathlib import Path, PurePosixPath

TRANSCRIPT_CHARS = 4000  # per exec stream kept for logs()


def sandbox_name(run_id: str, rollout_id: str, limit: int = 63) -> str:
    """A unique DNS-1123-ish name for a container/pod: ``forgetui-<run>-<rollout>-<6 hex>``."""

    def clean(text: str) -> str:
        return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"

    suffix = secrets.token_hex(3)
    budget = limit - len("forgetui---") - len(suffix)
    run, rollout = clean(run_id), clean(rollout_id)
    half = budget // 2
    rollout = rollout[: max(half, budget - len(run))]
    run = run[: budget - len(rollout)]
    return re.sub(r"-+", "-", f"forgetui-{run}-{rollout}-{suffix}")


def absolute(path: str, workdir: str) -> str:
    """``path`` made absolute against the sandbox working directory."""
    p = PurePosixPath(path)
    return str(p if p.is_absolute() else PurePosixPath(workdir) / p)


def tar_file(name: str, data: bytes, mode: int) -> bytes:
    """A tar archive holding one file at ``name`` (relative to the extraction root)."""
    return tar_files([(name, data, mode)])


def tar_files(files: list[tuple[str, bytes, int]]) -> bytes:
    """A tar archive of ``(name, data, mode)`` files, names relative to the extraction root."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, mode in files:
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size = len(data)
            info.mode = mode
            info.mtime = now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def read_beneath(root: str, path: str) -> bytes | None:
    """The regular file at ``path`` inside the tree at ``root``, opened without following any symlink.

    Returns None when the walk meets a symlink, a non-directory in the middle or a non-regular file:
    those need the container's own view of the path (the caller asks the engine). Raises
    FileNotFoundError when a component is missing. A sandbox can plant symlinks to host files, which is
    why every component is opened relative to its parent with O_NOFOLLOW.
    """
    parts = PurePosixPath(posixpath.normpath("/" + path)).parts[1:]
    if not parts:
        return None
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, dir_flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise FileNotFoundError(path) from None
                return None  # ELOOP (a symlink), ENOTDIR, EACCES: not ours to resolve
            os.close(fd)
            fd = child
        try:
            file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise FileNotFoundError(path) from None
            return None
        if not stat.S_ISREG(os.fstat(file_fd).st_mode):
            os.close(file_fd)
            return None
        with os.fdopen(file_fd, "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def tar_dir(local_dir: Path) -> bytes:
    """A tar archive of ``local_dir``'s contents (entries relative to it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(Path(local_dir).iterdir()):
            tar.add(str(child), arcname=child.name)
    return buf.getvalue()


def untar_file(archive: bytes, path: str) -> bytes:
    """The content of ``path`` from an archive of it (as `docker cp`/`tar c` produce).

    Only the archive's top entry counts: the archive of a folder holds its files, and none of them is
    the folder's content. A symlink is not followed (the caller may read its target itself).
    """
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        top = next(iter(tar), None)
        if top is not None and top.isfile() and "/" not in top.name.strip("/"):
            extracted = tar.extractfile(top)
            assert extracted is not None
            return extracted.read()
    raise IsADirectoryError(f"{path} is not a regular file")


def timeout_wrap(cmd: list[str], timeout_s: float) -> list[str]:
    """``cmd`` under coreutils ``timeout --signal=KILL``, which kills its whole process group."""
    return ["timeout", "--signal=KILL", f"{max(1, math.ceil(timeout_s))}s", *cmd]


def clip(text: str, limit: int = TRANSCRIPT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2 :]


def transcript_entry(cmd: list[str], exit_code: int, stdout: str, stderr: str, timed_out: bool) -> str:
    head = f"$ {' '.join(cmd)}  -> exit {exit_code}{' (timed out)' if timed_out else ''}"
    parts = [head]
    if stdout:
        parts.append(clip(stdout).rstrip())
    if stderr:
        parts.append("[stderr] " + clip(stderr).rstrip())
    return "\n".join(parts)
