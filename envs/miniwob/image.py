"""The miniwob sandbox image: Debian's Chromium + chromedriver + python3-selenium, the MiniWoB++ pages, the `gui` CLI."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from core.adapter import INSTALL_ROOT, ConfigError, HostDir, ImageLayer, apt_layer, combined_layer, pip_tree

MINIWOB_SPEC = "miniwob==1.1.0"
BROWSER_PACKAGES = ["chromium", "chromium-driver", "python3-selenium", "fonts-dejavu-core"]
GUI_SOURCE = Path(__file__).with_name("sandbox") / "gui.py"
GUI_PATH = "/usr/local/bin/gui"
MCP_SOURCE = Path(__file__).with_name("sandbox") / "gui_mcp.py"
MCP_PATH = "/usr/local/bin/gui-mcp"
HTML_ROOT = f"{INSTALL_ROOT}/miniwob/html"  # the wheel's html/ folder, as the sandbox sees it


@cache
def miniwob_html() -> Path:
    """The html/ folder of the MiniWoB++ wheel, installed once into forgetui's cache (its Python deps are not needed)."""
    # --no-deps: only the wheel's HTML tasks are used; its gymnasium/selenium/numpy would go unused
    tree = pip_tree("miniwob", [MINIWOB_SPEC, "--no-deps"])
    html = tree / "site" / "miniwob" / "html"
    if not (html / "miniwob").is_dir():
        raise ConfigError(f"the MiniWoB++ wheel in {tree} has no html/miniwob folder")
    return html


def cli_layer(name: str, gui_source: Path) -> ImageLayer:
    """`gui_source` as /usr/local/bin/gui, and the MCP server over it (sandbox/gui_mcp.py) as /usr/local/bin/gui-mcp."""
    return ImageLayer(
        name=name,
        dockerfile=f"COPY {name}.py {GUI_PATH}\nCOPY gui-mcp.py {MCP_PATH}\nRUN chmod 755 {GUI_PATH} {MCP_PATH}\n",
        files={f"{name}.py": gui_source.read_text(encoding="utf-8"), "gui-mcp.py": MCP_SOURCE.read_text(encoding="utf-8")},
    )


def browser_layer() -> ImageLayer:
    """Chromium, chromedriver and Selenium from Debian (downloaded on the host once, installed offline)."""
    return apt_layer("gui-browser", BROWSER_PACKAGES)


def miniwob_layer() -> ImageLayer:
    """The browser, the MiniWoB++ pages under HTML_ROOT and the `gui` CLI: everything a miniwob rollout needs."""
    html = miniwob_html()
    pages = ImageLayer(name="miniwob-html", dockerfile=f"COPY miniwob-html {HTML_ROOT}\n", dirs={"miniwob-html": HostDir(html, html.parent.parent.name)})
    return combined_layer("miniwob", browser_layer(), pages, cli_layer("gui-cli", GUI_SOURCE))


__all__ = ["GUI_PATH", "HTML_ROOT", "MCP_PATH", "browser_layer", "cli_layer", "miniwob_html", "miniwob_layer"]
