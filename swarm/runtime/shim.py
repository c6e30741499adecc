"""swarm-shim: the per-task supervisor that outlives the agent (issue 19).

Why: a task started by the agent directly dies with it or, worse, ends while it is
down and is run again by recovery. The agent instead starts each task through
`swarm_shim.c` (small, libc only, compiled like swarm-exec: exechelper.py), which
holds the task, writes its exit status and end time durably into the task's state
directory, and is the "still running / exited N" a restarted agent asks. A restart
(an upgrade, a kill -9) then neither kills running tasks nor runs finished ones again.

The protocol, all of it (swarm_shim.c says the same from its side):

- The agent runs `swarm-shim REPORT_FD STATUS_DIR -- ARGV...` (`argv`) with
  Popen(start_new_session=True), exactly as it starts a task (environment, cwd,
  umask, stdin/stdout/stderr, the task's own pass_fds) plus REPORT_FD, the write end
  of a pipe, which the agent closes at once on its side.
- The shim forks the task into its own process group (pgid = the task's pid, which
  the agent signals as today: the shim is never in it) and writes one line on the
  pipe (`read_report`): `started <taskpid>`, `failed <errno> <strerror>` (the exec
  failed, as Popen would have) or `error <errno> <what>: <strerror>` (the shim could
  not: no status directory, no fork).
- Once the leader exits the shim SIGKILLs the rest of its group and writes
  STATUS_DIR/exit (`read_exit`): `pid`, `exit` or `signal`, `error` (a start that
  failed), `ended` (unix seconds with ns), then ends as the task did (its exit code,
  or death by its signal), so that a parent that finds no exit file (a full disk)
  still learns the end.
- A restarted agent finds the shim by the pid and create time it journaled (`alive`,
  `wait_exit`) and the result in the exit file. Neither depends on being the shim's
  parent. A shim that is gone without an exit file was SIGKILLed (or the host
  rebooted): the task's own pid is then the only handle left (executor.kill_orphan).

Security: the shim runs as the agent's user (root for a root agent, which starts a
task as its user through swarm-exec *under* the shim, so the switch happens below
it, never in it). It trusts nothing from the task: it reads nothing the task writes,
interprets no output, and its only input is its argv from the agent. The exit file
lives in the task's state directory, owned by the agent's user and not writable by
the task's user (a task of a non-root agent runs as the agent's user and could
forge it, or kill the shim, as it can already kill the agent: no boundary is lost),
and is created mode 0600 with O_NOFOLLOW. `read_exit` reads at most a few KiB and
refuses anything it does not understand rather than guess an exit code. The shim
ignores SIGTERM, SIGINT, SIGHUP and the like, so only SIGKILL (by the agent's user or
root) stops it early; the task itself is unaffected by that.

Each status directory must belong to one attempt: an `exit` left from an earlier
attempt would be read as this one's result (the agent removes it, or uses a fresh
directory, before the start).
"""

from __future__ import annotations

import errno as _errno
import os
from collections.abc import Sequence
from pathlib import Path

import attrs
import psutil
import trio

from . import proctime
from .exechelper import HelperUnavailable, build_program

__all__ = [
    "EXIT_FILE",
    "SOURCE",
    "ExitFileError",
    "ExitRecord",
    "HelperUnavailable",
    "Shim",
    "ShimStartError",
    "alive",
    "argv",
    "build",
    "read_exit",
    "read_report",
    "wait_exit",
]

SOURCE = Path(__file__).with_name("swarm_shim.c")
EXIT_FILE = "exit"
LEASE_FILE = "lease"  # --at-most-once: the deadline past which the shim kills the task
# A report line is "started <pid>" or "failed <errno> <strerror>": far below this
MAX_REPORT = 512
# The exit file is five short lines; anything much bigger is not one of ours
MAX_EXIT_FILE = 4096
# The shim reports once its child has exec'd (~1 ms); a slow exec (NFS, a loaded
# host) is still well inside this
REPORT_TIMEOUT = 30.0
POLL_INTERVAL = 0.05


class ShimStartError(Exception):
    """The task did not start. `exec_failed`: the shim's `failed` line, the exec's own
    error (`errno`, `strerror`), as Popen would have raised it. Otherwise the shim
    itself could not start it (its `error` line: `errno` set, e.g. no status
    directory), or said nothing usable (`errno` None)."""

    def __init__(
        self,
        message: str,
        errno: int | None = None,
        strerror: str = "",
        exec_failed: bool = False,
    ) -> None:
        super().__init__(message)
        self.errno = errno
        self.strerror = strerror
        self.exec_failed = exec_failed

    def as_oserror(self) -> OSError:
        """The error as Popen would have raised it (FileNotFoundError for errno 2, ...),
        for procstart.spawn_error, so that the task's message is the same either way.
        A failure of the shim's own keeps no errno there: a missing status directory
        must not read as "command not found"."""
        if not self.exec_failed or self.errno is None:
            return OSError(str(self))
        return OSError(self.errno, self.strerror or os.strerror(self.errno))


