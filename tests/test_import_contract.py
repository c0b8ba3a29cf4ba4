"""DESIGN.md's import rule: core never imports the app, textual, harnesses or envs; harnesses/envs never the app."""

from __future__ import annotations

import json
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "core": ("forgetui", "harnesses", "envs", "textual"),
    "harnesses": ("forgetui", "textual"),
    "envs": ("forgetui", "textual"),
}


def modules(package: str) -> list[str]:
    pkg_dir = REPO / package
    names = [package]
    for info in pkgutil.walk_packages([str(pkg_dir)], prefix=package + "."):
        names.append(info.name)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_importing_a_layer_loads_nothing_forbidden(package):
    """Import every module of the layer in a fresh interpreter and inspect sys.modules."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules(package)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert not loaded & set(FORBIDDEN[package]), f"{package} pulled in {loaded & set(FORBIDDEN[package])}"


def test_import_linter_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is a dev dependency"
    out = subprocess.run([lint], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "KEPT" in out.stdout and "BROKEN" not in out.stdout
