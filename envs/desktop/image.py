"""The desktop sandbox image: Xvfb, openbox, xdotool, scrot and real Debian programs, plus the desktop `gui` CLI."""

from __future__ import annotations

from pathlib import Path

from core.runtime.images import ImageLayer
from core.runtime.recipes import apt_layer, combined_layer

# the X server, window manager and tools the CLI uses, then the programs tasks open
DESKTOP_PACKAGES = [
    "xvfb", "openbox", "xdotool", "scrot", "x11-utils", "dbus-x11", "fonts-dejavu-core",
    "xterm", "mousepad", "gnumeric",
]  # fmt: skip
GUI_SOURCE = Path(__file__).with_name("sandbox") / "desk.py"
GUI_PATH = "/usr/local/bin/gui"


def desktop_layer() -> ImageLayer:
    """The desktop packages (downloaded on the host once, installed offline) and the `gui` CLI."""
    cli = ImageLayer(
        name="desk-cli",
        dockerfile=f"COPY desk-cli.py {GUI_PATH}\nRUN chmod 755 {GUI_PATH}\n",
        files={"desk-cli.py": GUI_SOURCE.read_text(encoding="utf-8")},
    )
    return combined_layer("desktop", apt_layer("desktop-x11", DESKTOP_PACKAGES), cli)


__all__ = ["DESKTOP_PACKAGES", "GUI_PATH", "desktop_layer"]