class ExitFileError(ValueError):
    """An exit file that is not one the shim writes: the reason, never a guess."""


@attrs.frozen
class ExitRecord:
    """What the shim recorded when the task's leader ended."""

    pid: int
    exit_code: int | None
    signal: int | None
    ended: float  # unix time (CLOCK_REALTIME), when the leader ended
    error: int | None = None  # errno: the task could not be started (exit_code 127)
    fenced: bool = False  # the shim killed it (or never started it): its lease lapsed

    @property
    def returncode(self) -> int:
        """Popen's convention: the exit code, or minus the signal that ended it."""
        if self.signal is not None:
            return -self.signal
        assert self.exit_code is not None
        return self.exit_code


def build(bin_dir: Path) -> Path:
    """The shim for this source, compiled into `bin_dir` (private to the agent's user)
    unless already there. Raises HelperUnavailable (no C compiler, a build error)."""
    return build_program(SOURCE, "swarm-shim", bin_dir, static=True)


def argv(shim: Path, report_fd: int, status_dir: Path, task_argv: Sequence[str]) -> list[str]:
    """The command line that starts `task_argv` under the shim. `report_fd` is the write
    end of a pipe that the Popen passes (pass_fds) and the agent then closes."""
    if report_fd < 3:
        raise ValueError("the report fd must not be 0, 1 or 2")
    if not task_argv:
        raise ValueError("no command")
    return [str(shim), str(report_fd), str(status_dir), "--", *task_argv]


async def read_report(fd: int, timeout: float = REPORT_TIMEOUT) -> int:
    """The task's pid from the shim's one-line report on `fd` (the read end of the
    report pipe, left open: the caller closes it). Raises ShimStartError when the task
    did not start, when the shim ended or went silent without a report (bounded by
    `timeout`), or when the line is not one the shim writes."""
    os.set_blocking(fd, False)
    buf = b""
    try:
        with trio.fail_after(timeout):
            while b"\n" not in buf:
                try:
                    chunk = os.read(fd, MAX_REPORT - len(buf))
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(fd)
                    continue
                if not chunk:
                    break
                buf += chunk
                if len(buf) >= MAX_REPORT:
                    break
    except trio.TooSlowError:
        raise ShimStartError(f"the shim sent no report within {timeout:g} s") from None
    except OSError as e:
        raise ShimStartError(f"cannot read the shim's report: {e}") from None
    line, newline, _ = buf.partition(b"\n")
    if not newline:
        what = "a truncated report" if buf else "no report"
        raise ShimStartError(f"the shim ended with {what}")
    return _parse_report(line)


def _parse_report(line: bytes) -> int:
    text = line.decode("utf-8", "replace")
    word, _, rest = text.partition(" ")
    if word == "started" and _digits(rest) and int(rest) > 0:
        return int(rest)
    code, _, strerror = rest.partition(" ")
    if word == "failed" and _digits(code):
        n = int(code)
        msg = strerror or os.strerror(n)
        raise ShimStartError(f"cannot start process: {msg}", n, msg, exec_failed=True)
    if word == "error" and _digits(code):
        n = int(code)
        msg = strerror or os.strerror(n)
        raise ShimStartError(f"swarm-shim: {msg}", n, msg)
    raise ShimStartError(f"the shim's report is not understood: {text[:80]!r}")


def _digits(s: str) -> bool:
    return s.isascii() and s.isdigit()


def read_exit(status_dir: Path) -> ExitRecord | None:
    """The task's end as the shim recorded it, or None while there is no exit file
    (still running, or the shim was killed first). Raises ExitFileError, with the
    reason, for a file the shim would not have written (never a guessed exit code)."""
    path = os.path.join(status_dir, EXIT_FILE)  # (os.path: pathlib's `/` is slow)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == _errno.ELOOP:
            raise ExitFileError(f"{path} is a symbolic link") from None
        raise ExitFileError(f"cannot read {path}: {e}") from None
    try:
        data = os.read(fd, MAX_EXIT_FILE + 1)
    except OSError as e:
        raise ExitFileError(f"cannot read {path}: {e}") from None
    finally:
        os.close(fd)
    try:
        return parse_exit(data)
    except ExitFileError as e:
        raise ExitFileError(f"{path}: {e}") from None


