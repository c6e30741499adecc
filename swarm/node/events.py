"""What the node's state machine takes in (stimuli) and gives out (instructions).

All frozen values. The runtime's driver carries instructions out in list order; a
`Record(durable=True)` or `Persist(durable=True)` is awaited (on disk) before the next
instruction, so "journal the decision, then send the message" is the order of a list.
Instructions that do no I/O of their own (`Enqueue`, `Place`, ...) run inline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .. import model as m
from ..cluster import handoff as h
from ..cluster.succession import Notice

# ----------------------------------------------------------------- instructions


@attrs.frozen
class Record:
    """A task record changed (already in memory): journal it, wake its waiters, log it."""

    task: m.Task
    durable: bool = False


@attrs.frozen
class Forget:
    """Drop a record (journaled): a guest task that left before it ran here."""

    task_id: m.TaskId


@attrs.frozen
class Put:
    key: str
    value: Any


@attrs.frozen
class Delete:
    key: str


@attrs.frozen
class Persist:
    """Journal key-value writes; durable ones land before the next instruction. Lazy
    ones (never durable) need not land soon: they go with the next commit, or alone
    a moment later (runtime/journal.py enqueue_lazy); only for state whose loss in a
    crash the protocol repairs by asking again."""

    ops: tuple[Put | Delete, ...]
    durable: bool = False
    lazy: bool = False


@attrs.frozen
class Enqueue:
    """Put a task in the local run queue (its shares are in the ledger already)."""

    task_id: m.TaskId
    front: bool = False


@attrs.frozen
class Requeue:
    """Put a pushed task back at the front of the run queue (a failed move)."""

    task_id: m.TaskId


@attrs.frozen
class Dequeue:
    task_id: m.TaskId


@attrs.frozen
class StopRun:
    """Stop the task's running process (`reason`: None for a plain cancel)."""

    task_id: m.TaskId
    reason: str | None = None


@attrs.frozen
class Preempt:
    """Stop a running task for a higher class; it goes back to this node's queue as a
    retry (`cause` in its history). A checkpointing task is asked to checkpoint first."""

    task_id: m.TaskId
    cause: str
    checkpoint: bool = False


@attrs.frozen
class StopMove:
    """Cancel a migration in progress."""

    task_id: m.TaskId
    cause: str


@attrs.frozen
class MoveHook:
    """Tell the migration side: "started", "stopped", "ended" (task) or "left" (id)."""

    what: str
    task_id: m.TaskId
    task: m.Task | None = None


@attrs.frozen
class Place:
    """Place a queued task whose home is here (two choices, re-check, retry)."""

    task_id: m.TaskId


@attrs.frozen
class PlaceMany:
    """Place these queued tasks whose home is here (an array's chunk of elements), each
    as `Place` does; what their offers write is journaled in one commit and their sends
    leave after it, instead of a task of its own and a commit for each (issue 23)."""

    task_ids: tuple[m.TaskId, ...]


@attrs.frozen
class OfferOutcome:
    """The outcome of an offer a placement waits for."""

    task_id: m.TaskId
    ok: bool
    reason: str


@attrs.frozen
class SendHandoff:
    send: h.Send


@attrs.frozen
class LoadChanged:
    """The local queue or GPU room changed: publish a fresh load report soon."""


@attrs.frozen
class Log:
    level: str  # "debug" | "info" | "warning" | "error"
    event: str
    fields: tuple[tuple[str, Any], ...] = ()


@attrs.frozen
class Explain:
    """A decision about a task for `swarm explain` (kept in memory already): journal it."""

    task_id: m.TaskId
    record: dict[str, Any] = attrs.field(eq=False)


@attrs.frozen
class WakeAt:
    """Wake the state (a `Wake` stimulus) at trio time `at`, or earlier."""

    at: float


@attrs.frozen
class Sample:
    """Measure the host now and feed it back (`Sampled`); publish the report if it
    changed meaningfully."""


@attrs.frozen
class PublishLoad:
    """Publish this node's load report now."""


@attrs.frozen
class TransferRound:
    """Run one round of work transfer (policy/transfer.py decides it)."""


@attrs.frozen
class MigrationRound:
    """Run one migration round: expire stale moves, decide what to move now."""


@attrs.frozen
class SyncGlobals:
    """Start the global tasks that should run here, stop the others."""


@attrs.frozen
class KickRunner:
    """Let the runner look at its queue again (shares or slots changed)."""


@attrs.frozen
class SendNotices:
    """Tell `dest` who holds these tasks' home role now (adoptions, failover.py); feed
    its counter-notices back (`on_notices`), or `NoticesUndelivered` if it is not
    reached."""

    dest: m.NodeId
    notices: tuple[Notice, ...]


@attrs.frozen
class SendReplica:
    """Send a replica message (replicas.py) to `dest`; its answer goes back to the
    state (`replica_acked`); none: the next tick sends it again."""

    dest: m.NodeId
    msg: Any  # replicas.ReplicaMsg (not imported here: replicas.py imports this module)


@attrs.frozen
class AskLease:
    """Ask `dest`, the home of `task_id`, for the lease of a fenced task at `epoch`
    (fencing.py); its answer comes back as `LeaseAnswer` with `asked_at`."""

    dest: m.NodeId
    task_id: m.TaskId
    epoch: int
    asked_at: float


@attrs.frozen
class RenewLease:
    """Move the lease deadline (this node's clock) of a fenced task that runs here
    forward in its supervisor's lease file."""

    task_id: m.TaskId
    until: float


@attrs.frozen
class SendGang:
    """A gang protocol message to a peer (cluster/gang.py; op `gang`). A prepare and a
    commit carry the gang's spec; a commit which start of the gang it is (member ids)."""

    dest: m.NodeId
    msg: Any  # cluster.gang.Message
    spec: m.TaskSpec | None = None
    run: int = 0


