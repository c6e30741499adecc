"""Codecs between model values and the msgpack-able maps that travel in frames.

Decoders are strict (unknown fields rejected, types and ranges checked) and raise
only swarm.wire.WireError subclasses.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from . import limits as lim
from . import model as m
from .model import GROUP_RULE, MAX_PRIORITY, valid_group_name
from .policy import arrays, depends
from .policy.constraints import (
    JOB_RULE,
    KEY_RULE,
    MAX_CONSTRAINTS,
    MAX_LABELS,
    ConstraintError,
    check_labels,
    parse_constraint,
    valid_job_name,
    valid_label_key,
)
from .policy.datakeys import DATA_KEY_RULE, DIGEST_BYTES, valid_data_key
from .wire import Fields, SchemaError


def gpu_request_to_wire(g: m.GpuRequest) -> dict[str, Any]:
    return {"core": g.core, "memory_bytes": g.memory_bytes, "memory_ratio": g.memory_ratio}


def gpu_request_from_wire(obj: Any) -> m.GpuRequest:
    f = Fields(obj, "gpu")
    g = m.GpuRequest(
        core=f.int("core", required=True, lo=0, hi=100 * 1024),
        memory_bytes=f.int("memory_bytes", lo=0),
        memory_ratio=f.int("memory_ratio", lo=0, hi=100 * 1024),
    )
    f.done()
    return g


SPEC_CACHE = 8192  # recently encoded specs whose wire form is kept


_spec_wire: dict[int, tuple[m.TaskSpec, dict[str, Any]]] = {}


def task_spec_to_wire(s: m.TaskSpec) -> dict[str, Any]:
    """A spec's wire form. Specs are immutable and one spec is encoded many times on
    its way (the offer, the home's and the guest's handoff entries, its records), so
    the forms of the last SPEC_CACHE specs are kept, by identity (the entry holds the
    spec, so its id cannot be reused meanwhile). Callers must not modify the result."""
    hit = _spec_wire.get(id(s))
    if hit is not None and hit[0] is s:
        return hit[1]
    d = _spec_to_wire(s)
    _spec_wire[id(s)] = (s, d)
    if len(_spec_wire) > SPEC_CACHE:
        del _spec_wire[next(iter(_spec_wire))]
    return d


def _spec_to_wire(s: m.TaskSpec) -> dict[str, Any]:
    return {
        "id": s.id,
        "argv": list(s.argv),
        "name": s.name,
        "env": dict(s.env),
        "cwd": s.cwd,
        "weight": s.weight,
        "reserve_shares": s.reserve_shares,
        "is_global": s.is_global,
        "labels": dict(s.labels),
        "uid": s.uid,
        "user": s.user,
        "no_retry": s.no_retry,
        "cpu": s.cpu,
        "mem": s.mem,
        "gpu": None if s.gpu is None else gpu_request_to_wire(s.gpu),
        "migrate": s.migrate.value,
        "expected_runtime": s.expected_runtime,
        "submitted_at": s.submitted_at,
        "home": s.home,
        "priority": s.priority,
        "group": s.group,
        # issue 21's fields travel only when set, so an agent that predates them still
        # reads every task that does not use them
        **{k: v for k, v in _where_to_wire(s).items() if v},
        **({"at_most_once": True} if s.at_most_once else {}),
        **({"gang": attrs.asdict(s.gang)} if s.gang is not None else {}),
        **({"member": attrs.asdict(s.member)} if s.member is not None else {}),
        **({"array": s.array} if s.array else {}),
        **({"after": list(s.after)} if s.after else {}),
        **({"element": attrs.asdict(s.element)} if s.element is not None else {}),
        **({"idempotent": True} if s.idempotent else {}),
        **({"backup_of": s.backup_of} if s.backup_of else {}),
    }


def _where_to_wire(s: m.TaskSpec) -> dict[str, Any]:
    return {
        "constraints": list(s.constraints),
        "prefer": list(s.prefer),
        "job": s.job,
        "spread": s.spread,
        "anti_affinity": s.anti_affinity,
        "data": list(s.data),
        "cwd_any": s.cwd_any,
    }


def task_spec_from_wire(obj: Any) -> m.TaskSpec:
    f = Fields(obj, "task")
    argv = f.str_list("argv", required=True, max_items=65536)
    if not argv:
        raise SchemaError("task: argv must not be empty")
    spec = m.TaskSpec(
        id=f.task_id("id", required=True),
        argv=tuple(argv),
        name=f.str("name", ""),
        env=f.str_map("env"),
        cwd=f.str("cwd"),
        weight=f.float("weight", 1.0, lo=0.0, hi=1e6),
        reserve_shares=f.int("reserve_shares", 0, lo=0, hi=1 << 31),
        is_global=f.bool("is_global", False),
        labels=f.str_map("labels"),
        uid=f.int("uid", lo=0, hi=(1 << 32) - 1),
        user=f.str("user"),
        no_retry=f.bool("no_retry", False),
        cpu=f.float("cpu", lo=0.0, hi=1e6),
        mem=f.int("mem", lo=0),
        gpu=f.nested("gpu", gpu_request_from_wire),
        migrate=f.enum("migrate", m.MigrateMode, m.MigrateMode.NEVER),
        expected_runtime=f.float("expected_runtime", lo=0.0),
        submitted_at=f.float("submitted_at", 0.0),
        home=f.str("home", ""),
        priority=f.int("priority", m.DEFAULT_PRIORITY, lo=-MAX_PRIORITY, hi=MAX_PRIORITY),
        group=group_name(f.str("group", "", max_len=64), "task"),
        **where_from_wire(f, "task"),
        at_most_once=f.bool("at_most_once", False),
        gang=f.nested("gang", gang_request_from_wire),
        member=f.nested("member", gang_role_from_wire),
        array=_array_text(f.str("array", "", max_len=4096), "task"),
        element=f.nested("element", array_role_from_wire),
        after=_after(f.str_list("after", max_items=64), "task"),
        idempotent=f.bool("idempotent", False),
        backup_of=f.task_id("backup_of", "") or "",
    )
    f.done()
    return spec


GANG_MODES = ("strict", "nonstrict")
MAX_GANG = 4096  # members of one gang (cluster/gang.py's MAX_GANG)


def gang_request_from_wire(obj: Any, what: str = "gang") -> m.GangRequest:
    """A gang's request, each field checked with one line naming it."""
    f = Fields(obj, what)
    size = f.int("size", required=True)
    if not 1 <= size <= MAX_GANG:
        raise SchemaError(f"{what}: size must be 1..{MAX_GANG}, got {size}")
    mode = f.str("mode", "strict", max_len=16)
    if mode not in GANG_MODES:
        raise SchemaError(f"{what}: mode must be strict or nonstrict, got {mode!r:.20}")
    least = f.int("min_available", 0)
    if mode == "nonstrict" and not 1 <= least <= size:
        raise SchemaError(f"{what}: min-available must be 1..{size} (the gang's size), got {least}")
    if mode == "strict" and least not in (0, size):
        raise SchemaError(f"{what}: min-available applies to --gang-mode nonstrict only")
    g = m.GangRequest(
        size=size,
        mode=mode,
        min_available=least,
        restart=f.bool("restart", False),
        timeout=f.float("timeout", 0.0, lo=0.0, hi=1e9),
    )
    f.done()
    return g


