#!/usr/bin/env python3
"""A stand-in for CRIU in tests, for hosts without a working CRIU (this kernel).

It speaks the part of CRIU's command line swarm uses and behaves like it from the
outside, except that it cannot save memory: `dump` records the process's command
line, environment and working directory in the image directory and kills the
process (as CRIU does after a dump); `restore --restore-detached --pidfile F` starts
that command again, detached, and writes its pid to F. So the agent's whole CRIU
path (detection, dump, streaming the image, the restore helper, exit status) runs
for real; only the program starts afresh instead of continuing where it was.

FAKE_CRIU_FAIL=restore (in the agent's environment) makes restores fail.
Installed as `criu` on PATH by the tests that use it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def opt(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def main(args: list[str]) -> int:
    if not args or args[0] in ("--version", "-V"):
        print("Version: 4.2\nGitID: fake")
        return 0
    cmd, rest = args[0], args[1:]
    if cmd == "check":
        print("Looks good.")
        return 0
    images = opt(rest, "-D") or "."
    if cmd == "dump":
        pid = int(opt(rest, "-t") or "0")
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode() for a in fh.read().split(b"\0") if a]
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = dict(kv.decode().split("=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
        cwd = os.readlink(f"/proc/{pid}/cwd")
        with open(os.path.join(images, "fake-image.json"), "w") as fh:
            json.dump({"argv": argv, "env": env, "cwd": cwd}, fh)
        os.kill(pid, signal.SIGKILL)
        return 0
    if cmd == "restore":
        if os.environ.get("FAKE_CRIU_FAIL") == "restore":
            print("fake criu: restore failed on purpose", file=sys.stderr)
            return 1
        with open(os.path.join(images, "fake-image.json")) as fh:
            image = json.load(fh)
        proc = subprocess.Popen(image["argv"], env=image["env"], cwd=image["cwd"])
        pidfile = opt(rest, "--pidfile")
        if pidfile:
            with open(pidfile, "w") as fh:
                fh.write(str(proc.pid))
        return 0  # detached: the restored process is re-parented to our parent's subreaper
    print(f"fake criu: unsupported command {cmd}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
