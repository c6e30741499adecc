"""Starting a process as another user, both ways the executor can (issue #17, item 1
and 5): through swarm-exec (the compiled helper, vfork path) and through the forking
`UserSwitch` fallback (no C compiler). Same order, same answers: cgroups joined as
root, then the user, then the directory as the user, then the task's environment."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from swarm.runtime import exechelper
from swarm.runtime.executor import Executor, ProcessPlan, ProcessResult
from tests.security.conftest import User
from tests.security.test_submitters import EVIL_C

pytestmark = pytest.mark.root


@pytest.fixture(params=["helper", "fork"])
def executor(request: pytest.FixtureRequest) -> Executor:
    if request.param == "fork":
        return Executor(kill_grace=2)
    try:
        helper = exechelper.build(exechelper.CACHE_DIR)
    except exechelper.HelperUnavailable as e:
        pytest.skip(f"swarm-exec cannot be built here: {e}")
    return Executor(kill_grace=2, exec_helper=helper)


def _run(
    ex: Executor, user: User, world_dir: Path, argv: list[str], **kw: object
) -> tuple[ProcessResult, str, str]:
    out, err = world_dir / "out", world_dir / "err"
    for p in (out, err):
        p.unlink(missing_ok=True)
    fields: dict[str, object] = {
        "task_id": "t1",
        "argv": tuple(argv),
        "env": {"PATH": "/usr/bin:/bin"},
        "cwd": str(world_dir),
        "stdout": out,
        "stderr": err,
        "uid": user.uid,
        "gid": user.gid,
        "groups": user.groups,
        "umask": 0o022,
    }
    fields.update(kw)
    plan = ProcessPlan(**fields)  # type: ignore[arg-type]
    result = trio.run(ex.run, plan)
    return result, out.read_text(), err.read_text()


def test_the_task_is_the_user_in_its_directory_with_its_environment(
    executor: Executor, sec_users: tuple[User, User, User], world_dir: Path
) -> None:
    alice = sec_users[0]
    script = 'id -u; id -g; id -G; pwd; echo "$FOO"; umask'
    r, out, err = _run(
        executor,
        alice,
        world_dir,
        ["sh", "-c", script],
        env={"PATH": "/usr/bin:/bin", "FOO": "bar baz\nqux"},
    )
    assert r.ok, (r, err)
    lines = out.splitlines()
    assert lines[0] == str(alice.uid) and lines[1] == str(alice.gid)
    assert sorted(lines[2].split()) == sorted(str(g) for g in set(alice.groups))
    assert lines[3] == str(world_dir)
    assert lines[4:6] == ["bar baz", "qux"]  # the value as given, newline and all
    assert lines[6] == "0022"


def test_a_preloaded_library_only_ever_runs_as_the_user(
    executor: Executor, sec_users: tuple[User, User, User], world_dir: Path
) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build the preloaded library")
    alice = sec_users[0]
    (world_dir / "evil.c").write_text(EVIL_C)
    lib, uids = world_dir / "evil.so", world_dir / "uids"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(world_dir / "evil.c")], check=True)
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(lib), "EVIL_OUT": str(uids)}
    r, _, err = _run(executor, alice, world_dir, ["true"], env=env)
    assert r.ok, (r, err)
    assert set(uids.read_text().split()) == {str(alice.uid)}


def test_a_directory_the_user_cannot_enter_fails_the_start(
    executor: Executor, sec_users: tuple[User, User, User], world_dir: Path
) -> None:
    alice = sec_users[0]
    inner = world_dir / "priv" / "inner"
    inner.mkdir(parents=True)
    os.chmod(world_dir / "priv", 0o700)
    r, out, _ = _run(executor, alice, world_dir, ["pwd"], cwd=str(inner))
    assert r.spawn_error is not None and out == ""
    assert r.spawn_error.startswith(f"cannot enter working directory {inner}: Permission denied")
    # the same answer for a command that exists and one that does not
    tool = inner / "tool"
    tool.write_text("#!/bin/sh\necho ran\n")
    os.chmod(tool, 0o755)
    for path in (tool, inner / "missing"):
        r, _, _ = _run(executor, alice, world_dir, [str(path)])
        assert r.spawn_error == f"permission denied: {path}", r
    r, _, _ = _run(executor, alice, world_dir, ["no-such-command-x"])
    assert r.spawn_error == "command not found: no-such-command-x"


def test_the_cgroup_is_joined_before_the_switch(
    executor: Executor, sec_users: tuple[User, User, User], world_dir: Path
) -> None:
    """cgroup.procs files belong to root: the join happens before the switch (a plain
    root-only file stands in for the kernel's; the pid it receives is the task's)."""
    alice = sec_users[0]
    procs = world_dir / "cgroup.procs"
    procs.write_text("")
    os.chmod(procs, 0o600)
    r, out, _ = _run(executor, alice, world_dir, ["sh", "-c", "echo $$"], cgroup_procs=(procs,))
    assert r.ok, r
    assert procs.read_text().strip() == out.strip() == str(r.pid)
    gone = world_dir / "nope" / "procs"
    r, _, _ = _run(executor, alice, world_dir, ["true"], cgroup_procs=(gone,))
    assert r.spawn_error is not None
    assert r.spawn_error.startswith("cannot put the process in its cgroup")