@attrs.frozen
class StartNow:
    """Start a gang member at once, outside the run queue: its hold kept the slot."""

    task_id: m.TaskId


@attrs.frozen
class SendLate:
    """Late binding's reservations and cancels to peers (policy/latebind.py; op
    `late`), sent without waiting: a lost one costs a pull answered "gone" or a task
    that waits at its home until its hold ends."""

    msgs: tuple[Any, ...]  # latebind.Reserve | latebind.Cancel


@attrs.frozen
class Later:
    """Carry these out in a task of their own (the caller must not wait on them)."""

    instructions: tuple[Instruction, ...]


Instruction = (
    Record
    | Forget
    | Persist
    | Enqueue
    | Requeue
    | Dequeue
    | StopRun
    | StopMove
    | Preempt
    | MoveHook
    | Place
    | PlaceMany
    | OfferOutcome
    | SendHandoff
    | LoadChanged
    | Log
    | Explain
    | WakeAt
    | Sample
    | PublishLoad
    | TransferRound
    | MigrationRound
    | SyncGlobals
    | KickRunner
    | SendNotices
    | SendReplica
    | AskLease
    | RenewLease
    | SendGang
    | StartNow
    | SendLate
    | Later
)


def blocks(i: Instruction) -> bool:
    """Does carrying this out need an await (a durable write, a process to stop)?"""
    if isinstance(i, (Record, Persist)):
        return i.durable
    return isinstance(i, (StopRun, StopMove))


def log(level: str, event: str, **fields: Any) -> Log:
    return Log(level, event, tuple(fields.items()))


# --------------------------------------------------------------------- stimuli


@attrs.frozen
class Stimulus:
    """Every stimulus carries trio's clock (`now`), the wall clock and an id for explain."""

    now: float
    wall: float
    stimulus_id: str


@attrs.frozen
class HandoffOutputs(Stimulus):
    """Outputs of the pure handoff sides to apply (decisions, then the sends)."""

    outputs: tuple[h.Output, ...]
    task_ids: tuple[m.TaskId, ...] = ()


@attrs.frozen
class TaskStarted(Stimulus):
    task: m.Task


@attrs.frozen
class TaskEnded(Stimulus):
    """A local run ended: terminal, back to the queue (shutdown), or stopped to move."""

    task: m.Task


@attrs.frozen
class NodeDead(Stimulus):
    node: m.NodeId


@attrs.frozen
class MembersSeen(Stimulus):
    """Members' states in this node's view: a change, or a snapshot (this node too)."""

    states: tuple[tuple[m.NodeId, m.MemberState], ...]


@attrs.frozen
class NoticesUndelivered(Stimulus):
    """These notices did not reach their node: owe them again."""

    dest: m.NodeId
    notices: tuple[Notice, ...]


@attrs.frozen
class LeaseAnswer(Stimulus):
    """A home's answer to `AskLease` (granted False, with why: refused or unanswered)."""

    task_id: m.TaskId
    epoch: int
    asked_at: float
    granted: bool
    why: str = ""


@attrs.frozen
class CancelRemote(Stimulus):
    """Cancel a task whose home is here and which lives elsewhere (or is in flight)."""

    task_id: m.TaskId


@attrs.frozen
class HandoffReply(Stimulus):
    """The answer to one of our handoff requests (None: none came)."""

    dest: m.NodeId
    request: h.Request
    reply: h.Reply | None


@attrs.frozen
class JobsKicked(Stimulus):
    """A peer joined: placements waiting on a back-off look again."""


@attrs.frozen
class Wake(Stimulus):
    """A WakeAt came due, or a peer's report or join may have changed the picture."""


@attrs.frozen
class PlaceTask(Stimulus):
    """Place a queued task whose home is here."""

    task_id: m.TaskId


@attrs.frozen
class Sampled(Stimulus):
    sample: Any  # policy.load.HostSample


@attrs.frozen
class PeerReport(Stimulus):
    """A peer's load report, received by gossip at trio time `at`."""

    report: m.LoadReport
    at: float


@attrs.frozen
class GangSubmitted(Stimulus):
    """A gang's record was written here (or found at start-up): coordinate it."""

    task_id: m.TaskId


@attrs.frozen
class ArraySubmitted(Stimulus):
    """An array's record was written here (or found at start-up): create its elements."""

    task_id: m.TaskId


@attrs.frozen
class DepsSubmitted(Stimulus):
    """A task with `--after` clauses was written here: it waits for its parents."""

    task_id: m.TaskId


@attrs.frozen
class ParentsSeen(Stimulus):
    """Final states of parents homed elsewhere (the runtime read their records)."""

    states: Mapping[m.TaskId, str]


@attrs.frozen
class GangMessage(Stimulus):
    """A gang protocol message from a peer (`commitment`: what a prepare or commit
    carried besides; `port`: one reserved for a rendezvous, given with a prepare)."""

    src: m.NodeId
    msg: Any  # cluster.gang.Message
    commitment: Any = None  # node.gangs.Commitment
    port: int = 0


@attrs.frozen
class GangCancel(Stimulus):
    task_id: m.TaskId
    why: str


Event = (
    Wake
    | JobsKicked
    | PlaceTask
    | Sampled
    | PeerReport
    | HandoffOutputs
    | HandoffReply
    | TaskStarted
    | TaskEnded
    | NodeDead
    | MembersSeen
    | NoticesUndelivered
    | CancelRemote
    | LeaseAnswer
    | GangSubmitted
    | GangMessage
    | GangCancel
    | ArraySubmitted
    | DepsSubmitted
    | ParentsSeen
)
