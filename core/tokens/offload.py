"""Tokenizing for a caller that may leave: off the event loop, and stopped when the caller is gone.

`run_cancellable(fn, ...)` runs a tokenizing function (a prompt plan, a token count) on a worker
thread, never on the event loop. Inside it, `encode` sends a big text (≥ `BIG_TEXT_CHARS`) to a
child process that loads the same tokenizer (its `tokenizer.json`) and returns the ids; when the
awaiting task is cancelled (the client left, the call timed out) the child is killed at once, so a
25 MB prompt nobody waits for stops costing CPU. A fast tokenizer cannot be interrupted inside
`encode`, and splitting a text into chunks would change its ids at the seams, so a process it is.
Small texts (most prompts) are encoded in the thread: a child costs ~0.2 s to start.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import concurrent.futures
import contextvars
import logging
import os
import resource
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from core.errors import ModelError, ProtocolError

log = logging.getLogger(__name__)

T = TypeVar("T")

BIG_TEXT_CHARS = 256 * 1024  # ~0.1-0.3 s of encoding in-process; past it a child process does it
CHILD_MEMORY_BYTES_PER_CHAR = 400  # measured ~150 (ids, offsets and token strings of each piece) and headroom
CHILD_MEMORY_FLOOR = 2 << 30
_POLL_S = 0.05
_WRITE_CHUNK = 1 << 20

_cancel: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("forgetui_tokenize_cancel", default=None)
# threads that mostly wait on a child: more of them than CPUs, so big prompts never hold up the small ones' plans
_threads = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="forgetui-tokenize")


class TokenizeCancelled(Exception):
    """The caller of a tokenization left; the work was stopped."""


async def run_cancellable(fn: Callable[..., T], /, *args: Any) -> T:
    """`fn(*args)` on a worker thread; if the awaiting task is cancelled, the big tokenizations it runs stop."""
    cancel = threading.Event()
    context = contextvars.copy_context()
    context.run(_cancel.set, cancel)
    future = asyncio.get_running_loop().run_in_executor(_threads, context.run, fn, *args)
    try:
        return await future
    except asyncio.CancelledError:
        cancel.set()
        raise


def encode_in_child(tokenizer: Any, text: str) -> list[int] | None:
    """The ids of a big `text` from a killable child process, when a cancellable caller asked; None: encode here."""
    cancel = _cancel.get()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if cancel is None or backend is None or len(text) < BIG_TEXT_CHARS:
        return None
    if cancel.is_set():
        raise TokenizeCancelled()
    return _Child(_tokenizer_file(backend), len(text)).encode(text.encode("utf-8"), cancel)


class _Child:
    """One child process encoding one text: started, fed, read, and killed whenever the caller gives up."""

    def __init__(self, tokenizer_file: Path, chars: int) -> None:
        self.limit = max(CHILD_MEMORY_FLOOR, chars * CHILD_MEMORY_BYTES_PER_CHAR)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "core.tokens.encode_child", str(tokenizer_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=self._cap,  # noqa: PLW1509 - only setrlimit, no locks: safe before exec
        )

    def _cap(self) -> None:
        resource.setrlimit(resource.RLIMIT_AS, (self.limit, self.limit))

    def encode(self, data: bytes, cancel: threading.Event) -> list[int]:
        try:
            self._send(struct.pack("<Q", len(data)), cancel)
            for at in range(0, len(data), _WRITE_CHUNK):
                self._send(data[at : at + _WRITE_CHUNK], cancel)
            self.proc.stdin.close()
            count = struct.unpack("<Q", self._read(8, cancel))[0]
            ids = array.array("I")
            ids.frombytes(self._read(4 * count, cancel))
            return ids.tolist()
        except (BrokenPipeError, EOFError) as exc:
            raise self._failed() from exc
        finally:
            self._stop()

    def _send(self, data: bytes, cancel: threading.Event) -> None:
        if cancel.is_set():
            raise TokenizeCancelled()
        self.proc.stdin.write(data)

    def _read(self, n: int, cancel: threading.Event) -> bytes:
        out = bytearray()
        fd = self.proc.stdout.fileno()
        while len(out) < n:
            if cancel.is_set():
                raise TokenizeCancelled()
            ready, _, _ = select.select([fd], [], [], _POLL_S)
            if ready:
                chunk = os.read(fd, min(n - len(out), 1 << 20))
                if not chunk:
                    raise EOFError
                out += chunk
        return bytes(out)

    def _failed(self) -> Exception:
        self.proc.wait()
        err = self.proc.stderr.read().decode("utf-8", "replace").strip()[-500:]
        if "MemoryError" in err or "memory allocation" in err.lower() or self.proc.returncode in (-9, -6):
            return ProtocolError(f"the prompt is too big to tokenize within {self.limit >> 20} MiB; send a shorter one")
        return ModelError(f"tokenizing the prompt failed in its worker process (exit {self.proc.returncode}): {err or 'no message'}")

    def _stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass


_files: dict[int, tuple[Any, Path]] = {}
_files_lock = threading.Lock()
_dir: Path | None = None


def _tokenizer_file(backend: Any) -> Path:
    """The tokenizer's `tokenizer.json`, written once per process (children load it from there)."""
    global _dir
    with _files_lock:
        held = _files.get(id(backend))
        if held is not None and held[0] is backend:
            return held[1]
        if _dir is None:
            _dir = Path(tempfile.mkdtemp(prefix="forgetui-tokenizers-"))
            atexit.register(shutil.rmtree, _dir, True)
        path = _dir / f"{len(_files)}.json"
        path.write_text(backend.to_str(), encoding="utf-8")
        _files[id(backend)] = (backend, path)  # holds the backend, so its id is never reused for another
        return path
