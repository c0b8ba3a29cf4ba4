"""Keeping Python's full garbage collections short while big data is on screen.

A loaded run (10,000 rollout rows, table rows, a 20k-token sample) is hundreds of thousands of objects that
live as long as the screen does; every full collection walks them all, a 100–200 ms freeze on the event
loop. `gc.freeze()` moves everything alive into a permanent generation the collector skips (the technique
CPython documents for exactly this); when a screen closes, `thaw` hands its objects back so the next
collection can free them (one pause then, on the user's Esc, not while they read)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_loading = 0  # workers inside `loading()` now
_was_enabled = True


def freeze_loaded() -> None:
    """Call once a large load is on screen (and once the app is up: the modules imported at start-up live as long)."""
    gc.freeze()


@contextmanager
def loading() -> Iterator[None]:
    """Around a worker building a big load: no automatic collection meanwhile, and what is alive frozen at the end.

    A worker allocating a 20k-token rollout's objects set off full collections itself, and a collection holds the
    GIL: the event loop stood still for as long (one run of the TUI benchmark stalled 376 ms opening that rollout).
    Freezing before collections resume keeps the new objects out of them too.
    """
    global _loading, _was_enabled
    with _lock:
        if _loading == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _loading += 1
    try:
        yield
    finally:
        with _lock:
            _loading -= 1
            if _loading == 0:
                gc.freeze()
                if _was_enabled:
                    gc.enable()


def thaw() -> None:
    """Call when a screen holding large data goes away: its objects are collected now, what is still alive frozen again.

    The pause comes on the user's Esc, never later at random while they read; the app's own start-up objects and
    the screens still open stay out of later collections.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
