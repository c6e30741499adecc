"""CRIU for `--migrate=criu`: detection at start-up, dump on the source, restore argv.

CRIU is optional. A node reports `criu` in its load report only when a CRIU of at
least MIN_VERSION is installed, the agent runs as root, and `criu check` passes;
older versions fail on current kernels (3.17's vDSO bug, fixed in 4.1), so a
version that merely exists is not enough. Where CRIU is missing, criu tasks are
never moved from or to the node, and `swarm explain` says why.

The dump kills the task's process tree once its image is written (the image lives
in the task's state directory, `CRIU_DIR`, and travels with the rest of it). On the
target the task's process is `criu_restore.py`, a small helper that becomes a child
subreaper, restores the image detached, waits for the restored root and exits with
its status, so the runner sees the task's own exit code; if the restore fails it
starts the task afresh from its command (work is lost, the task is not).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import trio

MIN_VERSION = (4, 1, 0)
CRIU_DIR = ".criu"  # the image directory inside the task's state directory
HELPER = Path(__file__).with_name("criu_restore.py")

_VERSION_RE = re.compile(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?")


@attrs.frozen
class CriuStatus:
    ok: bool
    reason: str  # why not (or "CRIU x.y works" when ok)
    version: str = ""
    path: str = ""


def parse_version(text: str) -> tuple[int, int, int] | None:
    """`criu --version` prints "Version: 4.1" (maybe with a patch level and a GitID)."""
    mt = _VERSION_RE.search(text)
    if mt is None:
        return None
    return int(mt.group(1)), int(mt.group(2)), int(mt.group(3) or 0)


def judge(version_text: str, check_rc: int | None, check_out: str) -> tuple[bool, str, str]:
    """(usable, reason, version) from `criu --version` and `criu check` results."""
    v = parse_version(version_text)
    if v is None:
        return False, "cannot read the CRIU version", ""
    shown = ".".join(map(str, v))
    if v < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION[:2]))
        return False, f"CRIU {shown} is older than {need} (fails on current kernels)", shown
    if check_rc != 0:
        last = [ln for ln in check_out.strip().splitlines() if ln.strip()]
        why = last[-1].strip() if last else f"exit {check_rc}"
        return False, f"`criu check` failed: {why[:200]}", shown
    return True, f"CRIU {shown} works", shown


async def detect(binary: str = "criu", timeout: float = 20.0) -> CriuStatus:
    """Is a working CRIU usable by this agent? Never raises."""
    path = shutil.which(binary)
    if path is None:
        return CriuStatus(False, "CRIU is not installed")
    if os.geteuid() != 0:
        return CriuStatus(False, "CRIU needs the agent to run as root", path=path)
    try:
        with trio.fail_after(timeout):
            ver = await trio.run_process([path, "--version"], capture_stdout=True, check=False)
            check = await trio.run_process(
                [path, "check"], capture_stdout=True, capture_stderr=True, check=False
            )
    except (OSError, trio.TooSlowError) as e:
        return CriuStatus(False, f"cannot run CRIU: {e}", path=path)
    out = (check.stdout or b"").decode(errors="replace") + (check.stderr or b"").decode(
        errors="replace"
    )
    ok, reason, shown = judge((ver.stdout or b"").decode(errors="replace"), check.returncode, out)
    return CriuStatus(ok, reason, shown, path)


def dump_argv(criu: str, pid: int, images: Path) -> list[str]:
    """Dump the tree rooted at `pid` into `images` and kill it (no --leave-running).

    --shell-job: the task is a session leader started by the agent; on restore it
    joins the helper's session and process group, so the runner's group kill and
    the executor's clean-up reach the restored tree."""
    return [criu, "dump", "-t", str(pid), "-D", str(images), "-o", "dump.log", "--shell-job"]


def restore_argv(
    criu: str,
    images: Path,
    files: Mapping[str, str],
    fallback: Sequence[str],
    *,
    uid: int | None,
    gid: int | None,
    cwd: str,
) -> list[str]:
    """The task's argv on the target: the restore helper, then the fallback command.

    `files` maps a descriptor number to the path it had on the source (stdout and
    stderr are the agent's log files, which live elsewhere on this node): the helper
    hands its own descriptors to CRIU for them (--inherit-fd)."""
    argv = [sys.executable, str(HELPER), "--criu", criu, "--images", str(images), "--cwd", cwd]
    for fd, path in sorted(files.items()):
        argv += ["--inherit", f"fd[{int(fd)}]:{path.lstrip('/')}"]
    if uid is not None:
        argv += ["--uid", str(uid)]
    if gid is not None:
        argv += ["--gid", str(gid)]
    return [*argv, "--", *fallback]
