"""CRIU support: version rules, command lines, and the restore helper (with a fake CRIU)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from swarm.runtime import criu as criu_rt
from swarm.runtime.moving import parse_signal

FAKE = Path(__file__).parents[1] / "programs" / "fake_criu.py"


def test_versions_are_read_and_judged() -> None:
    assert criu_rt.parse_version("Version: 3.17.1\n") == (3, 17, 1)
    assert criu_rt.parse_version("Version: 4.1\nGitID: v4.1") == (4, 1, 0)
    assert criu_rt.parse_version("criu, who knows") is None
    old = criu_rt.judge("Version: 3.17.1", 0, "Looks good.")
    assert not old[0] and "older than 4.1" in old[1]
    bad = criu_rt.judge("Version: 4.1", 1, "Error (criu/cr-check.c:1): vdso\nDoes not look good.")
    assert not bad[0] and "Does not look good." in bad[1]
    assert criu_rt.judge("Version: 4.2", 0, "Looks good.") == (True, "CRIU 4.2.0 works", "4.2.0")
    assert not criu_rt.judge("nonsense", 0, "")[0]


async def test_detection_says_why_not_without_criu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    st = await criu_rt.detect()
    assert not st.ok and st.reason == "CRIU is not installed"


@pytest.mark.skipif(os.geteuid() != 0, reason="CRIU detection needs root")
async def test_detection_accepts_a_working_criu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    st = await criu_rt.detect()
    assert st.ok and st.version == "4.2.0" and st.path == str(tmp_path / "criu")


def test_dump_and_restore_command_lines() -> None:
    dump = criu_rt.dump_argv("/usr/sbin/criu", 42, Path("/s/t/.criu"))
    assert dump[:6] == ["/usr/sbin/criu", "dump", "-t", "42", "-D", "/s/t/.criu"]
    assert "--shell-job" in dump
    argv = criu_rt.restore_argv(
        "/usr/sbin/criu",
        Path("/s/t/.criu"),
        {"2": "/a/logs/t.err", "1": "/a/logs/t.out"},
        ["python", "job.py"],
        uid=1000,
        gid=100,
        cwd="/home/u",
    )
    assert argv[:2] == [sys.executable, str(criu_rt.HELPER)]
    i = argv.index("--")
    assert argv[i + 1 :] == ["python", "job.py"]
    assert argv.count("--inherit") == 2 and "fd[1]:a/logs/t.out" in argv
    assert argv[argv.index("--uid") + 1] == "1000" and argv[argv.index("--gid") + 1] == "100"


def test_checkpoint_signal_names() -> None:
    assert parse_signal("SIGUSR1") == signal.SIGUSR1
    assert parse_signal("usr2") == signal.SIGUSR2
    assert parse_signal("10") == 10
    for bad in ("SIGNOPE", "0", "999", ""):
        with pytest.raises(ValueError):
            parse_signal(bad)


# ------------------------------------------------------------------ the restore helper


def install_fake(d: Path) -> Path:
    exe = d / "criu"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


def image_of(d: Path, argv: list[str]) -> Path:
    images = d / "img"
    images.mkdir()
    (images / "fake-image.json").write_text(
        json.dumps({"argv": argv, "env": dict(os.environ), "cwd": str(d)})
    )
    return images


def run_helper(
    d: Path, argv: list[str], fallback: list[str], **env: str
) -> subprocess.CompletedProcess[str]:
    exe = install_fake(d)
    images = image_of(d, argv)
    cmd = criu_rt.restore_argv(str(exe), images, {}, fallback, uid=None, gid=None, cwd=str(d))
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, env={**os.environ, **env},
        start_new_session=True,
    )  # fmt: skip


def test_helper_exits_with_the_restored_tasks_status(tmp_path: Path) -> None:
    # the restored process is a grandchild: it is re-parented to the helper (subreaper)
    r = run_helper(tmp_path, ["sh", "-c", "sleep 0.3; echo restored; exit 7"], ["false"])
    assert r.returncode == 7, r.stderr
    assert "restored" in r.stdout


def test_helper_dies_of_the_restored_tasks_signal(tmp_path: Path) -> None:
    r = run_helper(tmp_path, ["sh", "-c", "sleep 0.2; kill -TERM $$"], ["false"])
    assert r.returncode == -signal.SIGTERM, r.stderr


def test_helper_starts_the_task_afresh_when_the_restore_fails(tmp_path: Path) -> None:
    r = run_helper(tmp_path, ["true"], ["sh", "-c", "echo fresh; exit 3"], FAKE_CRIU_FAIL="restore")
    assert r.returncode == 3
    assert "fresh" in r.stdout and "CRIU restore failed" in r.stderr