def parse_exit(data: bytes) -> ExitRecord:
    """An exit file's content (see the module docstring). Unknown keys are skipped: a
    newer shim, still running across an agent downgrade, may add some."""
    if len(data) > MAX_EXIT_FILE:
        raise ExitFileError("too large")
    if not data.endswith(b"\n"):
        raise ExitFileError("incomplete (no final newline)")
    fields: dict[str, str] = {}
    for raw in data[:-1].split(b"\n"):
        try:
            key, value = raw.decode("ascii").split(" ")
        except (UnicodeDecodeError, ValueError):
            raise ExitFileError(f"bad line {raw[:60]!r}") from None
        if key in fields:
            raise ExitFileError(f"{key} given twice")
        fields[key] = value
    for key in ("pid", "ended"):
        if key not in fields:
            raise ExitFileError(f"no {key}")
    if ("exit" in fields) == ("signal" in fields):
        raise ExitFileError("needs exactly one of exit and signal")
    pid = _int(fields, "pid", 0, 2**31 - 1)
    exit_code = _int(fields, "exit", 0, 255) if "exit" in fields else None
    signal = _int(fields, "signal", 1, 127) if "signal" in fields else None
    error = _int(fields, "error", 1, 4095) if "error" in fields else None
    whole, dot, frac = fields["ended"].partition(".")
    if not _digits(whole) or (dot and (not _digits(frac) or len(frac) > 9)):
        raise ExitFileError(f"bad ended {fields['ended'][:40]!r}")
    ended = int(whole) + (int(frac.ljust(9, "0")) / 1e9 if dot else 0.0)
    if fields.get("fenced", "1") != "1":
        raise ExitFileError(f"bad fenced {fields['fenced'][:40]!r}")
    return ExitRecord(pid, exit_code, signal, ended, error, fenced="fenced" in fields)


def write_lease(status_dir: Path, deadline: float) -> None:
    """Give (or move forward) the lease of the task in `status_dir`: its shim kills it
    once CLOCK_MONOTONIC (time.monotonic) passes `deadline`. A new file renamed over
    the old one, so that the shim never reads half of it; not synced (a reboot ends
    the task anyway, and the monotonic clock with it). Raises OSError."""
    tmp = status_dir / (LEASE_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b"%d\n" % max(0, int(deadline * 1e9)))
    finally:
        os.close(fd)
    os.replace(tmp, status_dir / LEASE_FILE)


def _int(fields: dict[str, str], key: str, low: int, high: int) -> int:
    value = fields[key]
    if not _digits(value) or not low <= int(value) <= high:
        raise ExitFileError(f"bad {key} {value[:40]!r}")
    return int(value)


def alive(shim_pid: int, create_time: float | None = None) -> bool:
    """Is the shim still there (running or stopped, not a zombie), and, given its
    create time as journaled (psutil's, like executor.same_process), is it still that
    process rather than a recycled pid? A zombie counts as ended: the agent that
    started it may not have reaped it yet, and an orphaned one may never be reaped
    where PID 1 does not reap (containers, sandboxes)."""
    try:
        p = psutil.Process(shim_pid)
        if create_time is not None and abs(p.create_time() - create_time) >= 0.5:
            return False
        return bool(p.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


async def wait_exit(shim_pid: int, create_time: float | None = None) -> None:
    """Return once the shim has ended. Works on a shim that is not our child (a
    restarted agent's case): a pidfd is readable once its process has exited, zombie
    or reaped, whoever its parent is. It does not reap: a parent still holding the
    Popen reaps it there. Without pidfds (kernel < 5.3), polls `alive`."""
    try:
        pidfd = os.pidfd_open(shim_pid)
    except ProcessLookupError:
        return
    except (OSError, AttributeError):
        pidfd = None
    if pidfd is None:
        while alive(shim_pid, create_time):
            await trio.sleep(POLL_INTERVAL)
        return
    try:
        # the pidfd pins the process: checked after opening it, a matching create time
        # means it is the journaled one (a mismatch: that one has ended)
        if not alive(shim_pid, create_time):
            return
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        trio.lowlevel.notify_closing(pidfd)
        os.close(pidfd)


@attrs.frozen
class Shim:
    """A running shim as the agent journals it: enough for a restarted agent to find
    it again and learn how its task ended."""

    pid: int  # the shim's
    create_time: float  # psutil's, to tell it from a recycled pid
    task_pid: int  # from the report; also the task's process group
    status_dir: Path

    @classmethod
    def started(cls, shim_pid: int, task_pid: int, status_dir: Path) -> Shim:
        """The handle for a shim just started (its create time read now)."""
        return cls(shim_pid, proctime.create_time(shim_pid), task_pid, status_dir)

    def alive(self) -> bool:
        return alive(self.pid, self.create_time)

    async def wait(self) -> ExitRecord | None:
        """The task's end once the shim has ended; None if the shim ended without
        writing it (SIGKILLed, or the disk refused): the task's fate is then unknown."""
        await wait_exit(self.pid, self.create_time)
        return read_exit(self.status_dir)
