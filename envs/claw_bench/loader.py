"""Find the installed claw-bench task folder and read its tasks (instruction, task.toml, workspace files)."""

from __future__ import annotations

import os
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from core.adapter import ConfigError

DIST = "claw-bench"
SHARE = Path("share") / "claw-bench" / "tasks"
TASKS_ENV = "FORGETUI_CLAW_BENCH_TASKS"  # overrides where the tasks folder is
SKIP = {"__pycache__", ".pytest_cache"}  # caches, never part of a task


@dataclass(frozen=True)
class ClawTask:
    """One task folder as claw-bench ships it: tasks/<domain>/<name>/."""

    path: Path
    config: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.config["id"])

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def domain(self) -> str:
        return str(self.config.get("domain") or self.path.parent.name)

    @property
    def level(self) -> str:
        return str(self.config.get("level", ""))

    @property
    def rel(self) -> str:
        """The task's path below the tasks root: <domain-folder>/<name>."""
        return f"{self.path.parent.name}/{self.path.name}"


def _looks_like_tasks(path: Path) -> bool:
    return path.is_dir() and (path / "conftest.py").is_file() and any(path.glob("*/*/task.toml"))


def _candidates() -> list[Path]:
    out = [Path(sys.prefix) / SHARE, Path(sysconfig.get_path("data")) / SHARE, Path(sys.base_prefix) / SHARE]
    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        return out
    for f in dist.files or []:
        parts = Path(str(f)).parts
        if parts[-4:] == ("share", "claw-bench", "tasks", "conftest.py"):
            out.insert(0, Path(str(dist.locate_file(f))).resolve().parent)
            break
    return out


def find_tasks_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The claw-bench tasks root: `explicit`, $FORGETUI_CLAW_BENCH_TASKS, or the installed package's share folder."""
    given = explicit or os.environ.get(TASKS_ENV)
    if given:
        path = Path(given).expanduser()
        if not _looks_like_tasks(path):
            raise ConfigError(f"claw-bench: {path} is not a claw-bench tasks folder (expected conftest.py and <domain>/<task>/task.toml)")
        return path
    for path in _candidates():
        if _looks_like_tasks(path):
            return path
    raise ConfigError(f"claw-bench tasks not found: `pip install {DIST}==0.1.0` into this Python ({sys.prefix}), or set {TASKS_ENV} / env option tasks_dir")


def load_tasks(root: Path) -> list[ClawTask]:
    """Every task below `root`, sorted by domain folder then task folder."""
    out = []
    for toml in sorted(root.glob("*/*/task.toml")):
        if toml.parent.parent.name.startswith(("_", ".")):
            continue
        try:
            config = tomllib.loads(toml.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"claw-bench: cannot read {toml}: {exc}") from exc
        if "id" not in config:
            raise ConfigError(f"claw-bench: {toml} has no id")
        out.append(ClawTask(toml.parent, config))
    return out


def tree_files(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` by its relative posix path (caches and stale workspaces left out)."""
    out: dict[str, bytes] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not SKIP.intersection(rel.parts) and path.suffix != ".pyc":
            out[rel.as_posix()] = path.read_bytes()
    return out
