"""Starting a task's process inside its cgroups without a wrapper process (cgroup v1).

The starting thread joins the task's groups through their `tasks` files, starts the
process, which is born there, and goes back to the agent's own groups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from swarm.runtime import isolation as iso
from swarm.runtime.executor import Executor, ProcessPlan, spawn_argv

ROOT = Path("/sys/fs/cgroup")


def _plan(tmp: Path, argv: tuple[str, ...], **kw: object) -> ProcessPlan:
    return ProcessPlan(
        task_id="t1",
        argv=argv,
        env={"PATH": os.defpath},
        cwd="/",
        stdout=tmp / "out",
        stderr=tmp / "err",
        **kw,  # type: ignore[arg-type]
    )


def _own_v1() -> dict[str, str]:
    _, v1 = iso.own_cgroups(Path("/proc/thread-self/cgroup").read_text())
    return v1


async def test_the_thread_joins_then_goes_home_and_no_wrapper_is_used(tmp_path: Path) -> None:
    """Regular files stand in for `tasks`: the order of the writes is what matters."""
    task_files = (tmp_path / "cpu-task", tmp_path / "mem-task")
    homes = (tmp_path / "cpu-home", tmp_path / "mem-home")
    for f in (*task_files, *homes):
        f.write_text("")
    plan = _plan(
        tmp_path,
        ("true",),
        cgroup_procs=(tmp_path / "cgroup.procs",),
        cgroup_threads=tuple(zip(task_files, homes, strict=True)),
    )
    argv, _ = spawn_argv(plan) or ([], {})
    assert argv == ["true"]  # not /bin/sh -c <join>
    r = await Executor(kill_grace=1.0).run(plan)
    assert r.exit_code == 0, r
    # the thread names itself "0": the kernel then skips a lock that waits for an RCU
    # grace period after an idle moment (procstart.THIS_THREAD)
    assert [f.read_text() for f in (*task_files, *homes)] == ["0"] * 4


async def test_a_group_that_cannot_be_joined_fails_the_start_plainly(tmp_path: Path) -> None:
    (tmp_path / "home").write_text("")
    plan = _plan(
        tmp_path,
        ("true",),
        cgroup_procs=(tmp_path / "gone/cgroup.procs",),
        cgroup_threads=((tmp_path / "gone/tasks", tmp_path / "home"),),
    )
    r = await Executor(kill_grace=1.0).run(plan)
    assert r.pid is None and r.spawn_error is not None
    assert r.spawn_error.startswith("cannot put the process in its cgroup: ")
    assert (tmp_path / "home").read_text() == ""  # never left home
    assert "cannot put the process in its cgroup" in (tmp_path / "err").read_text()


def _real_v1(tmp_name: str) -> tuple[tuple[Path, Path], tuple[Path, Path]]:
    """(task groups, our own groups' tasks files) in the real cpu and memory hierarchies."""
    if os.geteuid() != 0:
        pytest.skip("moving threads between cgroups needs root")
    v1 = _own_v1()
    groups, homes = [], []
    for ctrl in ("cpu", "memory"):
        mount = ROOT / ctrl
        if ctrl not in v1 or not (mount / "tasks").exists():
            pytest.skip(f"no cgroup v1 {ctrl} hierarchy here")
        own = mount / v1[ctrl].lstrip("/")
        g = own / tmp_name
        g.mkdir()
        groups.append(g)
        homes.append(own / "tasks")
    return (groups[0], groups[1]), (homes[0], homes[1])


async def test_the_process_is_born_in_its_real_cgroups_and_the_agent_is_not(
    tmp_path: Path,
) -> None:
    groups, homes = _real_v1(f"swarm-test-{os.getpid()}")
    before = Path("/proc/thread-self/cgroup").read_text()
    try:
        plan = _plan(
            tmp_path,
            ("cat", "/proc/self/cgroup"),
            cgroup_procs=tuple(g / "cgroup.procs" for g in groups),
            cgroup_threads=tuple((g / "tasks", h) for g, h in zip(groups, homes, strict=True)),
        )
        with trio.fail_after(10):
            r = await Executor(kill_grace=1.0).run(plan)
        assert r.exit_code == 0, r
        child = iso.own_cgroups((tmp_path / "out").read_text())[1]
        name = groups[0].name
        assert child["cpu"].endswith("/" + name) and child["memory"].endswith("/" + name)
        assert Path("/proc/thread-self/cgroup").read_text() == before
        assert all(g.joinpath("tasks").read_text() == "" for g in groups)
    finally:
        for g in groups:
            g.rmdir()
