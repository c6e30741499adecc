"""What copies of tasks are made of (node/replicas.py): the messages between a home
and the nodes keeping copies of its tasks, a copy as kept, and their wire and journal
forms. A peer's message is checked here field by field (wire.SchemaError naming the
field); a malformed journal entry is skipped (that copy is lost, as without copies).
"""

from __future__ import annotations

from typing import Any

import attrs

from .. import codec, wire
from .. import model as m
from ..cluster.messages import MAX_ID_LEN
from ..cluster.succession import MAX_COPIES, MAX_EPOCH
from .recovery import REPLICA, REPLICAS, STRAYS

RELEASE = "release"
HOLD = "hold"
RUNNER = "runner"
ASK = "ask"  # holder -> home: what became of it? (copyasks.py)


FINAL_STATES = frozenset(s.value for s in m.TERMINAL_STATES)


@attrs.frozen
class Final:
    """How a task ended, as its home recorded it: sent with the release, so that a
    replica still answers for a task whose home is lost after it finished there."""

    state: str
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    at: float = 0.0  # wall time of the end

    @classmethod
    def of(cls, t: m.Task) -> Final:
        return cls(t.state.value, t.exit_code, t.signal, t.reason[:512], t.finished_at or 0.0)

    def to_wire(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_wire(cls, obj: Any) -> Final:
        f = wire.Fields(obj, "replica final")
        state = f.str("state", required=True, max_len=16)
        if state not in FINAL_STATES:
            raise wire.SchemaError(f"replica final: field 'state' is not a final state: {state!r}")
        out = cls(
            state,
            f.int("exit_code", None, lo=0, hi=255),
            f.int("signal", None, lo=1, hi=127),
            f.str("reason", "", max_len=512),
            f.float("at", 0.0, lo=0.0),
        )
        f.done()
        return out


@attrs.frozen
class ReplicaMsg:
    """Home -> replica: hold a copy (with the spec), where it runs now, or release;
    replica -> home: ask (copyasks.py)."""

    kind: str  # hold | runner | release | ask
    task_id: m.TaskId
    home: m.NodeId
    runner: m.NodeId | None = None
    replicas: tuple[m.NodeId, ...] = ()
    spec: m.TaskSpec | None = None
    final: Final | None = None  # a release because the task ended: how
    # the sender's claim on the task (1: its first home; more: an adopter's): a copy
    # held of an adopter's task is held at its claim (stop 53: held at 1, a holder
    # that adopted it after a second loss was outranked by the dead adopter's claim,
    # yielded to it, and the task was lost). Sent only when above 1 (older agents'
    # decoders refuse fields they do not know)
    epoch: int = 1


@attrs.define
class Held:
    """A copy this node keeps of another home's task (`final`: it ended; the copy is
    only an answer for `swarm status` now, never adopted)."""

    spec: m.TaskSpec
    home: m.NodeId
    runner: m.NodeId | None
    replicas: tuple[m.NodeId, ...]
    final: Final | None = None
    epoch: int = 1  # its home's claim (ReplicaMsg.epoch)


def replica_msg_to_wire(r: ReplicaMsg) -> dict[str, Any]:
    return {
        "kind": r.kind,
        "id": r.task_id,
        "home": r.home,
        "runner": r.runner,
        "replicas": list(r.replicas),
        "spec": None if r.spec is None else codec.task_spec_to_wire(r.spec),
        **({"final": r.final.to_wire()} if r.final is not None else {}),
        **({"epoch": r.epoch} if r.epoch > 1 else {}),
    }


def replica_msg_from_wire(obj: Any) -> ReplicaMsg:
    """A peer's replica message (wire.SchemaError naming the field if malformed)."""
    f = wire.Fields(obj, "replica")
    kind = f.str("kind", required=True, max_len=16)
    if kind not in (HOLD, RUNNER, RELEASE, ASK):
        raise wire.SchemaError(
            f"replica: field 'kind' must be hold, runner, release or ask: {kind!r}"
        )
    tid = f.task_id("id", required=True)
    home = f.str("home", required=True, max_len=MAX_ID_LEN)
    runner = f.str("runner", None, max_len=MAX_ID_LEN)
    replicas = f.str_list("replicas", max_items=MAX_COPIES)
    spec = f.nested("spec", codec.task_spec_from_wire)
    final = f.nested("final", Final.from_wire)
    epoch = f.int("epoch", 1, lo=1, hi=MAX_EPOCH)
    f.done()
    if not home or any(not r or len(r) > MAX_ID_LEN for r in replicas):
        raise wire.SchemaError("replica: field 'home' or 'replicas': an empty or long node id")
    if kind == HOLD and (spec is None or spec.id != tid or spec.home != home):
        raise wire.SchemaError("replica: field 'spec' must be the task's, naming its home")
    if kind == ASK and spec is not None:
        raise wire.SchemaError("replica: field 'spec' does not come with an ask")
    if final is not None and kind != RELEASE:
        raise wire.SchemaError("replica: field 'final' comes with a release only")
    return ReplicaMsg(kind, tid, home, runner or None, tuple(replicas), spec, final, epoch)


@attrs.frozen
class Restored:
    """The replica part of a journal (restore_replicas)."""

    mine: dict[m.TaskId, tuple[m.NodeId, ...]]
    held: dict[m.TaskId, Held]
    strays: dict[m.TaskId, frozenset[m.NodeId]]


def restore_replicas(kv: dict[str, Any]) -> Restored:
    """Our tasks' replicas (`repls:`), the nodes that may hold stray copies of them
    (`strays:`) and the copies we keep (`replica:`) from the journal; a malformed entry
    is skipped (the copy is lost, as without replicas)."""
    mine: dict[m.TaskId, tuple[m.NodeId, ...]] = {}
    held: dict[m.TaskId, Held] = {}
    strays: dict[m.TaskId, frozenset[m.NodeId]] = {}
    for key, value in kv.items():
        try:
            if key.startswith(REPLICAS):
                mine[key[len(REPLICAS) :]] = tuple(str(n) for n in value)
            elif key.startswith(STRAYS):
                nodes = frozenset(str(n) for n in value if isinstance(n, str) and n)
                if nodes:
                    strays[key[len(STRAYS) :]] = nodes
            elif key.startswith(REPLICA):
                f = wire.Fields(value, "replica record")
                spec = wire.decode_with(codec.task_spec_from_wire, f.map("spec", required=True))
                held[spec.id] = Held(
                    spec,
                    f.str("home", required=True),
                    f.str("runner", None),
                    tuple(f.str_list("replicas")),
                    f.nested("final", Final.from_wire),
                    f.int("epoch", 1, lo=1, hi=MAX_EPOCH) or 1,
                )
                f.done()
        except (wire.WireError, TypeError, ValueError):
            continue
    return Restored(mine, held, strays)
