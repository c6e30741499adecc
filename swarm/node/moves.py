"""Migrations of running tasks as data: phases, bookkeeping, decisions (pure).

One migration, as its source drives it (the order is what makes every failure
harmless; the runtime's mechanics are in runtime/moving.py, movesource.py and
statestream.py):

1. *prepare*: the target re-checks with its fresh load and may refuse. Nothing has
   happened to the task yet.
2. *stop*: checkpoint (signal; the task writes $SWARM_STATE_DIR and exits with the
   checkpoint code), restart (terminate) or CRIU dump. The runner records RUNNING ->
   MIGRATING. If the task does not stop in time it simply runs on here.
3. *transfer*: the state directory is streamed to the target, which installs it only
   once everything verified. The source keeps its own copy: if anything breaks, the
   task restarts here from it.
4. *move*: the task's location moves through the handoff protocol. The source keeps
   its copy of the state (`retained`) until the target says the task started there,
   or a while passed.

What each phase's failure means (tell the target to drop what it staged? back into
this node's queue?) is the table `ENDINGS`. `Moves` holds the bookkeeping of both
ends: moves in flight from here (`outgoing`) and to here (`incoming`), tasks that
arrived by migration (`arrivals`, journaled under `marr:<id>`), copies kept for moved
tasks (`retained`), estimates (bandwidth, pauses, the start rate) and the decisions
for `swarm explain`. Time comes in as arguments (`now`: trio's clock, `wall`: the
wall clock); effects come back as instructions (events.Persist, events.Log and the
move instructions below) for the runtime to carry out in order.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from .. import model as m
from .. import wire
from ..policy import migration as pol
from . import events as ev

S = m.TaskState
MM = m.MigrateMode
ARRIVAL_KEY = "marr:"  # journal key of an Arrival: marr:<task id>


@attrs.frozen
class MoveSettings:
    mode: str = "on"  # on | off | dry-run
    policy: pol.MigrationConfig = attrs.field(factory=pol.MigrationConfig)
    period: float = 5.0  # seconds between decision rounds
    checkpoint_signal: int = 10  # SIGUSR1 on Linux; the option is parsed by the runtime
    checkpoint_timeout: float = 30.0
    default_pause: float = 2.0  # seconds, until pauses were measured here
    rpc_timeout: float = 5.0
    move_timeout: float = 120.0  # how long the source waits for the home's verdict
    staged_ttl: float = 300.0  # staged state whose task never came is deleted after


# ------------------------------------------------------------------ phases


class Phase(enum.Enum):
    PREPARE = "prepare"
    STOP = "stop"
    TRANSFER = "transfer"
    MOVE = "move"


# a cancel during these phases is carried out by the source at its next step
CANCEL_AT_NEXT_STEP = frozenset({Phase.PREPARE, Phase.STOP, Phase.TRANSFER})


@attrs.frozen
class Ending:
    """How a move that ends at some point ends: its outcome code (`swarm status`,
    counters), whether the target is told to drop what it staged, and whether the
    stopped task goes back into this node's run queue (it restarts from its copy)."""

    outcome: str
    abort_target: bool = False
    put_back: bool = False


ENDINGS: dict[str, Ending] = {
    "refused": Ending("refused"),  # prepare: the target refused or did not answer
    "not-stopped": Ending("not-stopped", abort_target=True),  # it runs on here
    "cancelled": Ending("cancelled", abort_target=True),  # cancelled durably here
    "transfer-failed": Ending("failed", abort_target=True, put_back=True),
    # the move's refusal put it back already (the home's offer failed, or the guest
    # side was not settled)
    "move-failed": Ending("failed", abort_target=True),
    "undecided": Ending("undecided"),  # the home decides; nothing runs twice
    "internal-error": Ending("failed", put_back=True),
    "moved": Ending("moved"),
}


@attrs.define
class Outgoing:
    """A migration this node is driving (it is the source)."""

    mid: str
    target: m.NodeId
    mode: m.MigrateMode
    since: float
    step: Phase = Phase.PREPARE
    cancel: str | None = None


@attrs.define
class Incoming:
    """A migration this node prepared for (it is the target)."""

    mid: str
    source: m.NodeId
    spec: m.TaskSpec
    since: float
    staged: bool = False


