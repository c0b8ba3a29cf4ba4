"""Registries of extension points: the project's own entries plus any a package registers as an entry point.

Each extension point (harnesses, environments, backends, runtimes, trainers) is a `Registry`: a name maps
to ``"package.module:attribute"``, imported only when that name is used, so naming a backend never loads
the others (or to a small declaration object, kept as it is). Built-in entries are declared in code (they work from a source checkout that was never
installed); a third party adds one with an entry point in its own package's metadata, e.g.

    [project.entry-points."forgetui.backends"]
    mybackend = "my_pkg.backend:KIND"

A name written as ``package.module:attribute`` is imported directly (one-off plugins and tests).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from core.errors import ConfigError


def import_target(target: str) -> Any:
    """The attribute ``package.module:attribute`` names; ConfigError when it does not import."""
    module, _, attr = target.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in attr.split(".") if attr else ():
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import {target!r}: {exc}") from None
    return found


class Registry:
    """Names → objects for one extension point (`group` is its entry-point group, e.g. ``forgetui.backends``).

    The project's registries: harnesses (`forgetui.harnesses`) and environments (`forgetui.envs`) in
    `core.registry`, policy backend kinds (`forgetui.backends`, `core.backends.kinds.BACKENDS`), sandbox
    runtimes (`forgetui.runtimes`, `core.runtime.RUNTIMES`) and trainers (`forgetui.trainers`, `core.train.trainers.TRAINERS`).
    """

    def __init__(self, group: str, what: str, builtins: Mapping[str, Any] | None = None) -> None:
        self.group = group
        self.what = what  # "backend", "runtime", ...: how errors name an entry
        self.builtins = dict(builtins or {})

    def _installed(self) -> dict[str, Any]:
        return {ep.name: ep for ep in entry_points(group=self.group)}

    def names(self) -> list[str]:
        """Every registered name, built-in or installed."""
        return sorted(set(self.builtins) | set(self._installed()))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.builtins or name in self._installed())

    def load(self, name: str) -> Any:
        """The object registered as `name` (imported now); ConfigError naming the known ones otherwise."""
        if ":" in name:
            return import_target(name)
        if name in self.builtins:
            entry = self.builtins[name]
            return import_target(entry) if isinstance(entry, str) else entry
        installed = self._installed()
        if name not in installed:
            known = ", ".join(self.names()) or "none installed"
            raise ConfigError(f"no {self.what} named {name!r} (known: {known}); a third-party one registers the entry point group {self.group!r}")
        return installed[name].load()