def _array_text(text: str, what: str) -> str:
    """An array's `--array` text, in canonical form ('' for none)."""
    if not text:
        return ""
    try:
        # a stored record is read back whatever the node's array-max is now
        return arrays.parse_array(text, max_elements=arrays.MAX_INDEX + 1).text()
    except arrays.ArrayError as e:
        raise SchemaError(f"{what}: {e}") from None


def _after(clauses: list[str], what: str) -> tuple[str, ...]:
    """`--after` clauses, each checked (policy/depends.py), in canonical form."""
    try:
        return tuple(a.text() for a in depends.parse_after(clauses))
    except depends.DependencyError as e:
        raise SchemaError(f"{what}: {e}") from None


def array_role_from_wire(obj: Any) -> m.ArrayRole:
    f = Fields(obj, "element")
    r = m.ArrayRole(
        array=f.task_id("array", required=True),
        index=f.int("index", required=True, lo=0, hi=arrays.MAX_INDEX),
    )
    f.done()
    return r


def gang_role_from_wire(obj: Any) -> m.GangRole:
    f = Fields(obj, "member")
    r = m.GangRole(
        gang=f.task_id("gang", required=True),
        home=f.str("home", required=True, max_len=256),
        round=f.int("round", required=True, lo=1),
        slot=f.int("slot", required=True, lo=0, hi=MAX_GANG - 1),
        rank=f.int("rank", required=True, lo=0, hi=MAX_GANG - 1),
        world=f.int("world", required=True, lo=1, hi=MAX_GANG),
    )
    f.done()
    return r


