"""The import graph of `core`: cycles, and imports inside functions that are not for a heavy dependency.

`lint-imports` checks the layers (pyproject's contracts); this checks what it cannot see: a cycle inside one
floor, and an import moved into a function to hide one. An import inside a function is allowed only when what
it imports is heavy (loads torch, veRL, LiteLLM, ... when imported), so that a command that never needs it does
not pay for it.

    python tools/import_graph.py [ROOT] [--verbose]   # exit 1 when a check fails; ROOT defaults to the repository
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "core"
# third-party packages slow or large enough to import only where used (seconds or hundreds of MB each)
HEAVY = frozenset({
    "torch", "transformers", "verl", "peft", "litellm", "tensorboard", "matplotlib", "pyarrow", "accelerate",
    "docker", "kubernetes", "textual", "ray", "vllm", "hydra", "omegaconf", "gguf", "PIL", "wandb",
})  # fmt: skip


@dataclass
class Module:
    name: str
    path: Path
    imports: dict[str, str] = field(default_factory=dict)  # in-project module -> "top" | "function"
    external_top: set[str] = field(default_factory=set)  # third-party roots imported at module level
    function_lines: list[tuple[str, int]] = field(default_factory=list)  # (in-project target, line) inside functions
    typing_only: set[str] = field(default_factory=set)  # in-project modules imported only under TYPE_CHECKING


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def scan(root: Path, package_name: str = PACKAGE) -> dict[str, Module]:
    """Every module of the package with what it imports (TYPE_CHECKING blocks are kept apart, in `typing_only`)."""
    modules = {module_name(root, p): Module(module_name(root, p), p) for p in sorted((root / package_name).rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for mod in modules.values():
        package = mod.name if mod.path.name == "__init__.py" else mod.name.rpartition(".")[0]

        def visit(node: ast.AST, in_function: bool, mod: Module = mod, package: str = package, typing: bool = False) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _type_checking(child):
                    visit(child, in_function, typing=True)
                    continue
                inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                targets: list[str] = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                        base = ".".join(parts) + (f".{child.module}" if child.module else "")
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in child.names]
                for target in targets:
                    if target.split(".")[0] != package_name:
                        if not inside and not typing:
                            mod.external_top.add(target.split(".")[0])
                        continue
                    found = resolve(target)
                    if found is None or found == mod.name:
                        continue
                    if typing:
                        mod.typing_only.add(found)
                    elif inside:
                        mod.function_lines.append((found, child.lineno))
                        mod.imports.setdefault(found, "function")
                    else:
                        mod.imports[found] = "top"
                visit(child, inside, typing=typing)

        visit(ast.parse(mod.path.read_text()), False)
    return modules


def cycles(modules: dict[str, Module], with_typing: bool = False) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), over every import that runs.

    `with_typing` adds the imports made only under TYPE_CHECKING: a cycle that needs one of them is hidden from
    the interpreter and from import-linter, but still ties the modules' meanings to each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in (modules[v].imports.keys() | modules[v].typing_only) if with_typing else modules[v].imports:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for name in modules:
        if name not in index:
            connect(name)
    return found


def heavy_modules(modules: dict[str, Module]) -> set[str]:
    """Modules that load a heavy third-party package when imported (directly, or through a module-level import)."""
    heavy = {name for name, m in modules.items() if m.external_top & HEAVY}
    changed = True
    while changed:
        changed = False
        for name, m in modules.items():
            if name not in heavy and any(kind == "top" and t in heavy for t, kind in m.imports.items()):
                heavy.add(name)
                changed = True
    return heavy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--verbose", "-v", action="store_true", help="list every import inside a function")
    parser.add_argument("--package", default=PACKAGE, help="the package to scan (default core; forgetui reports, never fails)")
    args = parser.parse_args(argv)
    modules = scan(Path(args.root), args.package)
    found = cycles(modules)
    hidden = [c for c in cycles(modules, with_typing=True) if c not in found]
    heavy = heavy_modules(modules)
    inside = [(m.name, t, line) for m in modules.values() for t, line in m.function_lines]
    light = [(src, t, line) for src, t, line in inside if t not in heavy]
    print(f"{args.package}: {len(modules)} modules, {sum(len(m.imports) for m in modules.values())} imported pairs")
    print(f"cycles: {len(found)} ({sum(len(c) for c in found)} modules in them)")
    for component in found:
        print(f"  cycle of {len(component)}: {', '.join(component)}")
    # a cycle through TYPE_CHECKING imports still ties two modules' meanings: untie it with a Protocol or a types module
    print(f"cycles only through TYPE_CHECKING imports: {len(hidden)} ({sum(len(c) for c in hidden)} modules in them)")
    for component in hidden:
        print(f"  hidden cycle of {len(component)}: {', '.join(component)}")
    print(f"in-project imports inside functions: {len(inside)} in {len({s for s, _, _ in inside})} files; of them not heavy: {len(light)}")
    for src, target, line in sorted(light if not args.verbose else inside):
        print(f"  {modules[src].path.relative_to(args.root)}:{line} imports {target}{'' if target in heavy else '  (not heavy)'}")
    if args.package != PACKAGE:
        return 0  # the app's graph is reported for now; its contract is issue 46's
    return 1 if found or hidden or light else 0


if __name__ == "__main__":
    raise SystemExit(main())
