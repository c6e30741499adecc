"""Gangs in the node (issue 22): the protocol core (cluster/gang*.py) on real records.

A gang is one task record at its home (`spec.gang` set) that never runs itself: a
`Coordinator` here runs its rounds. Every node keeps one `HoldBook` for the gangs of
all homes; a commit turns its hold into *member* records (`spec.member` set), local
tasks of the node that runs them, started at once (the hold kept their slots free).

What this part adds to the pure core:
- **where members go** (`NeedTargets`): `policy/gangplace.place_members`, two choices
  per member over this node and the peers' gossiped room;
- **the room a prepare finds**: free slots (running tasks and other holds counted),
  none while draining, none when the submitter may not run here or the node's
  labels miss a hard constraint, and the GPU slices the members need (a hold keeps
  its slices allocated, so a single task cannot take them before the commit);
- **records**: a round is journaled before its first prepare (a restarted home never
  numbers two rounds alike); the gang's record goes RUNNING when every member
  started, QUEUED when it restarts as a whole, and ends with the worst member's exit;
- **members**: id `GANG.RANK` (`GANG.RANK.RUN` from the second start on), the
  environment torchrun expects (`SWARM_GANG_ID`, `SWARM_RANK`, `SWARM_WORLD_SIZE`,
  `SWARM_LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), run under the run lease: the
  supervisor kills a member whose lease lapsed (`gang_deadline`, `RenewLease`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import attrs

from .. import model as m
from ..cluster import gang as g
from ..cluster.gangcoord import Coordinator
from ..cluster.gangholds import HoldBook
from ..cluster.gangholds import Phase as HoldPhase
from ..cluster.gangstate import Phase as CoordPhase
from ..policy import constraints as cons
from ..policy import gangplace
from ..policy import gpu as gpupol
from ..policy import shares as sh
from ..policy.view import LoadView
from . import events as ev
from .recovery import GPU

S = m.TaskState
GANG = "gang:"  # journal key: gang:<id> -> {"round": the newest round numbered}
HOLD_GPU = "#hold"  # a hold's GPU slice is allocated as "<gang>#hold<slot>"


def gang_spec(spec: m.TaskSpec) -> g.GangSpec:
    """The protocol's view of a gang record's request."""
    assert spec.gang is not None
    r = spec.gang
    mode = g.Mode.NONSTRICT if r.mode == "nonstrict" else g.Mode.STRICT
    return g.GangSpec(spec.id, r.size, mode, r.min_available, restart=r.restart, timeout=r.timeout)


def member_id(gang: m.TaskId, rank: int, run: int) -> m.TaskId:
    """`job.3~alice` for rank 3 of gang `job~alice` (`.RUN` from the second start on)."""
    base, sep, owner = gang.partition("~")
    suffix = f".{rank}" if run <= 1 else f".{rank}.{run}"
    return f"{base}{suffix}{sep}{owner}"


@attrs.frozen
class Commitment:
    """What a member's node needs from a commit beyond the protocol's message: the
    gang's spec, which start of the gang this is, and rank 0's address."""

    spec: m.TaskSpec
    run: int
    master_addr: str


class Gangs:
    """The gang rules of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: Any
    ledger: sh.ShareLedger
    gpus: gpupol.GpuAllocator
    view: LoadView
    rng: random.Random
    slots: int
    running: Any
    queued: Any
    label_map: dict[str, str]
    due: dict[str, float]
    admission_hook: Callable[[m.TaskSpec], str | None] | None
    report_max_age: float | None
    gang_book: HoldBook
    gang_coords: dict[m.TaskId, Coordinator]
    gang_rounds: dict[m.TaskId, int]  # journaled: the newest round of a gang homed here
    gang_runs: dict[m.TaskId, tuple[int, int]]  # home: gang -> (round, start number)
    gang_starts: dict[m.TaskId, int]  # journaled: rounds of a gang that sent a commit
    gang_timers: g.Timers
    gang_specs: dict[str, m.TaskSpec]  # member side: the gang's spec, from its prepare
    gang_members: dict[tuple[str, int, int], m.TaskId]  # (gang, round, slot) -> member

    def init_gangs(self, timers: g.Timers) -> None:
        self.gang_book = HoldBook(self.node)
        self.gang_coords = {}
        self.gang_rounds = {}
        self.gang_runs = {}
        self.gang_starts = {}
        self.gang_timers = timers
        self.gang_specs = {}
        self.gang_members = {}

    # ------------------------------------------------------------------ reads

    def gang_held(self) -> int:
        """Slots kept for gangs and not running yet: no other task may take them."""
        return self.gang_book.held_slots()

    def gang_deadline(self, tid: m.TaskId) -> float | None:
        """A member's run lease (this node's clock), for its supervisor; None: not a
        member, or nothing of its round is here any more (it must not start)."""
        t = self.records.active.get(tid)
        if t is None or t.spec.member is None:
            return None
        role = t.spec.member
        e = self.gang_book.entries.get(role.gang)
        if e is None or e.round != role.round or e.phase is not HoldPhase.RUNNING:
            return -1.0
        return e.deadline

    def gang_stats(self) -> dict[str, int]:
        """`swarm info`'s gangs: coordinated here; holds and members here."""
        b = self.gang_book
        return {
            "coordinating": len(self.gang_coords),
            "holds": b.holds(),
            "held_slots": b.held_slots(),
            "members_running": b.running_slots(),
            "holds_granted": b.granted,
            "prepares_refused": b.refused,
            "holds_lapsed": b.lapsed_holds,
            "runs_lapsed": b.lapsed_runs,
        }

    def gang_explain(self, tid: m.TaskId) -> str | None:
        """Where a gang homed here stands (`swarm explain`)."""
        c = self.gang_coords.get(tid)
        if c is None:
            return None
        sp = c.spec
        what = f"gang of {sp.size} ({sp.mode.value}" + (
            f", at least {sp.min_available})" if sp.mode is g.Mode.NONSTRICT else ")"
        )
        return f"{what}: {c.phase.value}, {c.rounds} rounds tried; {c.why}"

    # ------------------------------------------------------------------ stimuli

    def gang_submitted(self, tid: m.TaskId, now: float, wall: float) -> list[ev.Instruction]:
        """A gang's record was written here: its coordinator starts (or, after a
        restart, resumes after its last journaled round, once a lease has lapsed)."""
        t = self.records.active.get(tid)
        if t is None or t.spec.gang is None or tid in self.gang_coords:
            return []
        last = self.gang_rounds.get(tid, 0)
        c = Coordinator(
            gang_spec(t.spec), self.node, now, self.rng, self.gang_timers, first_round=last + 1
        )
        out: list[ev.Instruction] = []
        if last:  # members of a round we may have started could still hold a lease
            c.wait_until = now + self.gang_timers.lapse_wait()
            if t.state is S.RUNNING:  # its home restarted: it starts again as a whole
                new = self.records.apply(tid, S.QUEUED, wall, "its home restarted: it starts again")
                out.append(ev.Record(new, durable=True))
        self.gang_coords[tid] = c
        return out + self._gang_out(c.tick(now), now, wall)

    def on_gang_message(
        self,
        src: m.NodeId,
        msg: g.Message,
        now: float,
        wall: float,
        commitment: Commitment | None = None,
        port: int = 0,
    ) -> list[ev.Instruction]:
        if isinstance(msg, (g.Prepare, g.Commit, g.Renew, g.Abort)):
            return self._to_node(src, msg, now, wall, commitment, port)
        c = self.gang_coords.get(msg.gang)
        if c is None:
            return []
        return self._gang_out(c.on_message(now, src, msg), now, wall)

    def gang_tick(self, now: float, wall: float) -> list[ev.Instruction]:
        self.due.pop("gangs", None)
        out = self._gang_out(self.gang_book.tick(now), now, wall)
        for c in list(self.gang_coords.values()):
            out += self._gang_out(c.tick(now), now, wall)
        return out

    def gang_node_dead(self, node: m.NodeId, now: float, wall: float) -> list[ev.Instruction]:
        out: list[ev.Instruction] = []
        for c in list(self.gang_coords.values()):
            out += self._gang_out(c.on_node_dead(now, node), now, wall)
        return out

    def gang_view_changed(self, now: float, wall: float) -> list[ev.Instruction]:
        """A peer's report came: a gang backing off for want of room looks again."""
        out: list[ev.Instruction] = []
        for c in list(self.gang_coords.values()):
            if c.no_room:
                out += self._gang_out(c.poke(now), now, wall)
        return out

    def gang_cancel(self, tid: m.TaskId, why: str, now: float, wall: float) -> list[ev.Instruction]:
        c = self.gang_coords.get(tid)
        if c is None:
            return []
        return self._gang_out(c.cancel(now, why), now, wall)

    def gang_member_ended(self, task: m.Task, now: float, wall: float) -> list[ev.Instruction]:
        role = task.spec.member
        if role is None:
            return []
        self.gang_members.pop((role.gang, role.round, role.slot), None)
        code = m.exit_status(task.exit_code, task.signal) if task.state.terminal else 1
        if task.state is not S.SUCCEEDED and code == 0:
            code = 1  # cancelled or lost before an exit status: not a success
        exits = self.gang_book.on_member_exit(now, role.gang, role.round, role.slot, code)
        return self._gang_out(exits, now, wall)

    # ------------------------------------------------------------------ member side

    def _to_node(
        self,
        src: m.NodeId,
        msg: g.ToNode,
        now: float,
        wall: float,
        commitment: Commitment | None,
        port: int,
    ) -> list[ev.Instruction]:
        room = 0
        if isinstance(msg, g.Prepare) and commitment is not None:
            self.gang_specs[msg.gang] = commitment.spec
            room = self.gang_room(commitment.spec)
        before = self._lease_of(msg.gang)
        out = self.gang_book.on_message(now, src, msg, room, port)
        instrs = self._gang_out(out, now, wall, commitment)
        after = self._lease_of(msg.gang)
        if after is not None and after != before:  # a renewal: the supervisors hear it
            e = self.gang_book.entries[msg.gang]
            for slot in e.running:
                tid = self.gang_members.get((msg.gang, e.round, slot))
                if tid is not None and tid in self.running:
                    instrs.append(ev.RenewLease(tid, after))
        return instrs

    def _lease_of(self, gang: str) -> float | None:
        e = self.gang_book.entries.get(gang)
        return e.deadline if e is not None and e.phase is HoldPhase.RUNNING else None

    def gang_room(self, spec: m.TaskSpec) -> int:
        """How many members of `spec` this node could take now, holds counted."""
        if self.ledger.draining:
            return 0
        if self.admission_hook is not None and self.admission_hook(spec) is not None:
            return 0
        if spec.constraints:
            parsed = [cons.parse_constraint(c) for c in spec.constraints]
            if cons.unmet(parsed, self.label_map) is not None:
                return 0
        room = self.slots - len(self.running) - self.gang_held()
        if spec.gpu is not None:
            room = min(room, gangplace.gpu_room(self.gpus.summary(), spec.gpu))
        return max(room, 0)

    def _start_members(
        self, i: g.StartMembers, now: float, wall: float, c: Commitment | None
    ) -> list[ev.Instruction]:
        spec = c.spec if c is not None else self.gang_specs.get(i.gang)
        if spec is None or spec.id != i.gang:  # no spec came: nothing can start
            return [ev.log("warning", "gang.no_spec", gang=i.gang, round=i.round)]
        run = c.run if c is not None else 1
        addr = c.master_addr if c is not None else ""
        out: list[ev.Instruction] = []
        local = sorted(i.ranks.values())
        for slot, rank in sorted(i.ranks.items()):
            tid = member_id(spec.id, rank, run)
            if self.records.get_cached(tid) is not None:  # never: starts are journaled
                return [ev.log("error", "gang.member_exists", gang=i.gang, task=tid)]
            env = {
                **spec.env,
                "SWARM_GANG_ID": spec.id,
                "SWARM_RANK": str(rank),
                "SWARM_WORLD_SIZE": str(i.world),
                "SWARM_LOCAL_RANK": str(local.index(rank)),
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(i.port),
            }
            role = m.GangRole(spec.id, spec.home, i.round, slot, rank, i.world)
            mspec = attrs.evolve(
                spec,
                id=tid,
                name=spec.name,
                env=env,
                home=self.node,
                gang=None,
                member=role,
                after=(),  # the gang waited for its parents already
                no_retry=True,
                migrate=m.MigrateMode.NEVER,
                submitted_at=wall,
            )
            task = m.new_task(mspec, wall, self.node, f"gang {spec.id} rank {rank}")
            self.records.store(task)
            self.gang_members[(i.gang, i.round, slot)] = tid
            out.append(ev.Record(task))
            out += self._member_gpu(i.gang, slot, mspec)
            out.append(ev.StartNow(tid))
        return out

    def _member_gpu(self, gang: str, slot: int, spec: m.TaskSpec) -> list[ev.Instruction]:
        """The hold's GPU slice becomes the member's (the gate finds it allocated)."""
        if spec.gpu is None:
            return []
        self.gpus.release(f"{gang}{HOLD_GPU}{slot}")
        try:
            a = self.gpus.allocate(spec.id, spec.gpu)
        except (gpupol.GpuRequestError, gpupol.GpuAllocationError):
            return []
        if a is None:
            return []
        return [ev.Persist((ev.Put(GPU + spec.id, a.to_record()),))]

    def _holds_changed(self, gang: str) -> list[ev.Instruction]:
        """Keep GPU slices allocated for held slots (and only for those)."""
        e = self.gang_book.entries.get(gang)
        spec = self.gang_specs.get(gang)
        held = e.slots if e is not None and e.phase is HoldPhase.HELD else ()
        for a in self.gpus.allocations():
            key = a.task_id
            if key.startswith(f"{gang}{HOLD_GPU}"):
                slot = int(key.rsplit(HOLD_GPU, 1)[1])
                if slot not in held:
                    self.gpus.release(key)
        if spec is not None and spec.gpu is not None:
            for slot in held:
                key = f"{gang}{HOLD_GPU}{slot}"
                if self.gpus.get(key) is None:
                    try:
                        self.gpus.allocate(key, spec.gpu)
                    except (gpupol.GpuRequestError, gpupol.GpuAllocationError):
                        pass
        if e is None and not any(k[0] == gang for k in self.gang_members):
            self.gang_specs.pop(gang, None)
        return [ev.KickRunner(), ev.LoadChanged()]

    # ------------------------------------------------------------------ home side

    def _targets(self, c: Coordinator, now: float) -> tuple[list[m.NodeId] | None, str]:
        t = self.records.active.get(c.spec.gang)
        if t is None:
            return None, "the gang's record is gone"
        spec = t.spec
        cands: list[tuple[m.NodeId, int]] = [(self.node, self.gang_room(spec))]
        parsed = [cons.parse_constraint(x) for x in spec.constraints]
        for node in self.view:
            e = self.view[node]
            if self.report_max_age is not None and now - e.received_at > self.report_max_age:
                continue
            cands.append((node, gangplace.report_room(e.report, spec, parsed)))
        return gangplace.place_members(c.spec.size, cands, self.rng)

    def _gang_out(
        self,
        instrs: list[g.Instruction],
        now: float,
        wall: float,
        commitment: Commitment | None = None,
    ) -> list[ev.Instruction]:
        """The protocol's instructions as the node's."""
        out: list[ev.Instruction] = []
        for i in instrs:
            if isinstance(i, g.Send):
                out += self._send(i)
            elif isinstance(i, g.WakeAt):
                at = min(self.due.get("gangs", i.at), i.at)
                self.due["gangs"] = at
                out.append(ev.WakeAt(at))
            elif isinstance(i, g.NeedTargets):
                c = self.gang_coords.get(i.gang)
                if c is not None:
                    targets, why = self._targets(c, now)
                    out += self._gang_out(c.on_targets(now, targets, why), now, wall)
            elif isinstance(i, g.RoundStarted):
                self.gang_rounds[i.gang] = i.round
                out.append(self._round_key(i.gang, i.round))
            elif isinstance(i, g.GangRunning):
                out += self._gang_running(i, wall)
            elif isinstance(i, g.GangEnded):
                out += self._gang_ended(i, wall)
            elif isinstance(i, g.StartMembers):
                out += self._start_members(i, now, wall, commitment)
            elif isinstance(i, g.StopMembers):
                for slot in i.slots:
                    tid = self.gang_members.get((i.gang, i.round, slot))
                    if tid is not None:
                        out.append(ev.StopRun(tid, f"gang {i.gang}: {i.reason}"))
            elif isinstance(i, g.HoldChanged):
                out += self._holds_changed(i.gang)
        return out + self._restarting(wall)

    def _send(self, i: g.Send) -> list[ev.Instruction]:
        """A prepare and a commit carry the gang's spec; a commit which start of the
        gang it is (its members' ids). The first commit of a round counts a start, and
        the count is journaled before the commit leaves, so that no two starts of a
        gang ever give their members the same ids (a restarted home included)."""
        msg = i.msg
        if not isinstance(msg, (g.Prepare, g.Commit)):
            return [ev.SendGang(i.to, msg)]
        t = self.records.active.get(msg.gang)
        spec = t.spec if t is not None else None
        if isinstance(msg, g.Prepare):
            return [ev.SendGang(i.to, msg, spec)]
        out: list[ev.Instruction] = []
        rnd, run = self.gang_runs.get(msg.gang, (0, 0))
        if rnd != msg.round:
            run = self.gang_starts.get(msg.gang, 0) + 1
            self.gang_starts[msg.gang] = run
            self.gang_runs[msg.gang] = (msg.round, run)
            out.append(self._round_key(msg.gang, msg.round))
        return [*out, ev.SendGang(i.to, msg, spec, run)]

    def _round_key(self, gang: m.TaskId, rnd: int) -> ev.Persist:
        value = {"round": rnd, "starts": self.gang_starts.get(gang, 0)}
        return ev.Persist((ev.Put(GANG + gang, value),), durable=True)

    def _gang_running(self, i: g.GangRunning, wall: float) -> list[ev.Instruction]:
        t = self.records.active.get(i.gang)
        if t is None or t.state is not S.QUEUED:
            return []
        where = ", ".join(f"{r}:{n}" for r, n in sorted(i.nodes.items()))
        new = self.records.apply(
            i.gang, S.RUNNING, wall, f"gang running, round {i.round}: {where}", node=self.node
        )
        return [ev.Record(new, durable=True), ev.log("info", "gang.running", gang=i.gang)]

    def _gang_ended(self, i: g.GangEnded, wall: float) -> list[ev.Instruction]:
        c = self.gang_coords.pop(i.gang, None)
        self.gang_runs.pop(i.gang, None)
        self.gang_rounds.pop(i.gang, None)
        self.gang_starts.pop(i.gang, None)
        t = self.records.active.get(i.gang)
        out: list[ev.Instruction] = [ev.Persist((ev.Delete(GANG + i.gang),))]
        if t is None:
            return out
        codes = [c_ for c_ in i.exits.values() if c_ != 0]
        code = max(codes) if codes else (0 if i.ok else None)
        if i.ok:
            dst = S.SUCCEEDED
        elif c is not None and c.why.startswith("cancel"):
            dst = S.CANCELLED
        else:
            dst = S.FAILED
        new = self.records.apply(i.gang, dst, wall, i.reason, exit_code=code)
        return [*out, ev.Record(new, durable=True)]

    def _restarting(self, wall: float) -> list[ev.Instruction]:
        """A running gang whose round failed and that restarts as a whole: QUEUED."""
        out: list[ev.Instruction] = []
        for tid, c in self.gang_coords.items():
            t = self.records.active.get(tid)
            if t is not None and t.state is S.RUNNING and c.phase is CoordPhase.WAITING:
                new = self.records.apply(tid, S.QUEUED, wall, f"gang restarts: {c.why}")
                out.append(ev.Record(new, durable=True))
        return out


def restore_gang_rounds(kv: dict[str, Any]) -> tuple[dict[m.TaskId, int], dict[m.TaskId, int]]:
    """The newest round numbered, and the starts counted, for each gang homed here
    (journal keys gang:<id>)."""
    rounds: dict[m.TaskId, int] = {}
    starts: dict[m.TaskId, int] = {}
    for key, v in kv.items():
        if key.startswith(GANG) and isinstance(v, dict) and isinstance(v.get("round"), int):
            rounds[key[len(GANG) :]] = v["round"]
            if isinstance(v.get("starts"), int):
                starts[key[len(GANG) :]] = v["starts"]
    return rounds, starts