def where_from_wire(f: Fields, what: str) -> dict[str, Any]:
    """Issue 21's task fields (where it may run), each checked with one line naming it:
    shared by the peer decoder (`what` "task") and the submit checks ("submit")."""
    return {
        "constraints": _constraints(f, "constraints", "constraint", what),
        "prefer": _constraints(f, "prefer", "prefer", what),
        "job": _job(f.str("job", "", max_len=128), what),
        "spread": _spread(f.str("spread", "", max_len=64), what),
        "anti_affinity": f.int("anti_affinity", 0, lo=0, hi=1 << 20),
        "data": _data_keys(f.str_list("data", max_items=16), what),
        "cwd_any": f.bool("cwd_any", False),
    }


def _constraints(f: Fields, key: str, name: str, what: str) -> tuple[str, ...]:
    texts = f.str_list(key, max_items=MAX_CONSTRAINTS)
    for t in texts:
        try:
            parse_constraint(t)
        except ConstraintError as e:
            raise SchemaError(f"{what}: {name}: {e}") from None
    return tuple(texts)


def _job(name: str, what: str) -> str:
    if name and not valid_job_name(name):
        raise SchemaError(f"{what}: job {name!r:.70}: a job name {JOB_RULE}")
    return name


def _spread(key: str, what: str) -> str:
    if key and not valid_label_key(key):
        raise SchemaError(f"{what}: spread: label key {key!r:.70}: a key {KEY_RULE}")
    return key


def _data_keys(keys: list[str], what: str) -> tuple[str, ...]:
    for k in keys:
        if not valid_data_key(k):
            raise SchemaError(f"{what}: data: key {k!r:.70}: {DATA_KEY_RULE}")
    return tuple(keys)


def _state_or_none(v: m.TaskState | None) -> str | None:
    return None if v is None else v.value


def transition_to_wire(t: m.Transition) -> dict[str, Any]:
    return {
        "at": t.at,
        "src": _state_or_none(t.src),
        "dst": t.dst.value,
        "cause": t.cause,
        "node": t.node,
    }


def transition_from_wire(obj: Any) -> m.Transition:
    f = Fields(obj, "transition")
    t = m.Transition(
        at=f.float("at", required=True),
        src=f.enum("src", m.TaskState),
        dst=f.enum("dst", m.TaskState, required=True),
        cause=f.str("cause", "", max_len=65536),
        node=f.str("node", ""),
    )
    f.done()
    return t


def task_to_wire(t: m.Task) -> dict[str, Any]:
    return {
        "spec": task_spec_to_wire(t.spec),
        "state": t.state.value,
        "node": t.node,
        "attempts": t.attempts,
        "exit_code": t.exit_code,
        "signal": t.signal,
        "reason": t.reason,
        "created_at": t.created_at,
        "started_at": t.started_at,
        "finished_at": t.finished_at,
        "history": [transition_to_wire(x) for x in t.history],
    }


def task_from_wire(obj: Any) -> m.Task:
    f = Fields(obj, "task record")
    t = m.Task(
        spec=task_spec_from_wire(f.map("spec", required=True)),
        state=f.enum("state", m.TaskState, required=True),
        node=f.str("node", ""),
        attempts=f.int("attempts", 0, lo=0),
        exit_code=f.int("exit_code"),
        signal=f.int("signal"),
        reason=f.str("reason", "", max_len=65536),
        created_at=f.float("created_at", 0.0),
        started_at=f.float("started_at"),
        finished_at=f.float("finished_at"),
        history=tuple(transition_from_wire(x) for x in f.list("history")),
    )
    f.done()
    return t


