"""A task's process plan: its command, environment, working directory and files
(the plan hooks then add its user, cgroups and GPU slice: agent.py)."""

from __future__ import annotations

import functools
import os
import pwd
from pathlib import Path

from .. import model as m
from .executor import ProcessPlan

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def task_plan(
    task: m.Task,
    node: m.NodeId,
    logs: tuple[Path, Path],
    state_dir: Path,
    status_dir: Path | None,
) -> ProcessPlan:
    """`state_dir`: $SWARM_STATE_DIR of a task that may move; `status_dir`: where its
    supervisor writes its end (None: no supervisor)."""
    spec = task.spec
    out, err = logs
    env = {"PATH": DEFAULT_PATH}
    user = _user_entry(spec)
    if user is not None:
        env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
    env.update(spec.env)
    env.update(
        SWARM_TASK_ID=task.id,
        SWARM_TASK_NAME=spec.name,
        SWARM_NODE=node,
        SWARM_HOME_NODE=spec.home or node,
        SWARM_ATTEMPT=str(task.attempts + 1),
    )
    if spec.migrate is not m.MigrateMode.NEVER:
        env["SWARM_STATE_DIR"] = str(state_dir)
    cwd = spec.cwd or (user.pw_dir if user else "/")
    if spec.cwd_any and not os.path.isdir(cwd):
        # --cwd-any: the submitter's directory does not exist on this host: fall back
        cwd = user.pw_dir if user and os.path.isdir(user.pw_dir) else "/"
    return ProcessPlan(
        task_id=task.id,
        argv=spec.argv,
        env=env,
        cwd=cwd,
        stdout=out,
        stderr=err,
        status_dir=status_dir,
    )


def _user_entry(spec: m.TaskSpec) -> pwd.struct_passwd | None:
    return _passwd(spec.user, spec.uid)


@functools.lru_cache(maxsize=1024)
def _passwd(user: str | None, uid: int | None) -> pwd.struct_passwd | None:
    """Cached: NSS lookups cost up to a millisecond, on every task start."""
    try:
        if user:
            return pwd.getpwnam(user)
        if uid is not None:
            return pwd.getpwuid(uid)
    except KeyError:
        return None
    return None
