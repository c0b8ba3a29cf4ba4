"""The import rules (docs/architecture.md): core never imports the app, textual, harnesses or envs; harnesses/envs never
the app; inside core every import points down a floor, with no cycle and no import hidden in a function."""

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


def test_core_import_graph_has_no_cycle_and_hides_no_import_in_a_function(capsys):
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(REPO / "tools"))
    assert import_graph.main([str(REPO)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "cycles: 0" in out and "of them not heavy: 0" in out


def test_the_import_graph_check_catches_a_cycle_and_a_hidden_import(tmp_path, capsys):
    """The checker itself: a two-module cycle closed by an import inside a function fails it."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(REPO / "tools"))
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from core.b import B\n")
    (pkg / "b.py").write_text("B = 1\n\ndef f():\n    from core.a import A  # dodges the cycle at import time\n")
    assert import_graph.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "cycle of 2: core.a, core.b" in out and "core/b.py:4 imports core.a  (not heavy)" in out
