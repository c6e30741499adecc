"""Who a task runs as, and the cgroup that holds it to its resources.

Identity. A root agent runs each task as its submitter: the user *name* recorded at
submit (from SO_PEERCRED on the home node) is looked up again on the node that runs
the task, so uids may differ between hosts but the user must exist on both. Root
tasks need `allow-root-tasks`; otherwise root is refused at submit and a handed-over
root task is refused at the offer, both with a reason naming the option. An agent that
is not root cannot switch users: everything it runs, runs as the agent's own user
(a per-user agent, or a shared service account).

Cgroups. The task's weight becomes its CPU weight (cgroup v2 `cpu.weight`, 100 per
unit of weight; v1 `cpu.shares`, 1024 per unit) and its memory request becomes a hard
limit (`memory.max` / `memory.limit_in_bytes`, swap off where the kernel lets us), so
a task over its request is OOM-killed inside its own group instead of pushing the
host into swapping. After the task exits we read the group's OOM counter, so the
task fails with "out of memory" instead of a bare SIGKILL, then kill whatever is left
in the group (children that escaped the process group with setsid) and remove it.

Which kind: cgroup v2 when the agent's own cgroup is a delegated subtree with the cpu
and memory controllers (systemd `Delegate=yes`); the agent then moves itself into a
leaf `agent/` (the no-internal-processes rule) and creates its task groups next to it.
Otherwise cgroup v1 cpu + memory hierarchies, under the agent's own groups there.
Otherwise none (read-only cgroupfs in a container, no root): tasks still run, only
without limits. Each agent's task groups live under `swarm-<hash of state dir>`, so
agents sharing a machine (tests) never touch each other's groups, and a restarted
agent finds and sweeps its own leftovers.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pwd
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from .. import model as m
from ..logs import NULL_LOG, EventLog
from .cwdcheck import cwd_refusal
from .executor import ProcessPlan, ProcessResult
from .executor import write_control as _write
from .procstart import THIS_THREAD
from .runner import PlanRefused

KINDS = ("cgroup2", "cgroup1", "none")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
PROC_MOUNTS = Path("/proc/mounts")
PROC_CMDLINE = Path("/proc/cmdline")
RCU_EXPEDITED = Path("/sys/kernel/rcu_expedited")
TASK_UMASK = 0o022  # the agent's own umask is private (0077 in the unit); tasks get the usual one


class IsolationError(Exception):
    """The configured isolation cannot be set up (the agent refuses to start)."""


# ------------------------------------------------------------------ identity


@attrs.frozen
class Identity:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


# Below this memory limit a task's process is not started by a thread that joined its
# memory group: that thread's own allocations in the moment would count against the
# limit, and an OOM in the group could pick the agent. The child joins by itself.
THREAD_JOIN_MIN_MEM = 16 << 20
IDENTITY_TTL = 5.0  # seconds a resolved user is trusted without a new lookup


class Identities:
    """Resolves the user a task runs as on this node, or says why it cannot run here."""

    def __init__(
        self,
        *,
        node: m.NodeId,
        agent_uid: int | None = None,
        allow_root: bool = False,
        getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
        grouplist: Callable[[str, int], list[int]] = os.getgrouplist,
        # the agent passes its Clock's now(); time.monotonic for callers outside trio
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.agent_uid = os.geteuid() if agent_uid is None else agent_uid
        self.allow_root = allow_root
        self._getpwnam = getpwnam
        self._grouplist = grouplist
        self._clock = clock
        # user -> (identity, valid until): a passwd + group lookup reads two files per
        # task start; a user or group change is seen within IDENTITY_TTL seconds
        self._cache: dict[str, tuple[Identity, float]] = {}

    @property
    def switching(self) -> bool:
        """Only root can run tasks as their submitters."""
        return self.agent_uid == 0

    def submit_refusal(self, uid: int, user: str | None) -> str | None:
        """Why a submission from this caller is refused here (None: accepted)."""
        if not self.switching:
            return None
        if uid == 0 and not self.allow_root:
            return (
                f"tasks may not run as root on node {self.node} (allow-root-tasks = false); "
                "submit as an unprivileged user, or set allow-root-tasks = true"
            )
        if user is None:
            return f"uid {uid} has no user name on node {self.node}; tasks run as a named user"
        return None

    def refusal(self, spec: m.TaskSpec) -> str | None:
        """Why `spec` cannot run on this node (None: it can)."""
        try:
            self.resolve(spec)
        except PlanRefused as e:
            return str(e)
        return None

    def resolve(self, spec: m.TaskSpec) -> Identity | None:
        """The identity to switch to; None when the agent does not switch users."""
        if not self.switching:
            return None
        if not spec.user:
            raise PlanRefused(
                f"the submitter (uid {spec.uid}) has no user name on node "
                f"{spec.home or '?'}; tasks run as a named user"
            )
        now = self._clock()
        hit = self._cache.get(spec.user)
        if hit is not None and now < hit[1]:
            return hit[0]
        try:
            pw = self._getpwnam(spec.user)
        except KeyError:
            raise PlanRefused(f"user {spec.user} does not exist on node {self.node}") from None
        if pw.pw_uid == 0 and not self.allow_root:
            raise PlanRefused(
                f"tasks may not run as root on node {self.node} (allow-root-tasks = false)"
            )
        try:
            groups = tuple(self._grouplist(pw.pw_name, pw.pw_gid))
        except OSError:
            groups = (pw.pw_gid,)
        ident = Identity(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[spec.user] = (ident, now + IDENTITY_TTL)
        return ident


# ------------------------------------------------------------------ cgroups


@attrs.frozen
class Limits:
    weight: float = 1.0  # CPU weight (1.0 = one default share)
    mem: int | None = None  # bytes; hard limit


def limits_of(spec: m.TaskSpec) -> Limits:
    return Limits(weight=spec.weight, mem=spec.mem)


@attrs.frozen
class TaskGroup:
    task_id: str
    dirs: tuple[Path, ...]  # one per hierarchy (v1: cpu, memory; v2: one)
    mem_limit: int | None

    @property
    def procs(self) -> tuple[Path, ...]:
        return tuple(d / "cgroup.procs" for d in self.dirs)


# what the kernel gives a new group: task starts at weight 1.0 skip writing it (a
# cgroupfs write is ~0.05 ms on the submit-to-start path)
DEFAULT_CPU_SHARES = 1024
DEFAULT_CPU_WEIGHT = 100


def cpu_shares(weight: float) -> int:
    """v1 cpu.shares for a task weight: 1024 per unit, within the kernel's range."""
    return max(2, min(262144, round(1024 * weight)))


