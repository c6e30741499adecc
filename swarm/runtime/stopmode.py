"""Does a stopping agent leave its tasks running (issue 19)?

Tasks run under their supervisor (runtime/shim.py) and outlive the agent, so a stop
has a choice: end them (a stop: the operator wants the host's work gone) or leave
them to the next run of the agent (a restart: an upgrade, a changed config), which
re-attaches to them. The `keep-tasks` option says which:

- `restart` (default): leave them when systemd is restarting the agent's unit (a
  `restart` job for the unit is running: `systemctl restart`, or `Restart=` after a
  crash is not this case: the agent is gone then anyway), end them on any other stop;
- `always`: leave them on every stop (`systemctl stop` too; end them with
  `swarm cancel`, or by stopping with `keep-tasks = "never"`);
- `never`: end them on every stop (before issue 19's behaviour, minus the re-run).

The unit must say `KillMode=process` (deploy/swarm-agent.service): with systemd's
default, a stop or restart kills the whole cgroup, supervisors and tasks included.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

MODES = ("restart", "always", "never")
SYSTEMCTL_TIMEOUT = 3.0


def keep_tasks(mode: str) -> bool:
    if mode == "always":
        return True
    if mode == "never":
        return False
    return systemd_restarting()


def own_unit(cgroup_text: str) -> str | None:
    """The systemd service this process runs in, from /proc/self/cgroup's text."""
    for line in cgroup_text.splitlines():
        path = line.rpartition(":")[2]
        for part in reversed(path.split("/")):
            if part.endswith(".service"):
                return part
    return None


def restart_job(list_jobs: str, unit: str) -> bool:
    """Is there a `restart` job for `unit` in `systemctl list-jobs --no-legend
    --plain`'s output (columns: JOB UNIT TYPE STATE)?"""
    for line in list_jobs.splitlines():
        cols = line.split()
        if len(cols) >= 3 and cols[1] == unit and cols[2] in ("restart", "try-restart"):
            return True
    return False


def systemd_restarting() -> bool:
    """Under systemd (INVOCATION_ID set), with a restart job for our unit running."""
    if "INVOCATION_ID" not in os.environ:
        return False
    try:
        unit = own_unit(Path("/proc/self/cgroup").read_text())
    except OSError:
        return False
    if unit is None:
        return False
    try:
        out = subprocess.run(
            ["systemctl", "list-jobs", "--no-legend", "--plain"],
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT,
            stdin=subprocess.DEVNULL,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return restart_job(out, unit)
