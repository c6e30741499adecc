"""Run one attempt of an operator's scale hook (issue 25, elastic fleets).

The autoscaler asks the outside world for more or fewer machines by running the
commands an operator configured (`scale-out-command`, `scale-in-command` in the
root-owned agent.toml: a cloud CLI, a Terraform apply, a script). This module is the
one place such a command is started, so that every attempt is bounded the same way:
in time (a timeout, after which the whole process group gets SIGTERM and, 2 s later,
SIGKILL, and the shell is reaped), in memory (only the last MAX_OUTPUT bytes of its
merged stdout and stderr are kept, however much it prints) and in what it inherits
(stdin is /dev/null, no descriptor of the agent's, a minimal environment).

Security. The command is the operator's, from a file only root can write, and runs
as the agent's user (root) through `/bin/sh -c`, so that it may use pipes and
redirections; nothing else is ever part of the command string. What the autoscaler
knows at the time (pool name, counts, node names) goes to the hook only as
environment values, checked here (names [A-Z_][A-Z0-9_]*, not one that changes how
the shell or the loader behaves; no NUL in values) and never interpolated, so a
value full of shell syntax reaches the hook as those bytes and runs nothing; a hook
that passes them on unquoted (`eval`, `$NODES` in a command line) is the operator's
to get right. The child does not see the agent's own environment (key paths and
other SWARM_* settings stay out) nor its open files.

- A local user without root cannot choose the command, its environment or when it
  runs, except by making the agent busy or idle as any user of the fleet can.
- A key holder (any node of the fleet, or whoever has its key) can gossip false
  load reports, and so make the autoscaler run the scale-out hook, or the scale-in
  hook with node names it chose (names of real nodes, or made up within the name
  rules). What the hook does with those names is the operator's script: it should
  check them against its own inventory before deleting anything. The key holder
  still cannot run a command of its own: the names arrive as environment values.
- A network attacker without the key cannot get a report accepted, so cannot reach
  this at all.

Limits: a process of the hook that leaves its process group (setsid, a daemon) is
not killed on timeout; and a hook that exits on its own while something it started
in the background still runs is over when its shell exits: output after that (past
a short grace) is dropped and the background process is left alone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable, Mapping

import attrs
import trio

__all__ = ["KILL_GRACE", "MAX_OUTPUT", "HookResult", "hook_env", "run_hook"]

MAX_OUTPUT = 4096  # bytes of merged stdout+stderr kept, the last ones
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL to the hook's process group
DRAIN_GRACE = 0.2  # after the shell exits: how long to wait for the pipe's end
_READ_CHUNK = 65536

_BASE_ENV_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")
# Names a value must not set: the base itself, and those that make a shell or the
# dynamic loader run or load something chosen by whoever chose the value.
_RESERVED = frozenset(
    {"PATH", "HOME", "LANG", "IFS", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4"}
)


@attrs.frozen
class HookResult:
    ok: bool  # exit status 0 within the timeout
    rc: int | None  # exit status (-N: killed by signal N); None: not started, or timed out
    output: str  # the last MAX_OUTPUT bytes of stdout+stderr, "…" in front when cut
    duration: float  # seconds, by the clock run_hook was given
    error: str  # "" when ok, else one line for the operator


def hook_env(env: Mapping[str, str]) -> dict[str, str]:
    """The child's whole environment: a minimal base plus `env`. ValueError naming
    the key when a name or a value is not one to pass."""
    out = {
        "PATH": _BASE_ENV_PATH,
        "LANG": "C.UTF-8",
        "HOME": os.environ.get("HOME") or "/",
    }
    for key, value in env.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"hook environment: bad name {key!r}")
        if key in _RESERVED or key.startswith("LD_"):
            raise ValueError(f"hook environment: {key} may not be set")
        if not isinstance(value, str):
            raise ValueError(f"hook environment: {key} is not a string")
        if "\0" in value:
            raise ValueError(f"hook environment: {key} contains a NUL byte")
        out[key] = value
    return out


async def run_hook(
    command: str,
    env: Mapping[str, str],
    timeout: float,
    *,
    now: Callable[[], float] = trio.current_time,
    cwd: str = "/",
) -> HookResult:
    """Run `command` once with `/bin/sh -c`, `env` in its environment only, for at
    most `timeout` seconds. ValueError for a bad `env` or timeout; on cancellation
    the hook's process group is killed and reaped, then Cancelled goes on."""
    child_env = hook_env(env)
    if not timeout > 0:
        raise ValueError(f"hook timeout must be positive, not {timeout!r}")
    t0 = now()
    try:
        proc = await trio.lowlevel.open_process(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    except (OSError, ValueError) as e:  # ValueError: a NUL in the command or cwd
        return HookResult(False, None, "", now() - t0, _one_line(f"could not start: {e}"))
    tail = _Tail(MAX_OUTPUT)
    timed_out = False
    try:
        with trio.move_on_after(timeout):
            await _collect(proc, tail)
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:  # timeout, cancellation, or an error here
                timed_out = True
                await _kill_group(proc)
            assert proc.stdout is not None
            await proc.stdout.aclose()
    duration = now() - t0
    output = tail.text()
    if timed_out:
        return HookResult(False, None, output, duration, f"timed out after {timeout:g} s")
    rc = proc.returncode
    assert rc is not None
    if rc == 0:
        return HookResult(True, 0, output, duration, "")
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return HookResult(False, rc, output, duration, f"killed by {name}")
    return HookResult(False, rc, output, duration, f"exit status {rc}")


class _Tail:
    """The last `limit` bytes written, in at most limit + one read of memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.cut = False

    def add(self, data: bytes | bytearray) -> None:
        self.buf += data
        if len(self.buf) > self.limit:
            del self.buf[: len(self.buf) - self.limit]
            self.cut = True

    def text(self) -> str:
        data = bytes(self.buf)
        if not self.cut:
            return data.decode("utf-8", errors="replace")
        # don't start with the broken end of a character the cut went through
        skip = 0
        while skip < min(3, len(data)) and 0x80 <= data[skip] <= 0xBF:
            skip += 1
        return "…" + data[skip:].decode("utf-8", errors="replace")


async def _collect(proc: trio.Process, tail: _Tail) -> None:
    """Read the merged output into `tail` until the shell has exited and the pipe
    is at its end (or DRAIN_GRACE has passed: a background process holds it)."""
    stream = proc.stdout
    assert stream is not None
    eof = trio.Event()

    async def pump() -> None:
        while data := await stream.receive_some(_READ_CHUNK):
            tail.add(data)
        eof.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump)
        await proc.wait()
        with trio.move_on_after(DRAIN_GRACE):
            await eof.wait()
        nursery.cancel_scope.cancel()


async def _kill_group(proc: trio.Process) -> None:
    """SIGTERM the hook's process group, SIGKILL what is left of it after
    KILL_GRACE, and reap the shell."""
    pgid = proc.pid  # start_new_session: the shell leads its own group
    _signal_group(pgid, signal.SIGTERM)
    with trio.move_on_after(KILL_GRACE):
        await proc.wait()
        while await trio.to_thread.run_sync(_group_running, pgid):
            await trio.sleep(0.05)
        return
    _signal_group(pgid, signal.SIGKILL)
    await proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_running(pgid: int) -> bool:
    """Is a process of group `pgid` still running? Zombies don't count: an orphan is
    init's to reap, and some inits (in containers) never do, which would hold the
    group (and kill(2) on it succeeding) forever."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold anything, so split after it
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _one_line(text: str) -> str:
    return " ".join(text.split())
