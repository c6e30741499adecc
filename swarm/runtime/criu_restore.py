"""Restore a CRIU image as a swarm task's process (run by the agent's runner).

The runner waits for its own child and records that child's exit status as the
task's. `criu restore` in the foreground discards the restored task's status, so
this helper makes itself a child subreaper, restores detached (the restored root
is re-parented to it when CRIU exits), waits for that root and exits with its
status. If the restore fails it starts the task afresh from its command, as the
task's user: the task's work since its start is lost, the task itself is not.

Standard library only, run by path (it must not depend on the agent's imports).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def _fallback(a: argparse.Namespace, why: str) -> int:
    print(
        f"swarm: CRIU restore failed ({why}); starting the task from its command", file=sys.stderr
    )
    if not a.fallback:
        return 1
    try:
        os.chdir(a.cwd)
    except OSError:
        os.chdir("/")
    if a.gid is not None:
        os.setgroups([])
        os.setregid(a.gid, a.gid)
    if a.uid is not None:
        os.setreuid(a.uid, a.uid)
    try:
        os.execvp(a.fallback[0], a.fallback)
    except OSError as e:
        print(f"swarm: cannot start {a.fallback[0]}: {e}", file=sys.stderr)
    return 127


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="criu_restore")
    p.add_argument("--criu", required=True)
    p.add_argument("--images", required=True)
    p.add_argument("--cwd", default="/")
    p.add_argument("--inherit", action="append", default=[])
    p.add_argument("--uid", type=int)
    p.add_argument("--gid", type=int)
    p.add_argument("fallback", nargs="*")
    a = p.parse_args(argv)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return _fallback(a, "cannot become a child subreaper")
    pidfile = os.path.join(a.images, "restored.pid")
    try:
        os.unlink(pidfile)
    except OSError:
        pass
    cmd = [a.criu, "restore", "-D", a.images, "-o", "restore.log", "--shell-job"]
    cmd += ["--restore-detached", "--pidfile", pidfile]
    for res in a.inherit:
        cmd += ["--inherit-fd", res]
    try:
        rc = subprocess.call(cmd)
    except OSError as e:
        return _fallback(a, str(e))
    pid = _read_pid(pidfile)
    if rc != 0 or pid is None:
        return _fallback(a, f"criu exited {rc}")
    while True:
        try:
            wpid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            print("swarm: the restored task vanished", file=sys.stderr)
            return 1
        except InterruptedError:
            continue
        if wpid != pid:
            continue  # an orphan of the restored tree, re-parented to us
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return 128 + sig
        return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
