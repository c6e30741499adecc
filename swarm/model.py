"""Value types shared by every layer: tasks, their lifecycle, members and load reports.

Everything here is pure data plus the task lifecycle state machine. Nothing imports
trio, sockets or the clock: times are passed in as plain floats (wall-clock seconds
since the epoch for anything journaled, so a record means the same after a restart).
"""

from __future__ import annotations

import enum
import re
import secrets
from collections.abc import Mapping
from typing import Any

import attrs

NodeId = str
TaskId = str

DEFAULT_SHARES = 1024
DEFAULT_PRIORITY = 50  # the value of the default class, `normal` (policy/sharing.py)
MAX_PRIORITY = 1_000_000  # |priority| bound
_GROUP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")
GROUP_RULE = "starts with a letter or '_' and holds at most 64 letters, digits, '_', '.', '-'"


def valid_group_name(name: str) -> bool:
    """An accounting group's or priority class's name: data, never a path."""
    return bool(_GROUP_NAME.match(name))


def new_task_id() -> TaskId:
    """Random, url-safe, sortable enough for humans; unique across the cluster."""
    return "t" + secrets.token_hex(8)


GENERATED_TASK_ID = re.compile(r"t[0-9a-f]{16}")


# A task id names files (logs/<id>.out, task-state/<id>) and a cgroup, so it must never
# be a path: it starts with a letter or digit (so never "." or ".."), has no "/", and
# is short. An id a client chose is namespaced by its owner ("job1~alice"), so two
# users' ids can never meet, on this node or any other (a client's own id never holds
# a "~", so nobody can name another user's namespace).
_CLIENT_ID = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}"
_OWNER = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,31}"
CLIENT_TASK_ID = re.compile(_CLIENT_ID)
TASK_ID = re.compile(rf"{_CLIENT_ID}(?:~{_OWNER})?")
OWNER = re.compile(_OWNER)
MAX_TASK_ID_LEN = 64 + 1 + 32


def valid_task_id(value: object) -> bool:
    """Is `value` a task id (any node's: generated, or a client's id with its owner)?"""
    return isinstance(value, str) and TASK_ID.fullmatch(value) is not None


def valid_client_task_id(value: object) -> bool:
    """Is `value` an id a client may choose (no owner part)?"""
    return isinstance(value, str) and CLIENT_TASK_ID.fullmatch(value) is not None


def id_namespace(uid: int, user: str | None) -> str:
    """The owner part of a client-chosen id: the user name (what tasks run as on every
    node), or uid<N> for a uid without a usable name."""
    if user is not None and OWNER.fullmatch(user) and not user.startswith("uid"):
        return user
    return f"uid{uid}"


def owned_task_id(client_id: str, uid: int, user: str | None) -> TaskId:
    """The task id of a client-chosen id: namespaced by its owner."""
    return f"{client_id}~{id_namespace(uid, user)}"


class TaskState(enum.Enum):
    QUEUED = "queued"
    TRANSFERRING = "transferring"
    RUNNING = "running"
    MIGRATING = "migrating"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED, TaskState.LOST}
)

# Legal moves of the lifecycle. QUEUED may go back from RUNNING (agent restart, node
# death) because execution is at-least-once; terminal states are final so that the
# recorded result is exactly-once.
_T = TaskState
ALLOWED_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    _T.QUEUED: frozenset({_T.RUNNING, _T.TRANSFERRING, _T.CANCELLED, _T.FAILED, _T.LOST}),
    _T.TRANSFERRING: frozenset({_T.QUEUED, _T.RUNNING, _T.CANCELLED, _T.FAILED, _T.LOST}),
    _T.RUNNING: frozenset(
        {_T.SUCCEEDED, _T.FAILED, _T.CANCELLED, _T.QUEUED, _T.MIGRATING, _T.LOST}
    ),
    _T.MIGRATING: frozenset(
        {_T.RUNNING, _T.QUEUED, _T.SUCCEEDED, _T.FAILED, _T.CANCELLED, _T.LOST}
    ),
    _T.SUCCEEDED: frozenset(),
    _T.FAILED: frozenset(),
    _T.CANCELLED: frozenset(),
    _T.LOST: frozenset(),
}


class IllegalTransition(Exception):
    """A lifecycle move the state machine forbids (a bug or a stale message)."""

    def __init__(self, task_id: TaskId, src: TaskState, dst: TaskState) -> None:
        super().__init__(f"task {task_id}: illegal transition {src.value} -> {dst.value}")
        self.task_id = task_id
        self.src = src
        self.dst = dst


class MigrateMode(enum.Enum):
    NEVER = "never"
    CHECKPOINT = "checkpoint"
    RESTART = "restart"
    CRIU = "criu"