@attrs.frozen
class Arrival:
    """A task that arrived here by migration: journaled, so that its moves count, its
    age and its pending resume survive an agent restart."""

    mid: str
    source: m.NodeId
    mode: m.MigrateMode
    moves: int
    age: float  # seconds it had run before it came
    stopped_at: float  # wall clock at the source
    arrived_at: float  # wall clock here
    files: dict[str, str] = attrs.field(factory=dict)
    resumed: bool = False
    restore_used: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "mode": self.mode.value}

    @classmethod
    def from_wire(cls, obj: Any) -> Arrival:
        f = wire.Fields(obj, "arrival")
        a = cls(
            mid=f.str("mid", required=True, max_len=300),
            source=f.str("source", required=True, max_len=256),
            mode=f.enum("mode", MM, required=True),
            moves=f.int("moves", 0, lo=0),
            age=f.float("age", 0.0, lo=0.0),
            stopped_at=f.float("stopped_at", 0.0),
            arrived_at=f.float("arrived_at", 0.0),
            files=f.str_map("files", max_items=16),
            resumed=f.bool("resumed", False),
            restore_used=f.bool("restore_used", False),
        )
        f.done()
        return a


# ------------------------------------------------------------------ instructions


@attrs.frozen
class RemoveState:
    """Delete the task's state directory here (if it has one)."""

    task_id: m.TaskId


@attrs.frozen
class TellSource:
    """The task started here: the source may delete the copy it kept."""

    source: m.NodeId
    task_id: m.TaskId
    mid: str


@attrs.frozen
class AbortAt:
    """Tell the target to drop what it staged (best effort: it expires anyway)."""

    target: m.NodeId
    task_id: m.TaskId
    mid: str


@attrs.frozen
class StoreRecord:
    """Journal part of a migration's record here (this node is the task's home)."""

    task_id: m.TaskId
    record: dict[str, Any] = attrs.field(eq=False)
    at: float  # wall clock


@attrs.frozen
class SendRecord:
    """Send part of a migration's record to the task's home."""

    home: m.NodeId
    task_id: m.TaskId
    record: dict[str, Any] = attrs.field(eq=False)


@attrs.frozen
class NoteDecision:
    """A migration decision for `swarm explain`."""

    task_id: m.TaskId
    record: dict[str, Any] = attrs.field(eq=False)


@attrs.frozen
class PutBack:
    """A stopped task whose move did not happen: back into this node's run queue."""

    task_id: m.TaskId
    cause: str


MoveInstruction = (
    ev.Persist
    | ev.Log
    | RemoveState
    | TellSource
    | AbortAt
    | StoreRecord
    | SendRecord
    | NoteDecision
    | PutBack
)


@attrs.frozen
class Start:
    """A move to start now (its Outgoing is in `Moves.outgoing` already)."""

    task: m.Task
    running: pol.RunningTask
    decision: pol.MigrationDecision
    out: Outgoing


@attrs.frozen
class Round:
    decisions: list[pol.MigrationDecision]
    instructions: list[MoveInstruction]
    starts: list[Start]


def keeps_state(spec: m.TaskSpec) -> bool:
    """Does this task's migration carry a state directory (checkpoint or CRIU)?"""
    return spec.migrate in (MM.CHECKPOINT, MM.CRIU)


def never_moves(spec: m.TaskSpec, criu_here: bool) -> bool:
    """Can the migration policy never move this running task off this node, whatever
    the load (issue 25: the work a scale-in of this node would lose)? So when:

    - it opted out (migrate=never: Departures.eligible, policy.migration's NEVER),
    - it is global (one copy on every node: never a move candidate),
    - it migrates by CRIU and this node has no CRIU (policy.migration's NO_CRIU).

    Checkpoint, restart and CRIU-with-CRIU tasks may move (a restart loses its run so
    far: the report's task_seconds counts it). Limits that pass with time (a cooldown,
    a suspect peer, a handoff not yet settled) do not count, nor max-moves (the move
    book, not the node state, knows how often a task moved)."""
    if spec.is_global or spec.migrate is MM.NEVER:
        return True
    return spec.migrate is MM.CRIU and not criu_here