def gpu_free_to_wire(g: m.GpuDeviceFree) -> list[int]:
    return [g.index, g.free_core, g.free_mem, g.total_mem]


def gpu_free_from_wire(obj: Any) -> m.GpuDeviceFree:
    if (
        not isinstance(obj, (list, tuple))
        or len(obj) != 4
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in obj)
    ):
        raise SchemaError(
            f"gpu summary: expected [index, free_core, free_mem, total_mem], got {obj!r:.60}"
        )
    return m.GpuDeviceFree(*obj)


def load_report_to_wire(r: m.LoadReport) -> dict[str, Any]:
    return {
        "node": r.node,
        "version": r.version,
        "shares": r.shares,
        "reserved_shares": r.reserved_shares,
        "weight_sum": r.weight_sum,
        "queued": r.queued,
        "running": r.running,
        "slots": r.slots,
        "cpu_util": r.cpu_util,
        "load_per_core": r.load_per_core,
        "cpus": r.cpus,
        "mem_available": r.mem_available,
        "mem_total": r.mem_total,
        "psi_cpu": r.psi_cpu,
        "psi_mem": r.psi_mem,
        "gpus": [gpu_free_to_wire(g) for g in r.gpus],
        "isolation": r.isolation,
        "criu": r.criu,
        "bands": [list(b) for b in r.bands],
        "groups": [list(g) for g in r.groups],
        "usage": [list(u) for u in r.usage],
        "labels": [list(x) for x in r.labels],
        "data": r.data,
        "task_seconds": r.task_seconds,
        "unmovable_seconds": r.unmovable_seconds,
        "homing": r.homing,
    }


def load_report_from_wire(obj: Any) -> m.LoadReport:
    f = Fields(obj, "load report")
    r = m.LoadReport(
        node=f.str("node", required=True, max_len=256),
        version=f.int("version", required=True, lo=0),
        shares=f.int("shares", m.DEFAULT_SHARES, lo=-(1 << 40), hi=1 << 40),
        reserved_shares=f.int("reserved_shares", 0, lo=-(1 << 40), hi=1 << 40),
        weight_sum=f.float("weight_sum", 0.0, lo=-1e12, hi=1e12),
        queued=f.int("queued", 0, lo=0),
        running=f.int("running", 0, lo=0),
        slots=f.int("slots", 1, lo=0),
        cpu_util=f.float("cpu_util", 0.0, lo=0.0),
        load_per_core=f.float("load_per_core", 0.0, lo=0.0),
        cpus=f.float("cpus", 0.0, lo=0.0, hi=1e6),
        mem_available=f.int("mem_available", 0, lo=0),
        mem_total=f.int("mem_total", 0, lo=0),
        psi_cpu=f.float("psi_cpu", 0.0, lo=0.0),
        psi_mem=f.float("psi_mem", 0.0, lo=0.0),
        gpus=tuple(gpu_free_from_wire(x) for x in f.list("gpus")),
        isolation=f.str("isolation", "none", max_len=32),
        criu=f.bool("criu", False),
        bands=_bands(f.list("bands")),
        groups=_groups(f.list("groups")),
        usage=_usage(f.list("usage")),
        labels=_labels(f.list("labels")),
        data=_digest(f.bytes("data", b"")),
        task_seconds=f.float("task_seconds", 0.0, lo=0.0, hi=lim.MAX_REPORT_SECONDS),
        unmovable_seconds=f.float("unmovable_seconds", 0.0, lo=0.0, hi=lim.MAX_REPORT_SECONDS),
        homing=f.int("homing", 0, lo=0, hi=1 << 31),
    )
    f.done()
    return r


def _labels(obj: list[Any]) -> tuple[tuple[str, str], ...]:
    if len(obj) > MAX_LABELS:
        raise SchemaError(f"load report: labels: more than {MAX_LABELS}")
    pairs = []
    for x in obj:
        if not isinstance(x, list | tuple) or len(x) != 2:
            raise SchemaError(f"load report: labels: expected [key, value], got {x!r:.60}")
        if not isinstance(x[0], str):
            raise SchemaError(f"load report: labels: key {x[0]!r:.40}: a key {KEY_RULE}")
        pairs.append((x[0], x[1]))
    if all(isinstance(v, str) for _, v in pairs):
        return _checked_labels(tuple(pairs))
    return _check_labels(tuple(pairs))  # raises, naming the bad value


