"""Install recipes: npm and pip trees installed once on the host, cached, copied into real images."""

from __future__ import annotations

import pytest

from core.runtime.images import ensure_image, image_tag
from core.runtime.recipes import COMPLETE, npm_layer, pip_layer


def test_npm_and_pip_layers_install_once_and_run_in_a_container(docker_client, base_image, monkeypatch, tmp_path):
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    npm = npm_layer("isnum", ["is-number@7.0.0"], links={"isnum-pkg": "node_modules/is-number/package.json"})
    pip = pip_layer("six", ["six==1.16.0"], scripts={"six-version": "six"})
    (tree,) = npm.dirs.values()
    assert (tree.path / COMPLETE).exists() and (tree.path / "node_modules" / "is-number" / "index.js").exists()
    mtime = (tree.path / COMPLETE).stat().st_mtime
    again = npm_layer("isnum", ["is-number@7.0.0"], links={"isnum-pkg": "node_modules/is-number/package.json"})
    assert (tree.path / COMPLETE).stat().st_mtime == mtime and again == npm  # cached: nothing reinstalled
    tag = ensure_image(docker_client, base_image, [npm, pip])
    assert tag == image_tag(base_image, [npm, pip])
    out = docker_client.containers.run(
        tag,
        ["bash", "-c", "cat /usr/local/bin/isnum-pkg | grep -c is-number; PYTHONPATH=/opt/forgetui/six/site python3 -c 'import six; print(six.__version__)'; python3 -c 'import six' 2>&1 | tail -1"],
        remove=True,
    ).decode()
    lines = out.splitlines()
    assert int(lines[0]) >= 1 and lines[1] == "1.16.0" and "No module named 'six'" in lines[2]  # isolated from other pythons


def test_a_failing_install_says_why_and_leaves_no_tree(monkeypatch, tmp_path):
    from core.errors import SandboxError

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    with pytest.raises(SandboxError, match="npm"):
        npm_layer("nope", ["forgetui-this-package-does-not-exist-0c1d@0.0.1"])
    assert not list((tmp_path / "home" / "cache" / "npm").glob("nope-*"))
