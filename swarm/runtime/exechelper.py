"""swarm-exec: the small compiled helper that starts a task as its user.

Why a helper: a root agent must switch user *before* anything the submitter chose is
used (docs/security.md), and Python can do that only in a `preexec_fn`, which forks
the whole agent (5-6 ms per start on the build VM, against ~1.7 ms for a start that
keeps the vfork path). `swarm_exec.c` does the switch, the chdir and the exec after a
vfork, started with an empty environment, with the task's environment read from a
memfd.

It is compiled once per source version, at a root agent's start, into
/var/cache/swarm-exec/ (root-only, 0700) with the system C compiler. No
compiler, or a failed build: the agent says so once and uses the preexec path, which
is as safe and only slower.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("swarm_exec.c")
# One build per source version for all of a host's root agents (tests start hundreds)
CACHE_DIR = Path("/var/cache/swarm-exec")


class HelperUnavailable(Exception):
    """Why the helper cannot be used here (the agent falls back and logs this)."""


def build(bin_dir: Path) -> Path:
    """The helper for this source, compiled into `bin_dir` unless already there."""
    return build_program(SOURCE, "swarm-exec", bin_dir, static=True)


def build_program(source: Path, stem: str, bin_dir: Path, static: bool = False) -> Path:
    """One of the agent's small C programs (swarm-exec, swarm-shim), compiled into
    `bin_dir` as `STEM-HASH` unless already there: once per source version, in a
    private directory of the agent's user, never trusting a file someone else could
    have changed. Raises HelperUnavailable saying why it cannot.

    `static`: linked statically where the C library allows it (libc.a), else as
    usual; both programs use no NSS function (names are resolved by the agent). The
    dynamic loader's relocations and its CPU-feature probe (cpuid, which traps to the
    hypervisor in a VM) were ~0.2 ms of every task's start under swarm-shim (stop 51),
    and swarm-exec adds one more exec to a start. The name hashes the kind too."""
    try:
        src = source.read_bytes()
    except OSError as e:
        raise HelperUnavailable(f"cannot read {source}: {e}") from None
    kind = b"\0static" if static else b""
    out = bin_dir / f"{stem}-{hashlib.sha256(src + kind).hexdigest()[:16]}"
    try:
        bin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(bin_dir)
    except OSError as e:
        raise HelperUnavailable(f"cannot make {bin_dir}: {e}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise HelperUnavailable(f"{bin_dir} is not a private directory of the agent's user")
    if _trusted(out):
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise HelperUnavailable("no C compiler (cc) to build it")
    tmp = bin_dir / f".{out.name}.{os.getpid()}"
    try:
        r = _compile(cc, source, tmp, static)
        if r.returncode != 0 and static:  # no static C library here: as usual
            r = _compile(cc, source, tmp, False)
        if r.returncode != 0:
            raise HelperUnavailable(f"{cc} failed: {r.stderr.strip()[-400:]}")
        os.chmod(tmp, 0o700)
        os.rename(tmp, out)
    except (OSError, subprocess.SubprocessError) as e:
        raise HelperUnavailable(f"cannot build it: {e}") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return out


def _compile(cc: str, source: Path, out: Path, static: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [cc, "-O2", *(["-static"] if static else []), "-o", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
    )


def _trusted(path: Path) -> bool:
    """A regular file of the agent's user that nobody else can change."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
