"""Textual's Footer, recomposed only when the keys it shows change."""

from __future__ import annotations

from typing import Any

from textual.screen import Screen
from textual.widgets import Footer


class KeyFooter(Footer):
    """The key bar at the bottom of every screen.

    Textual's Footer rebuilds itself (one styled FooterKey widget per binding) on every bindings
    update of its screen, and a screen publishes one on each focus move and each widget that
    refreshes its bindings: about ten times while the Run screen opens, most of them with the same
    keys, which made the Footer the largest single cost on the event loop there (the TUI benchmark's
    worst stall). Here an update that leaves the shown keys as they were is dropped, and so is one for a
    screen that another covers (working out its keys asks its `check_action` for each binding: the
    Home screen's looked up the Runs list on each, ~0.1 s of CPU while a Run screen opened over it).
    """

    _shown: tuple[Any, ...] | None = None

    def __init__(self, **kwargs: Any) -> None:
        # compact (one space between keys) and no palette key (Ctrl+P still opens it; ? lists it): a screen's own
        # keys fit in 80 columns
        super().__init__(compact=True, show_command_palette=False, **kwargs)

    def bindings_changed(self, screen: Screen) -> None:
        if screen is not screen.app.screen:  # a screen under another (the Home under a Run screen) shows no footer;
            self._shown = None  # its keys are worked out when it is back on top (Textual publishes them then)
            return
        shown = _signature(screen)
        if self._bindings_ready and shown == self._shown:
            return
        super().bindings_changed(screen)
        if screen.app.app_focus:  # Footer skips the rebuild without focus: keep asking until one happens
            self._shown = shown


def _signature(screen: Screen) -> tuple[Any, ...]:
    """What the footer would show for `screen`: each active binding's key, label, visibility and state."""
    return tuple(
        (key, binding.action, binding.description, binding.show, binding.key_display, enabled, tooltip)
        for key, (_node, binding, enabled, tooltip) in screen.active_bindings.items()
    )
