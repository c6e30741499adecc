"""A key only root can read (issue #17, item 6).

`swarm keygen > cluster.key` made a 0644 file and a root agent only warned about it:
any local user could read the key, start an agent of their own and join the root
cluster. A root agent now refuses a key file that group or others can access, or that
root does not own, with one line naming the file and the fix; `swarm keygen -o FILE`
writes a 0600 file itself.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarm.client import Client
from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.security.conftest import User, need_root

pytestmark = pytest.mark.root


def _keygen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "swarm", "keygen", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _outcome(a: LocalAgent, timeout: float = 30.0) -> str:
    """'exited' once the agent process ended, 'serving' once its socket answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert a.proc is not None
        if a.proc.poll() is not None:
            return "exited"
        try:
            with Client(a.socket, timeout=2) as c:
                c.info()
            return "serving"
        except Exception:
            time.sleep(0.05)
    raise TimeoutError(f"agent {a.name} neither exited nor served in {timeout}s")


def test_keygen_writes_a_private_file_and_never_overwrites(tmp_path: Path) -> None:
    key = tmp_path / "cluster.key"
    old = os.umask(0o022)  # the usual umask: the shell's redirection made 0644 files
    try:
        r = _keygen("-o", str(key))
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        first = key.read_text()
        r = _keygen("-o", str(key))  # an existing key is never replaced by accident
        assert r.returncode != 0
        assert str(key) in r.stderr and "--force" in r.stderr and "Traceback" not in r.stderr
        assert key.read_text() == first
        key.chmod(0o644)
        r = _keygen("-o", str(key), "--force")  # replaced: a new 0600 file
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_text() != first
        out = tmp_path / "redirected.key"
        with open(out, "w") as f:  # `swarm keygen > FILE`: tightened to 0600 too
            subprocess.run(
                [sys.executable, "-m", "swarm", "keygen"], stdout=f, check=True, timeout=30
            )
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
    finally:
        os.umask(old)


@pytest.mark.parametrize(
    ("mode", "owned_by_user", "why"),
    [
        (0o644, False, "accessible by group/others (mode 0644)"),
        # the socket group (every submitter) must not read the key either
        (0o640, False, "accessible by group/others (mode 0640)"),
        (0o600, True, "not root"),
    ],
    ids=["0644", "0640", "user-owned"],
)
def test_root_agent_refuses_a_key_others_can_read(
    make_agent: AgentFactory,
    short_tmp: Path,
    sec_users: tuple[User, User, User],
    mode: int,
    owned_by_user: bool,
    why: str,
) -> None:
    """Finding 6: a root agent started (with a warning) on a 0644 key. Now it exits
    non-zero with one line naming the file and the fix, and no traceback."""
    need_root()
    key = short_tmp / "cluster.key"
    key.write_text(_keygen().stdout)  # as the old README said: swarm keygen > FILE
    key.chmod(mode)
    if owned_by_user:
        os.chown(key, sec_users[0].uid, sec_users[0].gid)
    a = make_agent("k1", "--no-insecure", "--keyring", str(key), start=False)
    a.start(wait=False)
    assert _outcome(a) == "exited", f"a root agent started with a {mode:04o} key"
    assert a.proc is not None and a.proc.returncode not in (0, None)
    lines = [ln for ln in a.log_text().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert str(key) in lines[0] and why in lines[0], lines[0]
    assert "chmod 0600" in lines[0] and "Traceback" not in lines[0]


def test_root_agent_takes_the_key_keygen_writes(make_agent: AgentFactory, short_tmp: Path) -> None:
    need_root()
    key = short_tmp / "cluster.key"
    assert _keygen("-o", str(key)).returncode == 0
    a = make_agent("k2", "--no-insecure", "--keyring", str(key), start=False)
    a.start(wait=False)
    assert _outcome(a) == "serving", a.log_tail()
    assert "agent.keyring" not in a.log_text()  # not even a warning
