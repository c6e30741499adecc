"""A full disk is refused clearly and recovered from without a restart (issue #17,
item 11).

On a 2 MB state filesystem the WAL filled it (sqlite checkpoints only at 1,000 pages,
4 MiB) and the journal stayed wedged ("database or disk is full") after space
returned, even across a restart. Now the WAL is checkpointed early and kept small, a
write that meets SQLITE_FULL runs wal_checkpoint(TRUNCATE) and is tried again, a
submission refused while the disk is full gets one clear line, `swarm info` says the
journal is wedged, and once space returns the next submission is accepted by the same
agent process.
"""

from __future__ import annotations

import errno
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.client import RequestFailed
from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.security.conftest import need_root

pytestmark = pytest.mark.root

BIG = "x" * 100_000  # one env value: a submission's record is ~100 KB


@pytest.fixture
def small_disk_agent(make_agent: AgentFactory) -> Iterator[LocalAgent]:
    """A root agent whose state dir is a 2 MB tmpfs (unmounted afterwards)."""
    need_root()
    # finished tasks are forgotten after a second: what stays in the journal is small,
    # what goes through it (the WAL) is not
    a = make_agent("d1", "--keep-finished", "1s", start=False)
    a.state_dir.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(a.state_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mount.stderr.strip()}")
    try:
        a.start()
        yield a
    finally:
        a.stop(timeout=15)
        if subprocess.run(["umount", str(a.state_dir)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(a.state_dir)], capture_output=True)


def _fill(path: Path) -> int:
    """Append zeros to `path` until the filesystem is full; bytes written."""
    n = 0
    chunk = b"\0" * 4096
    with open(path, "ab", buffering=0) as f:
        while True:
            try:
                n += f.write(chunk) or 0
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return n


def _submit(a: LocalAgent, *env: str) -> subprocess.CompletedProcess[str]:
    args = [arg for kv in env for arg in ("--env", kv)]
    return a.cli("submit", *args, "--", "true", timeout=30)


def _info(a: LocalAgent) -> tuple[dict[str, object], str]:
    r = a.cli("info", timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def test_a_full_disk_refuses_clearly_and_recovers_without_a_restart(
    small_disk_agent: LocalAgent,
) -> None:
    a = small_disk_agent
    deadline = time.monotonic() + 90  # the whole test
    pid = a.pid
    # 1. More goes through the journal than the disk holds (~2.5 MB: each task's
    # record is written at every transition) while little stays (finished tasks are
    # forgotten after 1 s): the WAL must be checkpointed and cut back, not grow until
    # it fills the disk (the old journal was refused at the 15th task, for good).
    with a.client(timeout=30) as c:
        for i in range(60):
            assert time.monotonic() < deadline
            tid = c.submit(["true"], env={"BIG": BIG[:10_000]})
            assert c.wait(tid, timeout=30)["state"] == "succeeded", i
            time.sleep(0.03)
        while c.info()["retention"]["forgotten"] < 60:  # they are gone from the journal
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # 2. Something else fills the disk, and takes whatever space the journal gives
        # back (a TRUNCATE checkpoint frees the WAL's) until a submission is refused.
        # Drained, the node keeps what it accepts queued: records that stay, and no
        # state writes of their own.
        c.call("shares", drain=True)
        filler = a.state_dir / "filler"
        for _ in range(40):
            assert time.monotonic() < deadline
            _fill(filler)
            try:
                c.submit(["true"], env={"BIG": BIG})
            except RequestFailed as e:
                assert "no space left" in e.message, e.message
                break
        else:
            raise AssertionError("the full disk never refused a submission")
    # The CLI: one clear line, no traceback; `swarm info` says the journal is wedged.
    # (A small write may still land in the WAL's room, e.g. a placement decision, and
    # clear the wedge until the next failure: refused again, it shows again.)
    for _ in range(5):
        r = _submit(a, f"BIG={BIG}")
        assert r.returncode != 0, "a submission was accepted on a full disk"
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert "no space left" in lines[0] and str(a.state_dir) in lines[0], lines[0]
        info, err = _info(a)
        if info.get("journal_wedged") is not None:
            break
    wedged = info.get("journal_wedged")
    assert isinstance(wedged, dict) and wedged["disk_full"], info
    assert "no space left" in str(wedged["error"])
    assert "journal wedged" in err and "no space left" in err, err

    filler.unlink()  # space returns: the same agent takes work again
    assert a.cli("undrain", timeout=30).returncode == 0
    ok = _submit(a, f"BIG={BIG}")
    assert ok.returncode == 0, ok.stderr
    tid = ok.stdout.strip().split()[-1]
    done = a.cli("wait", tid, "--timeout", "30", timeout=40)
    assert done.returncode == 0, done.stdout + done.stderr
    # state records that met the full disk land too (retried every second)
    while (last := _info(a))[0]["journal_wedged"] is not None:
        assert time.monotonic() < deadline, (last, a.log_tail())
        time.sleep(0.2)
    assert "wedged" not in last[1]
    assert a.pid == pid and a.alive()