def cpu_weight(weight: float) -> int:
    """v2 cpu.weight for a task weight: 100 (the default) per unit, within 1..10000."""
    return max(1, min(10000, round(100 * weight)))


def agent_key(state_dir: Path) -> str:
    """Names this agent's task-group parent; stable across restarts of the same agent."""
    return "swarm-" + hashlib.sha1(str(state_dir).encode()).hexdigest()[:8]


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read()


def _keyed(text: str) -> dict[str, int]:
    """Parse `key value` lines (memory.events, memory.oom_control, memory.stat)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


class Cgroups:
    """No cgroups: tasks run without limits. The base of the real kinds."""

    kind = "none"

    def __init__(self, detail: str = "", log: EventLog = NULL_LOG) -> None:
        self.detail = detail
        self.log = log
        self.created = 0
        self.removed = 0
        self.errors = 0

    def setup(self) -> None:
        """Prepare the parent groups and sweep leftovers of a previous run."""

    def create(self, task_id: str, limits: Limits) -> TaskGroup | None:
        return None

    def oom_killed(self, group: TaskGroup, result: ProcessResult) -> bool:
        return False

    def settings(self, group: TaskGroup) -> dict[str, str]:
        """The limits as the kernel holds them (for tests and `swarm status`)."""
        return {}

    def task_groups(self) -> list[TaskGroup]:
        return []

    def thread_joins(self, group: TaskGroup) -> tuple[tuple[Path, Path], ...]:
        """(task group `tasks` file, the agent's own) per hierarchy, for a start that
        joins by thread (ProcessPlan.cgroup_threads); () where only the child can join."""
        return ()

    def parents(self) -> tuple[Path, ...]:
        """This agent's parent groups of its task groups."""
        return ()

    def close(self) -> None:
        """On a clean stop: remove the (then empty) parent groups."""
        for d in self.parents():
            try:
                self._rmdir(d)
            except OSError:
                pass  # not empty (a task group we could not remove) or gone

    async def remove(self, group: TaskGroup) -> None:
        """Remove the group; if something is left in it (a process that left the
        task's process group), kill that first, then retry while busy. The common
        case, an empty group, costs one rmdir per hierarchy and no reads."""
        killed = False
        for d in group.dirs:
            for attempt in range(50):
                try:
                    self._rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or attempt == 49:
                        self.errors += 1
                        self.log.warning("cgroup.remove_failed", task=group.task_id, error=str(e))
                        break
                    if not killed:
                        await self._kill_members(group)
                        killed = True
                    else:
                        await trio.sleep(0.02)
        self.removed += 1

    async def _kill_members(self, group: TaskGroup) -> None:
        """SIGKILL every process in the group and wait (up to 2 s) until none is left."""
        for _ in range(100):
            pids = self._pids(group)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            await trio.sleep(0.02)

    async def sweep(self, keep: frozenset[str] = frozenset()) -> int:
        """Remove the task groups a previous run of this agent left behind, but those
        of `keep`, tasks that outlived it under their supervisor (runtime/shim.py)."""
        groups = [g for g in self.task_groups() if g.task_id not in keep]
        for g in groups:
            await self.remove(g)
        if groups:
            self.log.info("cgroup.swept", groups=len(groups))
        return len(groups)

    def _pids(self, group: TaskGroup) -> list[int]:
        pids: set[int] = set()
        for p in group.procs:
            try:
                pids.update(int(x) for x in _read(p).split())
            except (OSError, ValueError):
                pass
        pids.discard(os.getpid())
        return sorted(pids)

    # the two operations where cgroupfs is not a plain filesystem (tests fake them)
    def _mkdir(self, d: Path) -> None:
        d.mkdir(exist_ok=True)

    def _rmdir(self, d: Path) -> None:
        os.rmdir(d)


class CgroupV1(Cgroups):
    """cgroup v1: a task group in the cpu and in the memory hierarchy.

    `homes`: the agent's own groups' `tasks` files (cpu, memory). With them, a task's
    process is started by a thread that has joined the task's groups for the moment
    of the start, so the child is born there (v1 moves single threads)."""

    kind = "cgroup1"

    def __init__(
        self,
        cpu: Path,
        memory: Path,
        log: EventLog = NULL_LOG,
        homes: tuple[Path, Path] | None = None,
    ) -> None:
        super().__init__(f"cpu {cpu}, memory {memory}", log)
        self.cpu = cpu
        self.memory = memory
        self.homes = homes

    def setup(self) -> None:
        for d in (self.cpu, self.memory):
            self._mkdir(d)
        if self.homes is not None:
            try:  # moving this thread to where it is: proves we may move threads
                for home in self.homes:
                    _write(home, THIS_THREAD)
            except OSError as e:
                self.log.info("cgroup.thread_join_off", error=str(e))
                self.homes = None

    def thread_joins(self, group: TaskGroup) -> tuple[tuple[Path, Path], ...]:
        if self.homes is None or (
            group.mem_limit is not None and group.mem_limit < THREAD_JOIN_MIN_MEM
        ):
            return ()
        return tuple(zip((d / "tasks" for d in group.dirs), self.homes, strict=True))

    def parents(self) -> tuple[Path, ...]:
        return (self.cpu, self.memory)

    def create(self, task_id: str, limits: Limits) -> TaskGroup:
        cpu_d, mem_d = self.cpu / task_id, self.memory / task_id
        for d in (cpu_d, mem_d):
            try:
                self._mkdir(d)
            except FileNotFoundError:  # someone removed our (empty) parent: recreate
                self._mkdir(d.parent)
                self._mkdir(d)
        shares = cpu_shares(limits.weight)
        if shares != DEFAULT_CPU_SHARES:  # a new group starts with the default
            _write(cpu_d / "cpu.shares", str(shares))
        if limits.mem is not None:
            _write(mem_d / "memory.limit_in_bytes", str(limits.mem))
            memsw = mem_d / "memory.memsw.limit_in_bytes"
            if memsw.exists():  # swap accounting on: limit memory + swap, too
                _write(memsw, str(limits.mem))
            swappiness = mem_d / "memory.swappiness"
            if swappiness.exists():
                try:
                    _write(swappiness, "0")
                except OSError:
                    pass
        self.created += 1
        return TaskGroup(task_id, (cpu_d, mem_d), limits.mem)

    def oom_killed(self, group: TaskGroup, result: ProcessResult) -> bool:
        mem_d = group.dirs[1]
        try:
            ctl = _keyed(_read(mem_d / "memory.oom_control"))
        except OSError:
            ctl = {}
        if "oom_kill" in ctl:  # kernels >= 4.13 count the kills per group
            return ctl["oom_kill"] > 0
        try:
            failcnt = int(_read(mem_d / "memory.failcnt").strip() or 0)
        except (OSError, ValueError):
            failcnt = 0
        return failcnt > 0 and result.signal == signal.SIGKILL

    def settings(self, group: TaskGroup) -> dict[str, str]:
        cpu_d, mem_d = group.dirs
        return {
            "cpu.shares": _read(cpu_d / "cpu.shares").strip(),
            "memory.limit_in_bytes": _read(mem_d / "memory.limit_in_bytes").strip(),
        }

    def task_groups(self) -> list[TaskGroup]:
        names: set[str] = set()
        for base in (self.cpu, self.memory):
            try:
                names.update(p.name for p in base.iterdir() if p.is_dir())
            except OSError:
                pass
        return [TaskGroup(n, (self.cpu / n, self.memory / n), None) for n in sorted(names)]


class CgroupV2(Cgroups):
    """cgroup v2 in a delegated subtree: `own/agent` holds the agent, `own/<key>/<task>`
    the tasks."""

    kind = "cgroup2"

    def __init__(self, own: Path, key: str, mount: Path, log: EventLog = NULL_LOG) -> None:
        super().__init__(f"{own / key} (delegated)", log)
        self.own = own
        self.mount = mount
        self.base = own / key

    def setup(self) -> None:
        if self.own != self.mount:
            # no internal processes: the agent moves into a leaf before the subtree
            # gets controllers
            leaf = self.own / "agent"
            self._mkdir(leaf)
            _write(leaf / "cgroup.procs", str(os.getpid()))
        _write(self.own / "cgroup.subtree_control", "+cpu +memory")
        self._mkdir(self.base)
        _write(self.base / "cgroup.subtree_control", "+cpu +memory")

    def parents(self) -> tuple[Path, ...]:
        return (self.base,)

    def create(self, task_id: str, limits: Limits) -> TaskGroup:
        d = self.base / task_id
        self._mkdir(d)
        weight = cpu_weight(limits.weight)
        if weight != DEFAULT_CPU_WEIGHT:  # a new group starts with the default
            _write(d / "cpu.weight", str(weight))
        if limits.mem is not None:
            _write(d / "memory.max", str(limits.mem))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
        if (d / "memory.oom.group").exists():
            _write(d / "memory.oom.group", "1")  # an OOM kills the whole task, not a part
        self.created += 1
        return TaskGroup(task_id, (d,), limits.mem)

    def oom_killed(self, group: TaskGroup, result: ProcessResult) -> bool:
        try:
            ev = _keyed(_read(group.dirs[0] / "memory.events"))
        except OSError:
            return False
        return ev.get("oom_kill", 0) > 0 or ev.get("oom_group_kill", 0) > 0

    def settings(self, group: TaskGroup) -> dict[str, str]:
        d = group.dirs[0]
        return {
            "cpu.weight": _read(d / "cpu.weight").strip(),
            "memory.max": _read(d / "memory.max").strip(),
        }

    def task_groups(self) -> list[TaskGroup]:
        try:
            return [
                TaskGroup(p.name, (p,), None) for p in sorted(self.base.iterdir()) if p.is_dir()
            ]
        except OSError:
            return []

    async def remove(self, group: TaskGroup) -> None:
        kill = group.dirs[0] / "cgroup.kill"
        if kill.exists():
            try:
                _write(kill, "1")
            except OSError:
                pass
        await super().remove(group)


# ------------------------------------------------------------------ detection


def own_cgroups(text: str) -> tuple[str | None, dict[str, str]]:
    """(v2 path, {v1 controller: path}) from /proc/self/cgroup."""
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, ctrls, path = parts
        if hier == "0" and ctrls == "":
            v2 = path
        else:
            for c in ctrls.split(","):
                if c:
                    v1[c] = path
    return v2, v1


def _within(mount: Path, path: str) -> Path:
    d = mount / path.lstrip("/")
    # in a container the path may be relative to a mount we cannot see: use the mount
    return d if d.is_dir() else mount


def _writable(*paths: Path) -> bool:
    return all(os.access(p, os.W_OK) for p in paths)


def try_cgroup2(key: str, root: Path, self_cgroup: str, log: EventLog) -> CgroupV2 | str:
    v2, _ = own_cgroups(self_cgroup)
    if v2 is None:
        return "no cgroup2 hierarchy in /proc/self/cgroup"
    for mount in (root, root / "unified"):
        if (mount / "cgroup.controllers").exists():
            break
    else:
        return "no cgroup2 mount"
    own = _within(mount, v2)
    try:
        available = _read(own / "cgroup.controllers").split()
    except OSError as e:
        return f"cannot read {own}/cgroup.controllers: {e.strerror}"
    missing = [c for c in ("cpu", "memory") if c not in available]
    if missing:
        return f"cgroup2 {own} lacks the {' and '.join(missing)} controller(s)"
    if not _writable(own, own / "cgroup.procs", own / "cgroup.subtree_control"):
        return f"cgroup2 {own} is not delegated to us (not writable)"
    return CgroupV2(own, key, mount, log)


def try_cgroup1(key: str, root: Path, self_cgroup: str, log: EventLog) -> CgroupV1 | str:
    _, v1 = own_cgroups(self_cgroup)
    dirs: dict[str, Path] = {}
    seen = True  # our own groups are visible (not hidden by a container's mounts)
    for ctrl in ("cpu", "memory"):
        mount = root / ctrl
        if ctrl not in v1 or not (mount / "cgroup.procs").exists():
            return f"no cgroup v1 {ctrl} hierarchy"
        own = _within(mount, v1[ctrl])
        if not _writable(own):
            return f"cgroup v1 {own} is not writable"
        seen = seen and own == mount / v1[ctrl].lstrip("/")
        dirs[ctrl] = own / key
    homes = (dirs["cpu"].parent / "tasks", dirs["memory"].parent / "tasks") if seen else None
    return CgroupV1(dirs["cpu"], dirs["memory"], log, homes=homes)


def detect(
    state_dir: Path,
    *,
    prefer: str = "auto",
    root: Path = CGROUP_ROOT,
    self_cgroup: str | None = None,
    log: EventLog = NULL_LOG,
) -> Cgroups:
    """The best isolation available: cgroup2, then cgroup1, then none. A kind asked
    for explicitly (`prefer`) that is not available raises IsolationError."""
    if prefer == "none":
        return Cgroups("switched off (isolation = none)", log)
    if self_cgroup is None:
        try:
            self_cgroup = _read(PROC_SELF_CGROUP)
        except OSError:
            self_cgroup = ""
    key = agent_key(state_dir)
    reasons: list[str] = []
    tries = {"cgroup2": try_cgroup2, "cgroup1": try_cgroup1}
    order = ["cgroup2", "cgroup1"] if prefer == "auto" else [prefer]
    for kind in order:
        got = tries[kind](key, root, self_cgroup, log)
        if isinstance(got, Cgroups):
            return got
        reasons.append(got)
    if prefer != "auto":
        raise IsolationError(f"isolation = {prefer} is not available: {'; '.join(reasons)}")
    return Cgroups("; ".join(reasons), log)


def slow_moves_hint(
    kind: str, mounts: str, cmdline: str, rcu_expedited: str, thread_joins: bool = False
) -> str | None:
    """Why a task start may wait ~5-15 ms for its cgroup, or None if it will not.
    `thread_joins`: cgroup v1 starts join by thread, as "0" (procstart.THIS_THREAD),
    which the kernel moves without that lock (only a task with a memory limit under
    THREAD_JOIN_MIN_MEM still joins by process).

    Putting a process into a cgroup (our thread join, or a shell writing
    cgroup.procs) write-locks the kernel's cgroup_threadgroup_rwsem, which, unless the
    hierarchy favours dynamic modifications, waits for an RCU grace period when no move
    happened in the last few milliseconds: measured on this project's 2-vCPU VM, a
    join took 0.1 ms back to back and 5.5 ms (up to 13) after 50 ms idle, and a start
    through the agent 4 ms against 11-16 ms. Only `clone3(CLONE_INTO_CGROUP)` avoids
    the lock, and Python's subprocess cannot use it."""
    if kind not in ("cgroup1", "cgroup2") or (kind == "cgroup1" and thread_joins):
        return None
    if rcu_expedited.strip() == "1":
        return None
    on = ("cgroup_favordynmods=1", "cgroup_favordynmods=y", "cgroup_favordynmods=true")
    if any(word.lower() in on for word in cmdline.split()):
        return None
    fstype = "cgroup2" if kind == "cgroup2" else "cgroup"
    for line in mounts.splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] == fstype and "favordynmods" in f[3].split(","):
            return None
    how = (
        "remount the cgroup2 hierarchy with -o favordynmods"
        if kind == "cgroup2"
        else "boot with cgroup_favordynmods=true (kernel 6.7+)"
    )
    return (
        "each task start after an idle moment waits for an RCU grace period to put the "
        f"task in its cgroup (~5-15 ms); to avoid it, {how}, or set "
        "/sys/kernel/rcu_expedited to 1 (system-wide)"
    )


