"""The SQL console's history: queries run, newest last, kept in FORGETUI_HOME/tui/sql_history.json."""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

MAX_ENTRIES = 200


class SqlHistory:
    """`add` a query (a repeat moves to the end); `older`/`newer` step through it from the end."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.entries: list[str] = []
        self._pos: int | None = None
        if path is not None:
            try:
                loaded = json.loads(path.read_text())
                self.entries = [q for q in loaded if isinstance(q, str)][-MAX_ENTRIES:]
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as exc:
                log.warning("ignoring unreadable SQL history %s: %s", path, exc)

    def add(self, sql: str) -> None:
        sql = sql.strip()
        if not sql:
            return
        if sql in self.entries:
            self.entries.remove(sql)
        self.entries = [*self.entries, sql][-MAX_ENTRIES:]
        self._pos = None
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.write_text(json.dumps(self.entries, indent=1))
            except OSError as exc:
                log.warning("cannot save the SQL history to %s: %s", self.path, exc)

    def older(self) -> str | None:
        if not self.entries:
            return None
        self._pos = len(self.entries) - 1 if self._pos is None else max(0, self._pos - 1)
        return self.entries[self._pos]

    def newer(self) -> str | None:
        if self._pos is None:
            return None
        if self._pos >= len(self.entries) - 1:
            self._pos = None
            return ""
        self._pos += 1
        return self.entries[self._pos]
