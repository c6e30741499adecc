"""How a task's process is started: the plan, the three ways to start it, log files,
and why a start failed.

The three ways: a task of the agent's own user on the vfork path (`spawn_argv`;
cgroups inherited from the starting thread or joined by a tiny shell wrapper); a
task of another user through swarm-exec (`HelperStart`, also vfork); or, without
swarm-exec, a fork with the user switch in the child (`UserSwitch`).
`start_process` makes the start; `executor.Executor` decides when and where (on
the loop or in a worker thread) and supervises the process afterwards. Kept apart
from the executor because the start is where the privilege rules live (what runs
as root, in which order), and they read best on their own.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

OpenLogs = tuple[int, int]  # a task's stdout and stderr files: open descriptors


@attrs.frozen
class ProcessPlan:
    """Everything needed to start one attempt of a task."""

    task_id: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    stdout: Path
    stderr: Path
    uid: int | None = None  # switch to this user (agent must be root)
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    cgroup_procs: tuple[Path, ...] = ()  # cgroup.procs files to join before exec
    # cgroup v1, per hierarchy: (the task group's `tasks` file, the agent's own). The
    # starting thread joins the first, starts the process, which inherits it, and
    # goes back: no wrapper process. Empty: the child joins cgroup_procs itself.
    cgroup_threads: tuple[tuple[Path, Path], ...] = ()
    umask: int | None = None  # the task's umask (None: inherit the agent's)
    # where the task's supervisor (runtime/shim.py) writes its exit status; None:
    # started without one (no shim built here)
    status_dir: Path | None = None
    # status_dir exists and is empty (reused: runtime/statusdirs.py): no mkdir, no unlinks
    status_ready: bool = False
    # --at-most-once: the runner's lease, a time.monotonic() deadline the supervisor
    # enforces (node/fencing.py); None: no lease (the task may not need one)
    lease: float | None = None


def switches_user(plan: ProcessPlan) -> bool:
    """Does this start change credentials (a root agent running a task as its user)?"""
    return plan.uid is not None and (
        plan.uid != os.geteuid() or plan.gid not in (None, os.getegid())
    )


class UserSwitch:
    """The start of a task as another user, in the child between fork and exec.

    Order matters, and nothing the submitter chose is touched while the child is root:
    join the task's cgroups (needs the agent's privileges; the paths are the agent's
    own), switch user (groups, gid, uid), then chdir to the task's directory *as the
    user* (the kernel's permission checks decide, so a directory the user cannot enter
    fails the task), then execve with the task's environment: the submitter's
    variables (LD_PRELOAD, GCONV_PATH, ...) reach only the task's own program, never a
    root helper. Why not setpriv(1) or a shell: those are programs the dynamic loader
    starts as root, with whatever environment they are given.

    A failure in the child is written to a pipe (the parent learns only "preexec_fn
    failed" from subprocess) so the task fails with the reason."""

    def __init__(self, plan: ProcessPlan) -> None:
        self.plan = plan
        self._r, self._w = os.pipe()

    def preexec(self) -> None:  # runs in the child between fork and exec
        plan = self.plan
        step = "cannot put the process in its cgroup"
        try:
            if not plan.cgroup_threads:
                pid = str(os.getpid()).encode()
                for p in plan.cgroup_procs:
                    fd = os.open(p, os.O_WRONLY)
                    try:
                        os.write(fd, pid)
                    finally:
                        os.close(fd)
            step = "cannot switch to its user"
            assert plan.uid is not None
            os.setgroups(list(plan.groups or ()))
            if plan.gid is not None:
                os.setregid(plan.gid, plan.gid)
            os.setreuid(plan.uid, plan.uid)
            step = f"cannot enter working directory {plan.cwd}"
            os.chdir(plan.cwd)
        except OSError as e:
            msg = f"{step}: {e.strerror or e}"
            if step.startswith("cannot enter"):
                msg += f" (as uid {plan.uid})"
            os.write(self._w, msg.encode(errors="replace")[:4096])
            raise

    def error(self) -> str | None:
        """What the child wrote before it failed (call once Popen has returned)."""
        os.close(self._w)
        self._w = -1
        try:
            data = os.read(self._r, 4096)
        except OSError:
            data = b""
        return data.decode(errors="replace") or None

    def close(self) -> None:
        for fd in (self._r, self._w):
            if fd >= 0:
                os.close(fd)
        self._r = self._w = -1


class HelperStart:
    """A start through swarm-exec (exechelper.py): the same order as UserSwitch, but
    in a small compiled program started on the vfork path with an empty environment.
    The task's environment goes through a memfd (argv is readable by every local
    user in /proc); the helper's verdict comes back through a pipe that a successful
    exec closes unread."""

    def __init__(self, plan: ProcessPlan, helper: Path) -> None:
        assert plan.uid is not None and plan.gid is not None
        self.env_fd = os.memfd_create("swarm-env", os.MFD_CLOEXEC)
        try:
            data = b"".join(
                os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in plan.env.items()
            )
            view = memoryview(data)
            while view:
                view = view[os.write(self.env_fd, view) :]
            self.status_r, self.status_w = os.pipe()
        except BaseException:
            os.close(self.env_fd)
            raise
        groups = ",".join(str(g) for g in plan.groups or ()) or "-"
        joins = [] if plan.cgroup_threads else [str(p) for p in plan.cgroup_procs]
        self.argv = [
            str(helper),
            str(plan.uid),
            str(plan.gid),
            groups,
            plan.cwd,
            str(self.env_fd),
            str(self.status_w),
            *joins,
            "--",
            *plan.argv,
        ]

    def started(self) -> int:
        """Popen returned: drop the child's ends; the status pipe's read end is the
        caller's to await (helper_verdict) and close."""
        os.close(self.env_fd)
        os.close(self.status_w)
        return self.status_r

    def failed(self) -> None:
        for fd in (self.env_fd, self.status_r, self.status_w):
            os.close(fd)


async def helper_verdict(fd: int) -> str | None:
    """None once the task's own program has been exec'd; else the helper's reason."""
    try:
        await trio.lowlevel.wait_readable(fd)
        data = os.read(fd, 8192)
    except OSError as e:
        data = f"cannot read the start's status: {e}".encode()
    finally:
        os.close(fd)
    return data.decode(errors="replace") or None


# Joins the cgroups named before "--", then execs the rest. A shell costs about a
# millisecond; a Python preexec_fn forces fork() of the whole agent instead of vfork
# (8 ms in a bare interpreter, tens of ms in a busy agent), on every task start. Used
# only where the task runs as the agent's own user (no credentials change).
_CGJOIN = (
    'while [ "$1" != "--" ]; do echo $$ > "$1" || '
    '{ echo "swarm: cannot join cgroup $1" >&2; exit 126; }; shift; done; shift; exec "$@"'
)


def wrapper_joins(plan: ProcessPlan) -> bool:
    """Does the child join its cgroups itself (not inherit them from the starter)?"""
    return bool(plan.cgroup_procs) and not plan.cgroup_threads


def spawn_argv(plan: ProcessPlan) -> tuple[list[str], dict[str, Any]] | None:
    """argv and Popen arguments that keep the start on the fast (vfork) path, for a
    task that runs as the agent's own user: cgroups are inherited from the starting
    thread or joined by a tiny shell wrapper. None: the task changes user, which only
    `UserSwitch` may do (a fork, then the switch before anything else)."""
    if switches_user(plan):
        return None
    argv = list(plan.argv)
    if wrapper_joins(plan):
        argv = ["/bin/sh", "-c", _CGJOIN, "swarm-cgjoin", *map(str, plan.cgroup_procs), "--", *argv]
    return argv, {}


def command_exists(plan: ProcessPlan) -> bool:
    """Only for tasks that run as the agent's own user: anything else is checked by
    the kernel, as the task's user, at its exec."""
    cmd = plan.argv[0]
    if "/" in cmd:
        path = cmd if os.path.isabs(cmd) else os.path.join(plan.cwd, cmd)
        return os.path.isfile(path)
    return shutil.which(cmd, path=plan.env.get("PATH", os.defpath)) is not None


@attrs.frozen
class Spawn:
    """A process ready to be started: its Popen arguments and open log files."""

    plan: ProcessPlan
    argv: list[str]
    kwargs: dict[str, Any]
    logs: OpenLogs
    switch: UserSwitch | None = None  # the task runs as another user, via a fork
    helper: HelperStart | None = None  # ... started through swarm-exec (vfork)
    report: tuple[int, int] | None = None  # the shim's report pipe (read, write)

    @property
    def forks(self) -> bool:
        """Does starting it fork the agent (a preexec_fn: CPython cannot vfork then)?"""
        return self.switch is not None


# O_NOFOLLOW: a task's log file is never a symlink someone planted (the agent may be
# root; the file's name comes from a validated task id in a root-owned directory)
LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW


# What a thread writes into a v1 `tasks` file to move itself. Named by its id, the move
# write-locks the kernel's cgroup_threadgroup_rwsem, which waits for an RCU grace period
# when no move happened in the last few milliseconds: 5.8 ms per join and return after
# 50 ms idle on the build VM (0.05 ms back to back), with the agent's event loop
# blocked meanwhile. "0" moves the writing thread itself, which cannot exit or exec
# under the kernel's hands, so the kernel skips that lock (cgroup_procs_write_start;
# measured on this project's kernel, 6.18): 0.18 ms after the same idle (stop 49). A
# kernel without that shortcut moves "0" exactly as it moves the id (v1 has always
# read 0 as the writer), only no faster. A process (cgroup.procs) takes the lock
# either way.
THIS_THREAD = "0"


def start_process(spawn: Spawn) -> subprocess.Popen[Any] | BaseException:
    """Popen, with the failure to start returned (this may run in a worker thread).

    With `cgroup_threads`, the calling thread (alone: v1 moves single threads through
    `tasks`) joins the task's groups for the start: a child is born in its parent
    thread's groups. Two writes per hierarchy (~0.03 ms) instead of exec'ing a shell
    that joins them (~1 ms of CPU and of wall time before the task's own exec). Each
    write names the thread as "0" (THIS_THREAD), never by its id: see there."""
    joined: list[Path] = []
    try:
        for task_file, home in spawn.plan.cgroup_threads:
            try:
                write_control(task_file, THIS_THREAD)
            except OSError as e:
                return CgroupJoinError(f"cannot put the process in its cgroup: {task_file}: {e}")
            joined.append(home)
        return subprocess.Popen(spawn.argv, **spawn.kwargs)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return e
    finally:
        for home in joined:
            try:
                write_control(home, THIS_THREAD)
            except OSError:
                # never fail a started process for this: the group's removal will
                # report it busy (cgroup.remove_failed), and kills skip the agent
                pass


class CgroupJoinError(Exception):
    """The starting thread could not join the task's cgroup (so nothing was started)."""


def write_control(path: Path, value: str) -> None:
    """Write a kernel control file (cgroupfs): never created, a missing one is an error."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def open_log(path: Path) -> int:
    """A task's output file, created if new, appended to (an attempt after a retry or
    a migration continues the same file)."""
    return os.open(path, LOG_FLAGS, 0o666)


def open_logs(stdout: Path, stderr: Path, open_one: Callable[[Path], int] = open_log) -> OpenLogs:
    out = open_one(stdout)
    try:
        err = open_one(stderr)
    except OSError:
        os.close(out)
        raise
    return out, err


def close_logs(logs: OpenLogs) -> None:
    for fd in logs:
        os.close(fd)


def spawn_error(plan: ProcessPlan, e: BaseException, *, switched: bool = False) -> str:
    """Why a start failed, in the task's words. For a task run as another user the
    exec's own error is all there is to say: nothing is checked again as root (that
    would tell the user whether a file they cannot see exists)."""
    if isinstance(e, CgroupJoinError):
        return str(e)
    if switched and isinstance(e, OSError) and e.errno in (errno.ENOENT, errno.EACCES):
        what = "command not found" if e.errno == errno.ENOENT else "permission denied"
        return f"{what}: {plan.argv[0]}"
    if isinstance(e, FileNotFoundError):
        if e.filename == plan.cwd or (e.filename is None and not os.path.isdir(plan.cwd)):
            return f"working directory not found: {plan.cwd}"
        return f"command not found: {plan.argv[0]}"
    if isinstance(e, PermissionError):
        return f"permission denied: {e.filename or plan.argv[0]}"
    if isinstance(e, NotADirectoryError):
        return f"working directory is not a directory: {plan.cwd}"
    if isinstance(e, OSError) and e.errno == errno.E2BIG:
        return "argument list too long"
    if isinstance(e, subprocess.SubprocessError) and "preexec_fn" in str(e):
        return "cannot put the process in its cgroup or switch to its user"
    return f"cannot start process: {e}"
