"""A process's start time, as psutil gives it (`Process(pid).create_time()`), for less.

The runner reads the create time of every task's supervisor when it starts (its
identity against a recycled pid, journaled with the pid). psutil builds a Process,
reads /proc/PID/stat and then /proc/stat for the boot time each time: ~42 us of CPU
per call here, two calls per start (issue 23). This reads /proc/PID/stat alone and
keeps the boot time for a second (it moves only when the wall clock is stepped, and
psutil's own reading is as old as its call). Same formula, same value: start ticks
since boot / CLK_TCK + boot time; psutil elsewhere (Linux only here).
"""

from __future__ import annotations

import os
import sys
import time

import psutil

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
BOOT_TIME_KEPT = 1.0  # seconds a boot time read is reused
_boot: tuple[float, float] = (-BOOT_TIME_KEPT - 1.0, 0.0)  # (monotonic read at, value)


def boot_time() -> float:
    global _boot
    now = time.monotonic()
    if now - _boot[0] >= BOOT_TIME_KEPT:
        _boot = (now, psutil.boot_time())
    return _boot[1]


def create_time(pid: int) -> float:
    """psutil's `Process(pid).create_time()`; psutil.NoSuchProcess when it is gone."""
    if not sys.platform.startswith("linux"):
        return float(psutil.Process(pid).create_time())
    try:
        # os.open/os.read: open() added a buffered reader and five system calls (fstat
        # twice, a tty check, two seeks) per read, on every task's start (issue 23)
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)  # a stat line is < 1 KiB; read at once, as procfs gives it
        finally:
            os.close(fd)
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    except PermissionError:  # /proc mounted hidepid: as psutil would say
        raise psutil.AccessDenied(pid) from None
    # fields after the command (which may hold spaces and parentheses): state is 3rd
    # of the whole line, starttime the 22nd
    rest = data[data.rindex(b")") + 2 :].split()
    return int(rest[19]) / CLK_TCK + boot_time()
