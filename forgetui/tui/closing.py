"""Results that arrive while the TUI closes: a worker's message handled after the widgets it fills were removed."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from textual.css.query import NoMatches

log = logging.getLogger(__name__)


def dropped_once_closed(handler: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """For handlers of workers' results: one that lands while the app closes, the widgets it fills already gone
    (children are removed before their parent stops handling messages), is dropped. Those widgets are composed
    once and never removed otherwise, so a missing one means exactly that."""

    @functools.wraps(handler)
    def handle(node: Any, message: Any) -> None:
        try:
            handler(node, message)
        except NoMatches:
            log.debug("dropped %s: the app is closing", type(message).__name__)

    return handle
