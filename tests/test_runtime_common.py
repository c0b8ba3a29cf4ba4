"""Helpers the runtimes share: reading a file under a container root without following links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.runtime import _common as C


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "workspace" / "d").mkdir(parents=True)
    (r / "workspace" / "a.txt").write_text("alpha")
    (r / "workspace" / "d" / "b.txt").write_text("beta")
    outside = tmp_path / "outside.txt"
    outside.write_text("host secret")
    (r / "workspace" / "abs-link").symlink_to(outside)
    (r / "workspace" / "rel-link").symlink_to("a.txt")
    (r / "workspace" / "dir-link").symlink_to(tmp_path)
    os.mkfifo(r / "workspace" / "fifo")
    return r


def test_reads_plain_files(root: Path) -> None:
    assert C.read_beneath(str(root), "/workspace/a.txt") == b"alpha"
    assert C.read_beneath(str(root), "/workspace/d/b.txt") == b"beta"
    assert C.read_beneath(str(root), "/workspace/d/../a.txt") == b"alpha"


def test_never_follows_a_link_anywhere_in_the_path(root: Path) -> None:
    for path in ("/workspace/abs-link", "/workspace/rel-link", "/workspace/dir-link/outside.txt"):
        assert C.read_beneath(str(root), path) is None  # the caller asks the engine, which resolves inside the container


def test_dotdot_cannot_climb_out(root: Path) -> None:
    with pytest.raises(FileNotFoundError):
        C.read_beneath(str(root), "/../../outside.txt")


def test_missing_non_regular_and_non_directory_parents(root: Path) -> None:
    with pytest.raises(FileNotFoundError):
        C.read_beneath(str(root), "/workspace/missing.txt")
    with pytest.raises(FileNotFoundError):
        C.read_beneath(str(root), "/workspace/nope/x.txt")
    assert C.read_beneath(str(root), "/workspace/fifo") is None  # and it does not block
    assert C.read_beneath(str(root), "/workspace/d") is None
    assert C.read_beneath(str(root), "/workspace/a.txt/x") is None
    assert C.read_beneath(str(root), "/") is None


def test_tar_files_holds_every_file_with_its_mode() -> None:
    import io
    import tarfile

    archive = C.tar_files([("/workspace/a.txt", b"a", 0o644), ("opt/run.sh", b"#!/bin/sh\n", 0o755)])
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert [(m.name, m.mode, m.size) for m in tar.getmembers()] == [("workspace/a.txt", 0o644, 1), ("opt/run.sh", 0o755, 10)]
