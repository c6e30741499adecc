"""Validation of client requests into model values (pure).

The submit socket hands each request's fields here; anything wrong becomes a
SchemaError whose message says which field and why, which the client shows as is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from . import codec, wire
from . import limits as lim
from . import model as m
from .policy.arrays import MAX_ELEMENTS, ArrayError, parse_array
from .policy.depends import DependencyError, parse_after

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")
MAX_ARGV_BYTES = lim.MAX_ARGV_BYTES


def _short(v: float) -> str:
    """A bad number as an error message shows it: never hundreds of digits."""
    if isinstance(v, int) and abs(v) >= 10**15:
        return f"a {v.bit_length()}-bit integer"
    return f"{v:.6g}" if isinstance(v, float) else str(v)


_ID_RULE = "starts with a letter or digit and holds at most 64 letters, digits, '_', '.', '-'"


def check_task_id(value: object) -> str:
    """A task id named in a request (any task's: generated, or namespaced)."""
    return _checked_id(value, m.valid_task_id(value), "", " (then '~owner' for a chosen id)")


def check_client_task_id(value: object) -> str:
    """An id a submitter chooses: never a path, never "." or "..", no owner part."""
    return _checked_id(value, m.valid_client_task_id(value), "submit: ", "")


def _checked_id(value: object, ok: bool, where: str, more: str) -> str:
    if not ok or not isinstance(value, str):
        raise wire.SchemaError(f"{where}invalid task id {value!r:.70}: an id {_ID_RULE}{more}")
    return value


def submit_spec(
    f: wire.Fields,
    *,
    uid: int,
    user: str | None,
    home: m.NodeId,
    now: float,
    classes: Mapping[str, int] | None = None,
    default_class: str = "normal",
    default_group: str = "",
    array_max: int = MAX_ELEMENTS,
) -> m.TaskSpec:
    """Build the TaskSpec of a submit request. The caller's identity is not the client's
    say. `classes` are the priority classes (name -> value); the class and group are
    data checked here by name; who may use them is the caller's check."""
    argv = f.str_list("argv", required=True, max_items=65536)
    if not argv:
        raise wire.SchemaError("submit: argv must not be empty (give a command after --)")
    if any("\x00" in a for a in argv):
        raise wire.SchemaError("submit: argv must not contain NUL bytes")
    if sum(len(a) for a in argv) > MAX_ARGV_BYTES:
        raise wire.SchemaError("submit: argv longer than 1 MiB")
    task_id = f.str("id", None, max_len=256)
    if task_id is not None:
        # namespaced by its owner: no two users' chosen ids can ever be the same task
        task_id = m.owned_task_id(check_client_task_id(task_id), uid, user)
    else:
        task_id = m.new_task_id()
    env = f.str_map("env")
    for k, v in env.items():
        if not _ENV_KEY.match(k):
            raise wire.SchemaError(f"submit: invalid environment variable name {k!r:.70}")
        if "\x00" in v:
            raise wire.SchemaError(f"submit: environment variable {k} contains a NUL byte")
        if k.startswith("SWARM_"):
            raise wire.SchemaError(
                f"submit: {k} is reserved (SWARM_* variables are set by the agent)"
            )
    labels = f.str_map("labels", max_items=64)
    for k in labels:
        if not _LABEL_KEY.match(k):
            raise wire.SchemaError(f"submit: invalid label name {k!r:.70}")
    cwd = f.str("cwd", None)
    if cwd is not None and not cwd.startswith("/"):
        raise wire.SchemaError(f"submit: cwd must be an absolute path, got {cwd!r:.70}")
    weight = f.float("weight", 1.0)
    if not 0.0 < weight <= lim.MAX_WEIGHT:
        raise wire.SchemaError(f"submit: weight must be > 0 and <= 1e6, got {_short(weight)}")
    reserve = f.int("reserve_shares", 0)
    if reserve < 0 or reserve > lim.MAX_RESERVE_SHARES:
        raise wire.SchemaError(
            f"submit: reserve_shares must be 0 to {lim.MAX_RESERVE_SHARES}, got {_short(reserve)}"
        )
    cpu = f.float("cpu", None)
    if cpu is not None and not 0 < cpu <= lim.MAX_CPU:
        raise wire.SchemaError(f"submit: cpu must be > 0 and <= 1e5 cores, got {_short(cpu)}")
    mem = f.int("mem", None)
    if mem is not None and not 0 < mem <= lim.MAX_MEM:
        raise wire.SchemaError(f"submit: mem must be > 0 and <= 1 EiB, got {_short(mem)} bytes")
    gpu = f.nested("gpu", codec.gpu_request_from_wire)
    if gpu is not None:
        from .policy import gpu as gpupol

        try:
            gpupol.validate(gpu)
        except gpupol.GpuRequestError as e:
            raise wire.SchemaError(f"submit: invalid GPU request: {e}") from None
    migrate = f.enum("migrate", m.MigrateMode, m.MigrateMode.NEVER)
    expected = f.float("expected_runtime", None)
    if expected is not None and not 0 < expected <= lim.MAX_EXPECTED_RUNTIME:
        raise wire.SchemaError("submit: expected_runtime must be > 0 and <= 1e9 seconds")
    classes = classes if classes is not None else {"normal": m.DEFAULT_PRIORITY}
    pclass = f.str("priority", None, max_len=64) or default_class
    priority = classes.get(pclass)
    if priority is None:
        raise wire.SchemaError(
            f"submit: unknown priority class {pclass!r:.70} (one of {', '.join(classes)})"
        )
    group = f.str("group", None, max_len=64) or default_group
    if group and not m.valid_group_name(group):
        raise wire.SchemaError(f"submit: invalid group {group!r:.70}: a group name {m.GROUP_RULE}")
    where = _where(f, is_global=f.bool("is_global", False))
    spec = m.TaskSpec(
        id=task_id,
        argv=tuple(argv),
        name=f.str("name", "", max_len=256),
        env=env,
        cwd=cwd,
        weight=weight,
        reserve_shares=reserve,
        is_global=f.bool("is_global", False),
        labels=labels,
        uid=uid,
        user=user,
        no_retry=f.bool("no_retry", False),
        cpu=cpu,
        mem=mem,
        gpu=gpu,
        migrate=migrate,
        expected_runtime=expected,
        submitted_at=now,
        home=home,
        priority=priority,
        group=group,
        **where,
        at_most_once=f.bool("at_most_once", False),
        gang=f.nested("gang", lambda o: codec.gang_request_from_wire(o, "submit: gang")),
        array=_array(f.str("array", None, max_len=4096), array_max),
        after=_after(f.str_list("after", max_items=64)),
        idempotent=f.bool("idempotent", False),
    )
    f.done()
    if spec.gang is not None:
        _check_gang(spec)
    if spec.array:
        _check_array(spec)
    if spec.at_most_once and spec.is_global:
        raise wire.SchemaError(
            "submit: at_most_once does not apply to a global task (one copy runs on every node)"
        )
    if spec.idempotent and (spec.at_most_once or spec.is_global or spec.gang is not None):
        what = "--at-most-once" if spec.at_most_once else "--global" if spec.is_global else "--gang"
        raise wire.SchemaError(
            f"submit: --idempotent (it may run twice, as a backup) does not combine with {what}"
        )
    return spec


MAX_GANG_ID = 50  # a member's id adds ".RANK" (and ".RUN") to the gang's
MAX_ARRAY_ID = 53  # an element's id adds "_INDEX" (at most 11 characters)


def _array(text: str | None, array_max: int) -> str:
    if text is None:
        return ""
    try:
        return parse_array(text, max_elements=array_max).text()
    except ArrayError as e:
        raise wire.SchemaError(f"submit: {e}") from None


def _after(clauses: list[str]) -> tuple[str, ...]:
    """`--after` clauses, checked for form (the submit resolves and checks the ids)."""
    try:
        return tuple(a.text() for a in parse_after(clauses))
    except DependencyError as e:
        raise wire.SchemaError(f"submit: {e}") from None


def _check_array(spec: m.TaskSpec) -> None:
    """What an array may not combine with, one line naming the field."""
    if spec.is_global or spec.gang is not None:
        what = "--global" if spec.is_global else "--gang"
        raise wire.SchemaError(f"submit: --array does not combine with {what}")
    if len(spec.id.split("~")[0]) > MAX_ARRAY_ID:
        raise wire.SchemaError(f"submit: an array's id may hold at most {MAX_ARRAY_ID} characters")


def _check_gang(spec: m.TaskSpec) -> None:
    """What a gang may not combine with, one line naming the field."""
    if spec.is_global:
        raise wire.SchemaError("submit: --gang does not combine with --global")
    if spec.at_most_once:
        raise wire.SchemaError(
            "submit: --gang members run under their gang's lease already: no --at-most-once"
        )
    if spec.migrate is not m.MigrateMode.NEVER:
        raise wire.SchemaError("submit: a gang's members never migrate: no --migrate")
    if len(spec.id.split("~")[0]) > MAX_GANG_ID:
        raise wire.SchemaError(f"submit: a gang's id may hold at most {MAX_GANG_ID} characters")


_WHERE_KEYS = ("constraints", "prefer", "job", "spread", "anti_affinity", "data", "cwd_any")


def _where(f: wire.Fields, *, is_global: bool) -> dict[str, Any]:
    """Issue 21's submit fields, each checked with one line naming it (none given, the
    common case: nothing to read)."""
    if not any(f.obj.get(k) is not None for k in _WHERE_KEYS):
        return {}
    out = codec.where_from_wire(f, "submit")
    if is_global and (out["constraints"] or out["prefer"]):
        raise wire.SchemaError("submit: a global task runs on every node: no --constraint/--prefer")
    if (out["spread"] or out["anti_affinity"]) and not out["job"]:
        raise wire.SchemaError("submit: --spread and --anti-affinity work within a --job: name one")
    return out
