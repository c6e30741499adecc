"""Starting a task's process inside its cgroups without a wrapper process (cgroup v1).

The starting thread joins the task's groups through their `tasks` files, starts the
process, which is born there, and goes back to the agent's own groups. Under its
supervisor (swarm-shim), the shim joins them instead, before it forks the task."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
import trio

from swarm.runtime import isolation as iso
from swarm.runtime import shim
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
    tid = str(threading.get_native_id())
    assert [f.read_text() for f in (*task_files, *homes)] == [tid] * 4


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


# ------------------------------------------------------------------ under the shim


@pytest.fixture(scope="module")
def shim_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    return shim.build(tmp_path_factory.mktemp("bin") / "private")


async def test_under_its_shim_the_shim_joins_and_the_agent_thread_never_moves(
    tmp_path: Path, shim_bin: Path
) -> None:
    """Issue 23: where the task starts under swarm-shim, the shim writes its own pid
    into each group's cgroup.procs (one write per hierarchy) before it forks the task;
    the agent's thread joins nothing and needs no wrapper. Regular files stand in."""
    procs = (tmp_path / "cpu.procs", tmp_path / "mem.procs")
    task_files = (tmp_path / "cpu-task", tmp_path / "mem-task")
    homes = (tmp_path / "cpu-home", tmp_path / "mem-home")
    for f in (*procs, *task_files, *homes):
        f.write_text("")
    plan = _plan(
        tmp_path,
        ("true",),
        cgroup_procs=procs,
        cgroup_threads=tuple(zip(task_files, homes, strict=True)),
        status_dir=tmp_path / "st",
    )
    ex = Executor(kill_grace=1.0, shim=shim_bin)
    with trio.fail_after(10):
        r = await ex.run(plan)
    assert r.exit_code == 0, r
    assert [f.read_text() for f in (*task_files, *homes)] == [""] * 4  # no thread moved
    shim_pids = {f.read_text() for f in procs}
    assert len(shim_pids) == 1 and shim_pids != {""}  # the shim's pid, in both
    assert r.pid is not None and f"{r.pid}\n" not in shim_pids  # not the task's own


async def test_under_its_shim_a_group_that_cannot_be_joined_starts_nothing(
    tmp_path: Path, shim_bin: Path
) -> None:
    plan = _plan(
        tmp_path,
        ("touch", str(tmp_path / "ran")),
        cgroup_procs=(tmp_path / "gone/cgroup.procs",),
        status_dir=tmp_path / "st",
    )
    with trio.fail_after(10):
        r = await Executor(kill_grace=1.0, shim=shim_bin).run(plan)
    assert r.spawn_error is not None and "cannot put the process in its cgroup" in r.spawn_error
    assert not (tmp_path / "ran").exists()
    ended = shim.read_exit(tmp_path / "st")
    assert ended is not None and ended.error == 2


async def test_under_its_shim_the_task_is_born_in_its_real_cgroups(
    tmp_path: Path, shim_bin: Path
) -> None:
    groups, homes = _real_v1(f"swarm-test-shim-{os.getpid()}")
    before = Path("/proc/thread-self/cgroup").read_text()
    try:
        plan = _plan(
            tmp_path,
            ("cat", "/proc/self/cgroup"),
            cgroup_procs=tuple(g / "cgroup.procs" for g in groups),
            cgroup_threads=tuple((g / "tasks", h) for g, h in zip(groups, homes, strict=True)),
            status_dir=tmp_path / "st",
        )
        with trio.fail_after(10):
            r = await Executor(kill_grace=1.0, shim=shim_bin).run(plan)
        assert r.exit_code == 0, r
        child = iso.own_cgroups((tmp_path / "out").read_text())[1]
        name = groups[0].name
        assert child["cpu"].endswith("/" + name) and child["memory"].endswith("/" + name)
        assert Path("/proc/thread-self/cgroup").read_text() == before
    finally:
        for g in groups:
            g.rmdir()