def _text(path: Path) -> str:
    try:
        return _read(path)
    except OSError:
        return ""


# ------------------------------------------------------------------ per task


def give_state_dir(path: Path, ident: Identity) -> None:
    """Hand a checkpointing task's state dir to its user. Changed through descriptors
    opened with O_NOFOLLOW, never by path: a symlink in its place (or as its parent) is
    refused, not followed, so root never chowns or chmods a file of someone's choosing."""
    path.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    parent = os.open(path.parent, flags)
    try:
        os.fchmod(parent, 0o711)  # reachable by each task's user, not listable
        fd = os.open(path.name, flags, dir_fd=parent)
        try:
            os.fchown(fd, ident.uid, ident.gid)
        finally:
            os.close(fd)
    finally:
        os.close(parent)


class TaskIsolation:
    """The runner's plan and exit hooks and the coordinator's admission check."""

    def __init__(
        self,
        identities: Identities,
        cgroups: Cgroups,
        *,
        log: EventLog = NULL_LOG,
    ) -> None:
        self.identities = identities
        self.cgroups = cgroups
        self.log = log
        self.groups: dict[str, TaskGroup] = {}
        self.oom_kills = 0
        self.slow_moves: str | None = None  # set by start(): see slow_moves_hint

    @property
    def kind(self) -> str:
        return self.cgroups.kind

    async def start(self, keep: frozenset[str] = frozenset()) -> None:
        """Set the cgroup parents up and remove what a previous run left behind, but
        the groups of `keep` (tasks re-attached after a restart: removed when they
        end). A failure here degrades to no cgroups (logged): tasks must still run."""
        try:
            self.cgroups.setup()
            await self.cgroups.sweep(keep)
            for g in self.cgroups.task_groups():
                if g.task_id in keep:  # removed when the task ends (finished)
                    self.groups[g.task_id] = g
        except OSError as e:
            self.log.warning(
                "isolation.unavailable", kind=self.cgroups.kind, error=str(e), fallback="none"
            )
            self.cgroups = Cgroups(f"{self.cgroups.kind} setup failed: {e}", self.log)
        joins = isinstance(self.cgroups, CgroupV1) and self.cgroups.homes is not None
        self.slow_moves = slow_moves_hint(
            self.kind, _text(PROC_MOUNTS), _text(PROC_CMDLINE), _text(RCU_EXPEDITED), joins
        )
        self.log.info(
            "isolation.ready",
            kind=self.kind,
            detail=self.cgroups.detail,
            switch_users=self.identities.switching,
            root_tasks=self.identities.allow_root,
        )
        if self.slow_moves is not None:
            self.log.info("cgroup.slow_moves", hint=self.slow_moves)

    def stop(self) -> None:
        """The agent stops cleanly: its tasks are gone, so is their parent group."""
        self.cgroups.close()

    def admission_refusal(self, spec: m.TaskSpec) -> str | None:
        """Why `spec` may not run here at all: its user does not exist (or is root and
        root tasks are off), or its working directory is not there for that user."""
        try:
            ident = self.identities.resolve(spec)
        except PlanRefused as e:
            return str(e)
        if spec.cwd_any:
            return None
        if ident is None:
            return cwd_refusal(spec.cwd, self.identities.node, None)
        return cwd_refusal(spec.cwd, self.identities.node, ident.uid, (ident.gid, *ident.groups))

    def owner_of(self, spec: m.TaskSpec) -> tuple[int, int] | None:
        """Whom a task's received state belongs to here, (uid, gid); None: the agent's
        user (no user switching, or the user cannot be resolved here)."""
        try:
            ident = self.identities.resolve(spec)
        except PlanRefused:
            return None
        return None if ident is None else (ident.uid, ident.gid)

    def plan(self, task: m.Task, plan: ProcessPlan) -> ProcessPlan:
        """Runner plan hook: the user to run as, and the task's cgroup."""
        ident = self.identities.resolve(task.spec)  # PlanRefused: the task fails with it
        changes: dict[str, Any] = {"umask": TASK_UMASK}
        if ident is not None:
            env = dict(plan.env)
            for k, v in (("HOME", ident.home), ("USER", ident.name), ("LOGNAME", ident.name)):
                if k not in task.spec.env:
                    env[k] = v
            changes.update(uid=ident.uid, gid=ident.gid, groups=ident.groups, env=env)
            state = plan.env.get("SWARM_STATE_DIR")
            if state:  # a checkpointing task writes its state dir as itself
                try:
                    give_state_dir(Path(state), ident)
                except OSError as e:
                    raise PlanRefused(f"cannot prepare its state directory: {e}") from None
        try:
            group = self.cgroups.create(task.id, limits_of(task.spec))
        except OSError as e:
            self.cgroups.errors += 1
            self.log.warning("cgroup.create_failed", task=task.id, error=str(e))
            group = None
        if group is not None:
            self.groups[task.id] = group
            changes["cgroup_procs"] = group.procs
            changes["cgroup_threads"] = self.cgroups.thread_joins(group)
        return attrs.evolve(plan, **changes)

    async def finished(self, task: m.Task, plan: ProcessPlan, result: ProcessResult) -> str | None:
        """Runner exit hook: why the task failed if the cgroup knows better (OOM);
        then the group goes."""
        group = self.groups.pop(task.id, None)
        if group is None:
            return None
        why: str | None = None
        failed = result.signal is not None or (result.exit_code not in (0, None))
        if failed and not result.cancelled and self.cgroups.oom_killed(group, result):
            self.oom_kills += 1
            limit = "" if group.mem_limit is None else f" of {_fmt_bytes(group.mem_limit)}"
            how = f"signal {result.signal}" if result.signal else f"exit {result.exit_code}"
            why = f"out of memory: exceeded its memory limit{limit} and was OOM-killed ({how})"
            self.log.warning("task.oom", task=task.id, limit=group.mem_limit, cause=why)
        with trio.CancelScope(shield=True):
            await self.cgroups.remove(group)
        return why


def _fmt_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return str(n)
