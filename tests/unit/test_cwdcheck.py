"""The working-directory check of issue 21 (runtime/cwdcheck.py): a directory the
task's user could not enter reads exactly like a missing one, also through a symlink.
The check emulates the user's permissions from mode bits, so it is tested here with
another uid without switching users."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.runtime.cwdcheck import cwd_refusal

USER = 54321  # owns nothing here
GROUPS = (54321,)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A tree under /tmp that others may search (pytest's own base is 0700: behind it,
    everything rightly reads as missing for another user)."""
    with tempfile.TemporaryDirectory(prefix="cwd-", dir="/tmp") as d:
        yield Path(d)


def _missing(path: Path | str) -> str:
    return f"working directory {path} does not exist on node n1"


def _tree(tmp: Path) -> tuple[Path, Path, Path]:
    os.chmod(tmp, 0o755)
    open_dir = tmp / "open" / "work"
    open_dir.mkdir(parents=True)
    os.chmod(tmp / "open", 0o755)
    private = tmp / "priv"
    inner = private / "inner"
    inner.mkdir(parents=True)
    os.chmod(private, 0o700)  # owned by whoever runs the tests, not USER
    os.chmod(inner, 0o755)
    link = tmp / "open" / "into-priv"
    link.symlink_to(inner)
    return open_dir, inner, link


def test_a_directory_the_user_may_enter_passes(tmp_path: Path) -> None:
    open_dir, _, _ = _tree(tmp_path)
    assert cwd_refusal(str(open_dir), "n1", USER, GROUPS) is None


def test_behind_a_private_parent_reads_as_missing(tmp_path: Path) -> None:
    _, inner, _ = _tree(tmp_path)
    assert cwd_refusal(str(inner), "n1", USER, GROUPS) == _missing(inner)
    gone = tmp_path / "priv" / "nothing"
    assert cwd_refusal(str(gone), "n1", USER, GROUPS) == _missing(gone)


def test_a_symlink_into_a_private_parent_reads_as_missing(tmp_path: Path) -> None:
    _, _, link = _tree(tmp_path)
    assert cwd_refusal(str(link), "n1", USER, GROUPS) == _missing(link)
    # ".." after a symlink is resolved as the kernel does, not lexically
    up = f"{link}/.."
    assert cwd_refusal(up, "n1", USER, GROUPS) == _missing(up)


def test_the_owner_and_root_may_enter(tmp_path: Path) -> None:
    _, inner, link = _tree(tmp_path)
    me = os.getuid()
    assert cwd_refusal(str(inner), "n1", me, (os.getgid(),)) is None
    assert cwd_refusal(str(link), "n1", 0) is None


def test_not_a_directory_or_relative_reads_as_missing(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert cwd_refusal(str(f), "n1", USER, GROUPS) == _missing(f)
    assert cwd_refusal("rel/dir", "n1", USER, GROUPS) == _missing("rel/dir")
    assert cwd_refusal(None, "n1", USER, GROUPS) is None
