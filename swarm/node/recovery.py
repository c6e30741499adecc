"""The node's journal key schema, in one place, and "journal -> state" at start-up.

Keys (the task records themselves are rows of their own, not keys):
  home:<id>    the home side's entry of a task submitted here (handoff epoch, holder)
  guest:<id>   the guest side's entry of a task held here for another home
  tomb:<id>    [epoch, wall time]: a guest entry that ended (late offers are refused)
  adopt:<id>   [old home, claim epoch]: a task whose home role this node took over
               (failover.py; cluster/succession.py)
  replica:<id> a copy of another home's task: its spec, home, runner, replicas
  repls:<id>   the nodes that keep a copy of a task whose home is here (replicas.py)
  strays:<id>  nodes that may keep a stray copy of such a task (asked, no answer)
  gpu:<id>     a task's GPU slice allocation (a re-queued task restarts on it)
  globals      the global-task set (a CRDT, also gossiped)
  shares, undrain_shares   this node's shares and what an undrain gives back (shares.py)
  marr:<id>    a migrated task's arrival record (moves.py)
  alive_at     wall time of this agent's last heartbeat (while a task was active): how
               long it was down (doubt.py)
  array:<id>   an array's progress (arrays.py)
  aelem:<id>   an array element whose end that progress has not counted yet (arrays.py)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .. import model as m
from .. import wire
from ..cluster import handoff as h
from ..policy import gpu as gpupol
from ..policy import shares as sh
from . import events as ev

HOME = "home:"
GUEST = "guest:"
TOMB = "tomb:"
ADOPT = "adopt:"
REPLICA = "replica:"  # a copy of another home's task kept here (replicas.py)
REPLICAS = "repls:"  # the nodes keeping copies of a task whose home is here
STRAYS = "strays:"  # nodes that may keep a stray copy of it (replicas.py)
GPU = "gpu:"
GLOBALS_KEY = "globals"
ALIVE_AT = "alive_at"  # the last heartbeat's wall time (doubt.py)
USAGE_KEY = "usage"  # this node's decayed usage per principal (fair share, runqueue.py)
TOMB_TTL = 600.0  # seconds a guest tombstone is kept


class Handoffs:
    """Both handoff sides of this node plus what their journal keys need: which tasks
    have a guest key (only those need a delete when their entry goes) and when each
    tombstone was made (wall time, so it survives restarts)."""

    def __init__(self, node: m.NodeId) -> None:
        self.node = node
        self.home = h.HomeSide(node)
        self.guest = h.GuestSide(node)
        self.tomb_at: dict[m.TaskId, float] = {}
        # the epoch each tombstone key holds: not rewritten unchanged (stop 54: each
        # revoke resent to a node down rewrote its task's tombstone, durably)
        self.tomb_written: dict[m.TaskId, int] = {}
        self.guest_keys: set[m.TaskId] = set()

    def persist_ops(self, task_ids: Iterable[m.TaskId], wall: float) -> list[ev.Put | ev.Delete]:
        ops: list[ev.Put | ev.Delete] = []
        for tid in set(task_ids):
            he = self.home.entries.get(tid)
            if he is not None:
                # an unchanged entry is not rewritten: a burst of placements retried
                # thousands of offers at once, each changing only its timers
                fields = _journaled_fields(he)
                if he.journaled != fields:
                    he.journaled = fields
                    ops.append(ev.Put(HOME + tid, h.home_entry_to_wire(he)))
            ge = self.guest.entries.get(tid)
            if ge is not None:
                ops.append(ev.Put(GUEST + tid, h.guest_entry_to_wire(ge)))
                self.guest_keys.add(tid)
            else:
                if tid in self.guest_keys:
                    ops.append(ev.Delete(GUEST + tid))
                    self.guest_keys.discard(tid)
                epoch = self.guest.tombstones.get(tid)
                if epoch is not None and self.tomb_written.get(tid) != epoch:
                    self.tomb_at.setdefault(tid, wall)
                    self.tomb_written[tid] = epoch
                    ops.append(ev.Put(TOMB + tid, [epoch, self.tomb_at[tid]]))
        return ops

    def expire_tombstones(self, wall: float) -> list[ev.Put | ev.Delete]:
        cutoff = wall - TOMB_TTL
        ops: list[ev.Put | ev.Delete] = []
        for tid in [t for t, at in self.tomb_at.items() if at < cutoff]:
            self.tomb_at.pop(tid, None)
            self.tomb_written.pop(tid, None)
            self.guest.tombstones.pop(tid, None)
            ops.append(ev.Delete(TOMB + tid))
        return ops


def restore(
    kv: Mapping[str, Any],
    wall: float,
    handoffs: Handoffs,
    active: Mapping[m.TaskId, m.Task],
    gpus: gpupol.GpuAllocator,
) -> tuple[sh.GlobalTasks | None, list[ev.Instruction]]:
    """Rebuild the handoff sides, tombstones and GPU allocations from journal keys.
    Returns the journaled global-task set (None: none) and what to write or log."""
    out: list[ev.Instruction] = []
    globals_: sh.GlobalTasks | None = None
    gpu_records: list[tuple[m.TaskId, Any]] = []
    for key, value in kv.items():
        try:
            if key.startswith(HOME):
                handoffs.home.restore(h.home_entry_from_wire(value))
            elif key.startswith(GUEST):
                handoffs.guest_keys.add(key[len(GUEST) :])
                handoffs.guest.restore(h.guest_entry_from_wire(value))
            elif key.startswith(TOMB):
                epoch, at = int(value[0]), float(value[1])
                if wall - at < TOMB_TTL:
                    handoffs.guest.tombstones[key[len(TOMB) :]] = epoch
                    handoffs.tomb_at[key[len(TOMB) :]] = at
                    handoffs.tomb_written[key[len(TOMB) :]] = epoch
            elif key == GLOBALS_KEY:
                globals_ = sh.GlobalTasks.from_wire(value)
            elif key.startswith(GPU):
                gpu_records.append((key[len(GPU) :], value))
        except (wire.WireError, TypeError, ValueError, IndexError) as e:
            out.append(ev.log("error", "coordinator.bad_state", key=key, error=str(e)))
    out += restore_gpus(gpu_records, active, gpus)
    return globals_, out


def restore_gpus(
    records: list[tuple[m.TaskId, Any]],
    active: Mapping[m.TaskId, m.Task],
    gpus: gpupol.GpuAllocator,
) -> list[ev.Instruction]:
    """Journaled GPU allocations of tasks still active come back (a re-queued task
    restarts on the same devices); those of finished tasks are released."""
    out: list[ev.Instruction] = []
    allocs = []
    for tid, rec in records:
        try:
            a = gpupol.Allocation.from_record(rec)
        except (gpupol.GpuAllocationError, TypeError, ValueError) as e:
            out.append(ev.log("error", "gpu.bad_record", task=tid, error=str(e)))
            out.append(ev.Persist((ev.Delete(GPU + tid),)))
            continue
        if tid not in active:
            out.append(ev.Persist((ev.Delete(GPU + tid),)))
            continue
        allocs.append(a)
    for tid, why in gpus.restore(allocs):
        out.append(ev.log("warning", "gpu.restore_refused", task=tid, reason=why))
        out.append(ev.Persist((ev.Delete(GPU + tid),)))
    return out


def interrupted_offers(active: Mapping[m.TaskId, m.Task], handoffs: Handoffs) -> list[m.TaskId]:
    """After a restart: tasks shown in transfer whose home entry says no offer is out
    (the restart interrupted it before it was journaled): they are queued here again."""
    out = []
    for t in active.values():
        e = handoffs.home.entries.get(t.id)
        if t.state is m.TaskState.TRANSFERRING and (e is None or e.phase is h.HomePhase.LOCAL):
            out.append(t.id)
    return out


def _journaled_fields(he: h.HomeEntry) -> tuple[Any, ...]:
    """The fields of a home entry that its journal key holds, but its spec (which an
    entry never changes)."""
    return (
        he.epoch,
        he.next_epoch,
        he.where,
        he.phase,
        he.target,
        he.offer_epoch,
        he.offer_from,
        he.commit_unacked,
        he.cancel_unacked,
        tuple(sorted(he.revokes.items())),
    )
