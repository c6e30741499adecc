"""Identity resolution, cgroup detection and the cgroup v2 path on a fake cgroupfs.

This machine has cgroup v1 controllers only, so cgroup v2 (delegated subtree) is
exercised on a directory tree that behaves like cgroupfs where it matters: mkdir
creates the interface files, rmdir removes a group with its files. The real v1 path
runs in tests/integration/test_isolation.py.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import model as m
from swarm.runtime import isolation as iso
from swarm.runtime.executor import ProcessPlan, ProcessResult
from swarm.runtime.runner import PlanRefused

USERS = {
    "root": pwd.struct_passwd(("root", "x", 0, 0, "", "/root", "/bin/sh")),
    "alice": pwd.struct_passwd(("alice", "x", 2001, 2001, "", "/home/alice", "/bin/sh")),
}


def _getpwnam(name: str) -> pwd.struct_passwd:
    return USERS[name]


def _grouplist(name: str, gid: int) -> list[int]:
    return [gid, 3000] if name == "alice" else [gid]


def _ids(agent_uid: int = 0, allow_root: bool = False) -> iso.Identities:
    return iso.Identities(
        node="n2",
        agent_uid=agent_uid,
        allow_root=allow_root,
        getpwnam=_getpwnam,
        grouplist=_grouplist,
    )


def _spec(user: str | None = "alice", uid: int | None = 1000, **kw: object) -> m.TaskSpec:
    return m.TaskSpec(id="t1", argv=("true",), uid=uid, user=user, home="n1", **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ identity


def test_root_agent_runs_tasks_as_the_submitter_by_name() -> None:
    ident = _ids().resolve(_spec())
    assert ident == iso.Identity("alice", 2001, 2001, (2001, 3000), "/home/alice")


def test_user_missing_on_this_node_is_a_clear_refusal() -> None:
    why = _ids().refusal(_spec(user="mallory"))
    assert why == "user mallory does not exist on node n2"
    with pytest.raises(PlanRefused, match="does not exist on node n2"):
        _ids().resolve(_spec(user="mallory"))


def test_root_tasks_need_the_option() -> None:
    assert "allow-root-tasks = false" in (_ids().refusal(_spec(user="root", uid=0)) or "")
    assert _ids(allow_root=True).refusal(_spec(user="root", uid=0)) is None
    why = _ids().submit_refusal(0, "root")
    assert why is not None and "allow-root-tasks" in why and "n2" in why
    assert _ids(allow_root=True).submit_refusal(0, "root") is None
    assert _ids().submit_refusal(1000, "alice") is None


def test_identities_are_looked_up_again_after_their_ttl() -> None:
    """A lookup per task start read /etc/passwd and /etc/group each time; a resolved
    user is kept IDENTITY_TTL seconds, so a removed user or a new group shows up then."""
    now = [100.0]
    calls: list[str] = []
    users = dict(USERS)

    def getpwnam(name: str) -> pwd.struct_passwd:
        calls.append(name)
        return users[name]

    ids = iso.Identities(
        node="n2", agent_uid=0, getpwnam=getpwnam, grouplist=_grouplist, clock=lambda: now[0]
    )
    first = ids.resolve(_spec())
    assert ids.resolve(_spec()) == first and calls == ["alice"]
    del users["alice"]
    now[0] += iso.IDENTITY_TTL - 0.1
    assert ids.resolve(_spec()) == first  # still trusted
    now[0] += 0.2
    with pytest.raises(PlanRefused, match="does not exist"):
        ids.resolve(_spec())
    assert calls == ["alice", "alice"]


def test_a_nameless_submitter_is_refused() -> None:
    assert "no user name" in (_ids().submit_refusal(4242, None) or "")
    assert "no user name" in (_ids().refusal(_spec(user=None, uid=4242)) or "")


def test_an_unprivileged_agent_runs_everything_as_itself() -> None:
    ids = _ids(agent_uid=1000)
    assert not ids.switching
    assert ids.resolve(_spec(user="mallory")) is None
    assert ids.refusal(_spec(user="root", uid=0)) is None
    assert ids.submit_refusal(0, "root") is None


# ------------------------------------------------------------------ limits


def test_weights_map_onto_the_kernels_ranges() -> None:
    assert iso.cpu_shares(1.0) == 1024 and iso.cpu_shares(2.5) == 2560
    assert iso.cpu_shares(1e-6) == 2 and iso.cpu_shares(1e6) == 262144
    assert iso.cpu_weight(1.0) == 100 and iso.cpu_weight(2.5) == 250
    assert iso.cpu_weight(1e-6) == 1 and iso.cpu_weight(1e6) == 10000


def test_own_cgroups_parses_hybrid_and_unified() -> None:
    text = "12:cpu,cpuacct:/a/b\n4:memory:/m\n1:name=systemd:/s\n0::/system.slice/x.service\n"
    v2, v1 = iso.own_cgroups(text)
    assert v2 == "/system.slice/x.service"
    assert v1["cpu"] == "/a/b" and v1["cpuacct"] == "/a/b" and v1["memory"] == "/m"


@settings(max_examples=200)
@given(st.text(max_size=300))
def test_own_cgroups_never_raises(text: str) -> None:
    v2, v1 = iso.own_cgroups(text)
    assert v2 is None or isinstance(v2, str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in v1.items())


# ------------------------------------------------------------------ fake cgroupfs

V2_FILES = {
    "cgroup.procs": "",
    "cgroup.subtree_control": "",
    "cgroup.controllers": "cpu memory pids",
    "cgroup.kill": "",
    "cpu.weight": "100",
    "memory.max": "max",
    "memory.swap.max": "max",
    "memory.oom.group": "0",
    "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
}
V1_FILES = {
    "cgroup.procs": "",
    "tasks": "",
    "cpu.shares": "1024",
    "memory.limit_in_bytes": "9223372036854771712",
    "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    "memory.failcnt": "0",
}


def _populate(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        if not (d / name).exists():
            (d / name).write_text(text)


class FakeV2(iso.CgroupV2):
    def _mkdir(self, d: Path) -> None:
        _populate(d, V2_FILES)

    def _rmdir(self, d: Path) -> None:
        shutil.rmtree(d)


class FakeV1(iso.CgroupV1):
    def _mkdir(self, d: Path) -> None:
        _populate(d, V1_FILES)

    def _rmdir(self, d: Path) -> None:
        shutil.rmtree(d)


def _v2_tree(root: Path, own: str = "system.slice/swarm-agent.service") -> Path:
    _populate(root, V2_FILES)
    d = root
    for part in own.split("/"):
        d = d / part
        _populate(d, V2_FILES)
    return d


def test_detect_prefers_a_delegated_cgroup2(tmp_path: Path) -> None:
    own = _v2_tree(tmp_path)
    cg = iso.detect(
        tmp_path / "state",
        root=tmp_path,
        self_cgroup="0::/system.slice/swarm-agent.service\n",
    )
    assert isinstance(cg, iso.CgroupV2) and cg.kind == "cgroup2"
    assert cg.own == own and cg.base == own / iso.agent_key(tmp_path / "state")


def test_detect_falls_back_to_v1_when_v2_lacks_controllers(tmp_path: Path) -> None:
    own = _v2_tree(tmp_path / "unified", "x")
    (own / "cgroup.controllers").write_text("pids")
    for ctrl in ("cpu", "memory"):
        _populate(tmp_path / ctrl / "grp", V1_FILES)
        (tmp_path / ctrl / "cgroup.procs").write_text("")
    text = "4:memory:/grp\n1:cpu,cpuacct:/grp\n0::/x\n"
    cg = iso.detect(tmp_path / "state", root=tmp_path, self_cgroup=text)
    assert isinstance(cg, iso.CgroupV1) and cg.kind == "cgroup1"
    key = iso.agent_key(tmp_path / "state")
    assert cg.cpu == tmp_path / "cpu/grp" / key and cg.memory == tmp_path / "memory/grp" / key
    assert cg.homes == (tmp_path / "cpu/grp/tasks", tmp_path / "memory/grp/tasks")


def test_detect_none_says_why_and_a_forced_kind_fails_loudly(tmp_path: Path) -> None:
    cg = iso.detect(tmp_path / "state", root=tmp_path, self_cgroup="0::/\n")
    assert cg.kind == "none" and "no cgroup2 mount" in cg.detail and "cpu" in cg.detail
    with pytest.raises(iso.IsolationError, match="isolation = cgroup1 is not available"):
        iso.detect(tmp_path / "state", prefer="cgroup1", root=tmp_path, self_cgroup="")
    assert iso.detect(tmp_path, prefer="none", root=tmp_path).kind == "none"


def _plan(tmp: Path) -> ProcessPlan:
    return ProcessPlan(
        task_id="t1",
        argv=("true",),
        # as the runner builds it: the submitter's own env (HOME here) merged in
        env={"PATH": "/bin", "HOME": "/custom", "SWARM_STATE_DIR": str(tmp / "task-state/t1")},
        cwd="/",
        stdout=tmp / "o",
        stderr=tmp / "e",
    )


def _task(weight: float = 2.5, mem: int | None = 64 << 20) -> m.Task:
    spec = _spec(weight=weight, mem=mem, env={"HOME": "/custom"})
    return m.new_task(spec, 0.0, "n2")


async def test_cgroup2_task_group_limits_oom_and_cleanup(tmp_path: Path) -> None:
    own = _v2_tree(tmp_path / "fs", "svc")
    cg = FakeV2(own, "swarm-k", tmp_path / "fs")
    ti = iso.TaskIsolation(_ids(), cg)
    await ti.start()
    assert (own / "agent/cgroup.procs").read_text() == str(os.getpid())
    assert (own / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert (own / "swarm-k/cgroup.subtree_control").read_text() == "+cpu +memory"

    plan = ti.plan(_task(), _plan(tmp_path))
    group = own / "swarm-k/t1"
    assert plan.cgroup_procs == (group / "cgroup.procs",)
    assert (plan.uid, plan.gid, plan.groups, plan.umask) == (2001, 2001, (2001, 3000), 0o022)
    assert plan.env["HOME"] == "/custom" and plan.env["USER"] == "alice"  # the submitter's HOME
    assert os.stat(tmp_path / "task-state/t1").st_uid == 2001
    assert os.stat(tmp_path / "task-state").st_mode & 0o777 == 0o711
    assert cg.settings(ti.groups["t1"]) == {"cpu.weight": "250", "memory.max": str(64 << 20)}
    assert (group / "memory.swap.max").read_text() == "0"
    assert (group / "memory.oom.group").read_text() == "1"

    (group / "memory.events").write_text("oom 1\noom_kill 1\n")
    why = await ti.finished(_task(), plan, ProcessResult(None, signal.SIGKILL, pid=1))
    assert why is not None and why.startswith("out of memory")
    assert "64.0MiB" in why and "signal 9" in why
    assert ti.oom_kills == 1
    assert not group.exists() and "t1" not in ti.groups
    ti.stop()
    assert not (own / "swarm-k").exists()


async def test_cgroup1_oom_is_read_from_oom_control_or_failcnt(tmp_path: Path) -> None:
    cg = FakeV1(tmp_path / "cpu/swarm-k", tmp_path / "memory/swarm-k")
    ti = iso.TaskIsolation(_ids(agent_uid=1000), cg)
    await ti.start()
    plan = ti.plan(_task(weight=0.5, mem=None), _plan(tmp_path))
    assert plan.uid is None and plan.umask == 0o022  # an unprivileged agent does not switch
    assert cg.settings(ti.groups["t1"])["cpu.shares"] == "512"
    # no oom_kill counter (old kernel): failcnt plus SIGKILL means the limit was hit
    (tmp_path / "memory/swarm-k/t1/memory.oom_control").write_text("under_oom 0\n")
    (tmp_path / "memory/swarm-k/t1/memory.failcnt").write_text("7\n")
    why = await ti.finished(_task(), plan, ProcessResult(None, signal.SIGKILL, pid=1))
    assert why is not None and "out of memory" in why
    # exit 0, or cancelled by us: never an OOM verdict
    plan = ti.plan(_task(), _plan(tmp_path))
    (tmp_path / "memory/swarm-k/t1/memory.oom_control").write_text("oom_kill 3\n")
    assert await ti.finished(_task(), plan, ProcessResult(0, None, pid=1)) is None
    plan = ti.plan(_task(), _plan(tmp_path))
    (tmp_path / "memory/swarm-k/t1/memory.oom_control").write_text("oom_kill 3\n")
    cancelled = ProcessResult(None, signal.SIGTERM, pid=1, cancelled=True)
    assert await ti.finished(_task(), plan, cancelled) is None


async def test_cgroup1_starts_by_thread_join_unless_the_memory_limit_is_small(
    tmp_path: Path,
) -> None:
    homes = (tmp_path / "cpu/tasks", tmp_path / "memory/tasks")
    cg = FakeV1(tmp_path / "cpu/swarm-k", tmp_path / "memory/swarm-k", homes=homes)
    ti = iso.TaskIsolation(_ids(agent_uid=1000), cg)
    for h in homes:
        _populate(h.parent, V1_FILES)
    await ti.start()
    assert cg.homes == homes  # setup proved it may move this thread home
    plan = ti.plan(_task(mem=64 << 20), _plan(tmp_path))
    groups = (tmp_path / "cpu/swarm-k/t1", tmp_path / "memory/swarm-k/t1")
    want = tuple((g / "tasks", h) for g, h in zip(groups, homes, strict=True))
    assert plan.cgroup_threads == want
    assert plan.cgroup_procs == tuple(g / "cgroup.procs" for g in groups)
    await ti.finished(_task(), plan, ProcessResult(0, None, pid=1))
    # a tiny limit: the agent's thread must not count against it, the child joins
    plan = ti.plan(_task(mem=iso.THREAD_JOIN_MIN_MEM - 1), _plan(tmp_path))
    assert plan.cgroup_threads == () and plan.cgroup_procs


async def test_cgroup1_thread_join_off_when_our_own_group_is_not_ours(tmp_path: Path) -> None:
    homes = (tmp_path / "nowhere/tasks", tmp_path / "nowhere/tasks")
    cg = FakeV1(tmp_path / "cpu/swarm-k", tmp_path / "memory/swarm-k", homes=homes)
    ti = iso.TaskIsolation(_ids(agent_uid=1000), cg)
    await ti.start()
    assert ti.kind == "cgroup1" and cg.homes is None
    plan = ti.plan(_task(mem=None), _plan(tmp_path))
    assert plan.cgroup_threads == () and plan.cgroup_procs


def test_detect_v1_hides_homes_it_cannot_see(tmp_path: Path) -> None:
    for ctrl in ("cpu", "memory"):
        _populate(tmp_path / ctrl, V1_FILES)  # our group (/grp) is not visible here
    cg = iso.detect(tmp_path / "state", root=tmp_path, self_cgroup="4:memory:/grp\n1:cpu:/grp\n")
    assert isinstance(cg, iso.CgroupV1) and cg.homes is None


async def test_sweep_removes_what_a_previous_run_left(tmp_path: Path) -> None:
    cg = FakeV1(tmp_path / "cpu/swarm-k", tmp_path / "memory/swarm-k")
    cg.setup()
    for name in ("told1", "told2"):
        cg.create(name, iso.Limits())
    assert await iso.TaskIsolation(_ids(), cg).cgroups.sweep() == 2
    assert [p for p in (tmp_path / "cpu/swarm-k").iterdir() if p.is_dir()] == []


async def test_setup_failure_degrades_to_no_cgroups(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cg = iso.CgroupV1(tmp_path / "file/cpu", tmp_path / "file/memory")
    ti = iso.TaskIsolation(_ids(), cg)
    await ti.start()
    assert ti.kind == "none" and "setup failed" in ti.cgroups.detail
    plan = ti.plan(_task(), _plan(tmp_path))
    assert plan.cgroup_procs == () and plan.uid == 2001


def test_plan_refuses_a_user_unknown_here(tmp_path: Path) -> None:
    ti = iso.TaskIsolation(_ids(), iso.Cgroups())
    t = m.new_task(_spec(user="mallory"), 0.0, "n2")
    with pytest.raises(PlanRefused, match="mallory does not exist on node n2"):
        ti.plan(t, _plan(tmp_path))


def test_slow_moves_hint_names_the_remedy_unless_the_kernel_moves_fast() -> None:
    v1 = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
    v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
    hint = iso.slow_moves_hint("cgroup1", v1, "root=/dev/vda1 ro", "0\n")
    assert hint is not None and "cgroup_favordynmods=true" in hint
    hint2 = iso.slow_moves_hint("cgroup2", v2, "", "0")
    assert hint2 is not None and "favordynmods" in hint2 and "rcu_expedited" in hint2
    # no cgroups, no moves
    assert iso.slow_moves_hint("none", v1, "", "0") is None
    # v1 starts that join by thread name it "0": the kernel takes no lock (stop 49)
    assert iso.slow_moves_hint("cgroup1", v1, "", "0", thread_joins=True) is None
    assert iso.slow_moves_hint("cgroup2", v2, "", "0", thread_joins=True) is not None
    # each remedy makes moves fast
    assert iso.slow_moves_hint("cgroup1", v1, "", "1\n") is None
    assert iso.slow_moves_hint("cgroup1", v1, "quiet cgroup_favordynmods=true", "0") is None
    assert (
        iso.slow_moves_hint("cgroup2", v2.replace("relatime", "relatime,favordynmods"), "", "0")
        is None
    )
    # a favordynmods v2 mount does not help a v1 hierarchy, nor "=false"
    assert (
        iso.slow_moves_hint("cgroup1", v2.replace("relatime", "favordynmods"), "", "0") is not None
    )
    assert iso.slow_moves_hint("cgroup1", v1, "cgroup_favordynmods=false", "0") is not None