@functools.lru_cache(maxsize=4096)
def _checked_labels(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """Labels change only when an operator edits them, while every report carries
    them: each distinct set is checked once (a bad one raises, and is not cached)."""
    return _check_labels(pairs)


def _check_labels(pairs: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, str], ...]:
    try:
        labels = check_labels(dict(pairs), "load report: labels")
    except ConstraintError as e:
        raise SchemaError(str(e)) from None
    if len(labels) != len(pairs):
        raise SchemaError("load report: labels: a key is repeated")
    return tuple(sorted(labels.items()))


def _digest(b: bytes) -> bytes:
    if b and len(b) != DIGEST_BYTES:
        raise SchemaError(f"load report: data: a digest is {DIGEST_BYTES} bytes, got {len(b)}")
    return b


def group_name(name: str, what: str) -> str:
    if name and not valid_group_name(name):
        raise SchemaError(f"{what}: invalid group {name!r:.70}: a group name {GROUP_RULE}")
    return name


def _bands(obj: list[Any]) -> tuple[tuple[int, float], ...]:
    if len(obj) > lim.MAX_REPORT_BANDS:
        raise SchemaError(f"load report: bands: more than {lim.MAX_REPORT_BANDS}")
    out = []
    for b in obj:
        if (
            not isinstance(b, list | tuple)
            or len(b) != 2
            or not _is_int(b[0])
            or not _is_num(b[1])
            or not -MAX_PRIORITY <= b[0] <= MAX_PRIORITY
        ):
            raise SchemaError(f"load report: bands: expected [priority, weight], got {b!r:.60}")
        out.append((int(b[0]), float(b[1])))
    return tuple(out)


def _groups(obj: list[Any]) -> tuple[tuple[str, int, int], ...]:
    if len(obj) > lim.MAX_REPORT_GROUPS:
        raise SchemaError(f"load report: groups: more than {lim.MAX_REPORT_GROUPS}")
    out = []
    for g in obj:
        if (
            not isinstance(g, list | tuple)
            or len(g) != 3
            or not isinstance(g[0], str)
            or not valid_group_name(g[0])
            or not all(_is_int(x) and x >= 0 for x in g[1:])
        ):
            raise SchemaError(
                f"load report: groups: expected [group, queued, running], got {g!r:.60}"
            )
        out.append((g[0], int(g[1]), int(g[2])))
    return tuple(out)


def _usage(obj: list[Any]) -> tuple[tuple[str, float, float, float, float], ...]:
    if len(obj) > lim.MAX_REPORT_PRINCIPALS:
        raise SchemaError(f"load report: usage: more than {lim.MAX_REPORT_PRINCIPALS}")
    out = []
    for u in obj:
        if (
            not isinstance(u, list | tuple)
            or len(u) != 5
            or not isinstance(u[0], str)
            or not 0 < len(u[0]) <= 80
            or not all(_is_num(x) and 0 <= x < 1e30 for x in u[1:])
        ):
            raise SchemaError(
                f"load report: usage: expected [principal, slot_s, cpu_s, mem_s, gpu_s],"
                f" got {u!r:.60}"
            )
        out.append((u[0], float(u[1]), float(u[2]), float(u[3]), float(u[4])))
    return tuple(out)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x


def member_to_wire(mb: m.Member) -> dict[str, Any]:
    return {
        "node": mb.node,
        "addr": mb.addr,
        "port": mb.port,
        "state": mb.state.value,
        "incarnation": mb.incarnation,
        "cluster": mb.cluster,
    }


def member_from_wire(obj: Any) -> m.Member:
    f = Fields(obj, "member")
    mb = m.Member(
        node=f.str("node", required=True, max_len=256),
        addr=f.str("addr", required=True, max_len=256),
        port=f.int("port", required=True, lo=0, hi=65535),
        state=f.enum("state", m.MemberState, m.MemberState.ALIVE),
        incarnation=f.int("incarnation", 0, lo=0),
        cluster=f.str("cluster", "", max_len=256),
    )
    f.done()
    return mb
