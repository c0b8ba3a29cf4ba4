"""The TUI's saved settings (the theme), in FORGETUI_HOME/tui/settings.json."""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


class Settings:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.data = json.loads(path.read_text())
        except FileNotFoundError:
            self.data = {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable TUI settings %s: %s", path, exc)
            self.data = {}
        if not isinstance(self.data, dict):
            self.data = {}

    @property
    def theme(self) -> str | None:
        value = self.data.get("theme")
        return value if isinstance(value, str) else None

    def save_theme(self, name: str) -> None:
        if self.data.get("theme") == name:
            return
        self.data["theme"] = name
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.data, indent=1))
        except OSError as exc:
            log.warning("cannot save TUI settings to %s: %s", self.path, exc)
