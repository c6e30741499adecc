"""proctime.create_time gives psutil's create time (the identity the journal keeps
against recycled pids) for live processes, and psutil's error for a gone one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from swarm.runtime import proctime

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_the_same_value_as_psutil_for_live_processes() -> None:
    child = subprocess.Popen(["sleep", "5"])
    try:
        for pid in (os.getpid(), child.pid, 1):
            assert proctime.create_time(pid) == pytest.approx(
                psutil.Process(pid).create_time(), abs=1e-6
            )
    finally:
        child.kill()
        child.wait()


def test_a_gone_process_is_no_such_process() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(psutil.NoSuchProcess):
        proctime.create_time(child.pid)


def test_a_command_with_spaces_and_parentheses_does_not_shift_the_fields(tmp_path: Path) -> None:
    odd = tmp_path / "a b) (c"
    odd.symlink_to("/bin/sleep")
    child = subprocess.Popen([str(odd), "5"])
    try:
        assert proctime.create_time(child.pid) == pytest.approx(
            psutil.Process(child.pid).create_time(), abs=1e-6
        )
    finally:
        child.kill()
        child.wait()
