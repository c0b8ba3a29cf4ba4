"""The desktop sandbox image: Xvfb, openbox, xdotool, scrot and real Debian programs, plus the desktop `gui` CLI."""

from __future__ import annotations

from pathlib import Path

from core.adapter import ImageLayer, apt_layer, combined_layer
from envs.miniwob.image import cli_layer

# the X server, window manager and tools the CLI uses, then the programs tasks open
DESKTOP_PACKAGES = [
    "xvfb", "openbox", "xdotool", "scrot", "x11-utils", "dbus-x11", "fonts-dejavu-core",
    "xterm", "mousepad", "gnumeric", "libglib2.0-bin",
]  # fmt: skip  (libglib2.0-bin: gsettings, to read a setting the agent changed)
GUI_SOURCE = Path(__file__).with_name("sandbox") / "desk.py"


def desktop_layer() -> ImageLayer:
    """The desktop packages (downloaded on the host once, installed offline), the `gui` CLI and its MCP server."""
    return combined_layer("desktop", apt_layer("desktop-x11", DESKTOP_PACKAGES), cli_layer("desk-cli", GUI_SOURCE))


__all__ = ["DESKTOP_PACKAGES", "desktop_layer"]
