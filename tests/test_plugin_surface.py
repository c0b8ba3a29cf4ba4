"""The plugin surface (core.adapter): harnesses and envs import nothing else from core, and pyproject's contract says so."""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

import core.adapter

REPO = Path(__file__).resolve().parents[1]
CONTRACT = "harnesses and envs import from core only its plugin surface, core.adapter"


def core_imports(package: str) -> list[tuple[str, str, list[str]]]:
    """(file, module, names) for every `core` import anywhere in a package's modules (functions included)."""
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "core":
                found.append((str(path.relative_to(REPO)), node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                found += [(str(path.relative_to(REPO)), a.name, []) for a in node.names if a.name.split(".")[0] == "core"]
    return found


def test_harnesses_and_envs_import_only_the_public_names_of_core_adapter():
    imports = core_imports("harnesses") + core_imports("envs")
    assert len(imports) >= 20  # every adapter imports its contract from core
    assert [(f, m) for f, m, _ in imports if m != "core.adapter"] == []
    used = {name for _, _, names in imports for name in names}
    assert used <= set(core.adapter.__all__), used - set(core.adapter.__all__)


def test_every_public_name_resolves_to_the_core_object():
    """A re-export, never a copy: core.adapter.Harness is core.harness.Harness."""
    from core.harness import Harness
    from core.runtime.base import Sandbox

    assert core.adapter.Harness is Harness and core.adapter.Sandbox is Sandbox
    for name in core.adapter.__all__:
        assert getattr(core.adapter, name) is not None, name


def test_the_contract_forbids_every_core_module_but_the_surface():
    """A new module of core is forbidden to plugins until it is named here (or re-exported from core.adapter)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["name"] == CONTRACT]
    assert contract["type"] == "forbidden" and set(contract["source_modules"]) == {"harnesses", "envs"}
    children = {f"core.{p.stem}" for p in (REPO / "core").iterdir() if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.stem != "__init__"}
    assert set(contract["forbidden_modules"]) == children - {"core.adapter"}
    importlib.import_module("core.adapter")  # and the surface itself imports cleanly