@attrs.frozen
class GpuRequest:
    """A GPU slice request after Koordinator's rules (validated in policy.gpu).

    core: percent of one device (1-100) or a multiple of 100 for whole devices.
    memory_bytes / memory_ratio: at most one of them is set.
    """

    core: int
    memory_bytes: int | None = None
    memory_ratio: int | None = None


@attrs.frozen
class GangRequest:
    """`swarm submit --gang N` (issue 22): run N members of the command together, all
    or nothing (`strict`), or with at least `min_available` of them (`nonstrict`).
    The task that carries it is the gang's record at its home; it never runs itself
    (node/gangs.py coordinates the members; cluster/gang.py is the protocol)."""

    size: int
    mode: str = "strict"  # "strict" | "nonstrict"
    min_available: int = 0
    restart: bool = False  # a failed running gang starts again as a whole
    timeout: float = 0.0  # fail when not running this long after submission (0: never)


@attrs.frozen
class GangRole:
    """A gang member's place (issue 22), on the member's own record at the node that
    runs it: which gang (its record's id at `home`), which round and slot, its rank in
    a world of `world` members."""

    gang: TaskId
    home: NodeId
    round: int
    slot: int
    rank: int
    world: int


@attrs.frozen
class ArrayRole:
    """An array element's place (issue 23): its array's record (at the same home) and
    its index."""

    array: TaskId
    index: int


@attrs.frozen
class TaskSpec:
    """What the submitter asked for. Immutable once accepted."""

    id: TaskId
    argv: tuple[str, ...]
    name: str = ""
    env: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    cwd: str | None = None
    weight: float = 1.0
    reserve_shares: int = 0
    is_global: bool = False
    labels: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    uid: int | None = None
    user: str | None = None
    no_retry: bool = False
    cpu: float | None = None  # CPU request in cores
    mem: int | None = None  # memory request in bytes
    gpu: GpuRequest | None = None
    migrate: MigrateMode = MigrateMode.NEVER
    expected_runtime: float | None = None
    submitted_at: float = 0.0
    home: NodeId = ""  # the node the task was submitted at; owns its record
    priority: int = DEFAULT_PRIORITY  # its class's value (higher runs first; policy/sharing.py)
    group: str = ""  # accounting group (fair share, quotas); "" = none given
    # where it may run (issue 21; policy/constraints.py): hard constraints and soft
    # preferences over node labels, its job (spread and anti-affinity count within
    # one job), the label to spread over, at most this many of its job per node (0 =
    # no limit), the data keys it reads (delay scheduling), and whether a missing
    # working directory may fall back to $HOME (else the node refuses it)
    constraints: tuple[str, ...] = ()
    prefer: tuple[str, ...] = ()
    job: str = ""
    spread: str = ""
    anti_affinity: int = 0
    data: tuple[str, ...] = ()
    cwd_any: bool = False
    # issue 19: never two copies running at once (a lease fences the runner; the
    # home places it again only once that lease has surely lapsed: node/fencing.py)
    at_most_once: bool = False
    # issue 22: a gang's record (at its home), or one member of a gang (where it runs)
    gang: GangRequest | None = None
    member: GangRole | None = None
    # issue 23: an array's record (its `--array` text, canonical), or one element
    array: str = ""
    element: ArrayRole | None = None
    # issue 23: wait at the home until these `--after` clauses hold (COND:ID[,ID...],
    # every parent a task id, resolved at submit: node/depends.py)
    after: tuple[str, ...] = ()
    # issue 24: it may run twice (`--idempotent`), so a late run may get a backup copy;
    # a backup's own record names the task it backs up (node/backups.py)
    idempotent: bool = False
    backup_of: TaskId = ""


def same_submission(a: TaskSpec, b: TaskSpec) -> bool:
    """Is `b` the submission `a` again (an idempotent retry): everything but the time?"""
    return attrs.evolve(a, submitted_at=0.0) == attrs.evolve(b, submitted_at=0.0)


@attrs.frozen
class Transition:
    """One journaled lifecycle move: when, from what, to what, why, and where."""

    at: float
    src: TaskState | None
    dst: TaskState
    cause: str
    node: NodeId = ""


@attrs.frozen
class Task:
    """A task's current record at its home node. Changed only through `transition`."""

    spec: TaskSpec
    state: TaskState = TaskState.QUEUED
    node: NodeId = ""  # where it is queued or running now
    attempts: int = 0  # how many times a process was started
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    history: tuple[Transition, ...] = ()

    @property
    def id(self) -> TaskId:
        return self.spec.id


