"""Where forgetui keeps its runs, stores, caches and models: FORGETUI_HOME (default ~/.forgetui)."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The forgetui home folder, created on first use."""
    root = Path(os.environ.get("FORGETUI_HOME") or Path.home() / ".forgetui").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def sub(name: str) -> Path:
    """A folder under FORGETUI_HOME (``runs``, ``models``, ``stores``, ``cache``), created on first use."""
    path = home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    return sub("models")


def runs_dir() -> Path:
    return sub("runs")


def stores_dir() -> Path:
    """Stores of standalone `forgetui proxy` sessions (runs keep theirs in their run folder)."""
    return sub("stores")


def cache_dir() -> Path:
    return sub("cache")