def new_task(spec: TaskSpec, now: float, node: NodeId, cause: str = "submitted") -> Task:
    return Task(
        spec=spec,
        state=TaskState.QUEUED,
        node=node,
        created_at=now,
        history=(Transition(now, None, TaskState.QUEUED, cause, node),),
    )


def transition(
    task: Task,
    dst: TaskState,
    now: float,
    cause: str,
    *,
    node: NodeId | None = None,
    exit_code: int | None = None,
    signal: int | None = None,
) -> Task:
    """Move `task` to `dst`, or raise IllegalTransition. Pure: returns a new Task."""
    if dst not in ALLOWED_TRANSITIONS[task.state]:
        raise IllegalTransition(task.id, task.state, dst)
    where = task.node if node is None else node
    changes: dict[str, Any] = {
        "state": dst,
        "node": where,
        "history": (*task.history, Transition(now, task.state, dst, cause, where)),
    }
    if dst is TaskState.RUNNING and task.state is not TaskState.MIGRATING:
        changes["attempts"] = task.attempts + 1
        changes["started_at"] = now
    if dst is TaskState.QUEUED:
        changes["started_at"] = None
    if dst.terminal:
        changes["finished_at"] = now
        changes["exit_code"] = exit_code
        changes["signal"] = signal
        changes["reason"] = cause
    return attrs.evolve(task, **changes)


def exit_status(exit_code: int | None, signal: int | None) -> int:
    """Shell convention: the exit code, or 128 + signal number if killed by a signal."""
    if signal is not None:
        return 128 + signal
    return 0 if exit_code is None else exit_code


class MemberState(enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


@attrs.frozen
class Member:
    """A peer as this node knows it from gossip."""

    node: NodeId
    addr: str
    port: int
    state: MemberState = MemberState.ALIVE
    incarnation: int = 0
    cluster: str = ""


@attrs.frozen
class GpuDeviceFree:
    """Compact per-device GPU summary carried in load reports."""

    index: int
    free_core: int  # 0-100
    free_mem: int  # bytes
    total_mem: int  # bytes


@attrs.frozen
class LoadReport:
    """A node's self-reported load, versioned; peers keep the newest and its age.

    `version` increases with every new report from the same node (and across restarts,
    because it starts from the wall clock in milliseconds).
    """

    node: NodeId
    version: int
    shares: int = DEFAULT_SHARES
    reserved_shares: int = 0  # shares consumed by running tasks with reservations
    weight_sum: float = 0.0  # sum of weights of tasks queued or running here
    queued: int = 0
    running: int = 0
    slots: int = 1
    cpu_util: float = 0.0  # 0..1 of the whole machine
    load_per_core: float = 0.0  # 1-minute load average / cores
    cpus: float = 0.0  # cores usable by tasks (0 = not reported); placement CPU-fit check
    mem_available: int = 0  # bytes
    mem_total: int = 0
    psi_cpu: float = 0.0  # /proc/pressure/cpu some avg10 (percent)
    psi_mem: float = 0.0
    gpus: tuple[GpuDeviceFree, ...] = ()
    isolation: str = "none"  # cgroup2 | cgroup1 | none
    criu: bool = False
    # issue 20, each bounded (limits.py): weight queued or running here per priority
    # value (so urgent work is not repelled by preemptible work); per accounting group,
    # slots queued and running (quota demand); this node's decayed usage per principal
    # (user, or "group:NAME") as (principal, slot-s, cpu-s, mem byte-s, gpu unit-s)
    bands: tuple[tuple[int, float], ...] = ()
    groups: tuple[tuple[str, int, int], ...] = ()
    usage: tuple[tuple[str, float, float, float, float], ...] = ()
    # issue 21: the node's labels, sorted by key (bounded by policy.constraints), and a
    # Bloom digest of the data keys it holds (policy.datakeys; b"" = none)
    labels: tuple[tuple[str, str], ...] = ()
    data: bytes = b""
    # issue 25 (safe scale-in: remove the node that loses least work), as of the
    # report's making (to a quarter second; its version is the wall clock in ms), each
    # at most limits.MAX_REPORT_SECONDS: the seconds every task RUNNING here has run so
    # far, summed (it grows by `running` a second after that), and the longest of them
    # among the tasks that cannot migrate off this node (node.moves.never_moves:
    # migrate=never, global tasks, CRIU where this node has none; 0 = none such).
    # Neither makes a new report by itself (they always grow: changed_meaningfully).
    task_seconds: float = 0.0
    unmovable_seconds: float = 0.0
    # unfinished tasks whose home is this node, wherever they run: removing the node
    # would leave them without the node that acknowledges their results (issue 19),
    # so a scale-in waits for them (node/scaling.py). A change is news (gossiped).
    homing: int = 0

    @property
    def draining(self) -> bool:
        return self.shares <= 0
