"""The handoff protocol under loss, duplication, reordering and crashes.

A home and two executors exchange handoff messages over a simulated network that
drops, duplicates and reorders; executors crash and restart from what they
persisted; the home declares a crashed executor dead. At every step at most one
node may be running the task (or hold it runnable), and once the faults stop the
task finishes with exactly one accepted result.
"""

from __future__ import annotations

import random
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import wire
from swarm.cluster import handoff as h
from swarm.model import TaskSpec

SPEC = TaskSpec(id="t1", argv=("work",), home="H")
NODES = ("A", "B")


class World:
    def __init__(self, seed: int, loss: float, dup: float, crash: float, moves: bool) -> None:
        self.rng = random.Random(seed)
        self.loss, self.dup, self.crash_p, self.moves = loss, dup, crash, moves
        self.now = 0.0
        self.home = h.HomeSide("H")
        self.guests = {n: h.GuestSide(n) for n in NODES}
        self.persisted: dict[str, dict[str, h.GuestEntry]] = {n: {} for n in NODES}
        self.tombs: dict[str, dict[str, int]] = {n: {} for n in NODES}
        self.down: set[str] = set()
        self.net: list[tuple[str, str, Any, Any]] = []  # (src, dst, request, reply-or-None)
        self.home_local = True  # the home holds it runnable
        self.home_running = False
        self.local_done = False
        self.finals: list[h.Report] = []
        self.runs = 0
        self.home.track(SPEC)
        self.home_saved = _copy_home(self.home.entries["t1"])

    # --- helpers
    def emit(self, src: str, outs: list[h.Output]) -> None:
        for o in outs:
            if isinstance(o, h.Send):
                self.net.append((src, o.dest, o.request, None))
            elif isinstance(o, h.Reported):
                if o.report.final:
                    self.finals.append(o.report)
            elif isinstance(o, (h.OfferFailed, h.HolderLost)):
                if self.home.entries["t1"].phase is h.HomePhase.LOCAL:
                    self.home_local = True
            elif isinstance(o, h.Committed):
                if o.node == "H":
                    self.home_local = True
            elif isinstance(o, h.RunNow):
                pass
            elif isinstance(o, h.Kill):
                g = self.guests[src]
                e = g.entries.get(o.task_id)
                if e is not None and e.running:
                    self.emit(src, g.finished(h.Report("t1", e.epoch, "cancelled"), self.now))
            elif isinstance(o, h.Drop):
                pass
        for n in NODES:
            self.persisted[n] = {k: _copy(v) for k, v in self.guests[n].entries.items()}
            self.tombs[n] = dict(self.guests[n].tombstones)
        if "H" not in self.down:
            self.home_saved = _copy_home(self.home.entries["t1"])

    def runnable_places(self) -> list[str]:
        places = []
        e = self.home.entries["t1"]
        if (
            e.phase is h.HomePhase.LOCAL
            and not self.local_done
            and (self.home_local or self.home_running)
        ):
            places.append("H")
        for n in NODES:
            if n in self.down:
                continue
            ge = self.guests[n].entries.get("t1")
            if ge is not None and (ge.phase is h.GuestPhase.READY or ge.running):
                places.append(n)
        return places

    # --- one random step
    def step(self, faults: bool) -> None:
        # the node's retry timer reads `pending` instead of scanning (issue 23)
        assert self.home.pending or not any(True for _ in self.home.busy())
        self.now += self.rng.uniform(0.05, 0.6)
        r = self.rng.random()
        e = self.home.entries["t1"]
        if "H" in self.down and r < 0.12:
            return
        if (
            r < 0.08
            and e.phase is h.HomePhase.LOCAL
            and not self.local_done
            and not self.home_running
        ):
            target = self.rng.choice(NODES)
            if target not in self.down or faults:
                self.home_local = False
                self.emit("H", self.home.offer(SPEC, target, self.now))
        elif r < 0.12 and e.phase is h.HomePhase.LOCAL and self.home_local and not self.local_done:
            # the home runs it itself and finishes
            self.home_running = True
            self.runs += 1
            self.local_done = True
            self.home_running = False
            self.finals.append(h.Report("t1", e.epoch, "succeeded"))
            e.phase = h.HomePhase.DONE
            self.emit("H", [])  # journaled
        elif r < 0.45 and self.net:
            i = self.rng.randrange(len(self.net))
            src, dst, req, rep = self.net.pop(i)
            if faults and self.rng.random() < self.dup:
                self.net.append((src, dst, req, rep))
            if faults and self.rng.random() < self.loss:
                if rep is None and src not in self.down:
                    self.feed_reply(src, dst, req, None)
                return
            if rep is None:
                if dst in self.down:
                    if src not in self.down:
                        self.feed_reply(src, dst, req, None)
                    return
                reply = self.handle(dst, src, req)
                self.net.append((src, dst, req, reply))
            elif src not in self.down:
                self.feed_reply(src, dst, req, rep)
        elif r < 0.6:
            n = self.rng.choice(NODES)
            if n not in self.down:
                g = self.guests[n]
                ge = g.entries.get("t1")
                if ge is not None and ge.phase is h.GuestPhase.READY and not ge.running:
                    if self.moves and self.rng.random() < 0.3:
                        other = self.rng.choice([x for x in (*NODES, "H") if x != n])
                        self.emit(n, g.request_move("t1", other, self.now))
                    else:
                        self.runs += 1
                        self.emit(n, g.started("t1", self.now))
                elif ge is not None and ge.running:
                    rep = h.Report("t1", ge.epoch, "succeeded", exit_code=0, at=self.now)
                    self.emit(n, g.finished(rep, self.now))
        elif r < 0.62 and faults and self.rng.random() < self.crash_p * 10:
            n = self.rng.choice(NODES)
            if n not in self.down:
                self.down.add(n)
                self.net = [m for m in self.net if m[0] != n]
                if "H" not in self.down:
                    self.emit("H", self.home.on_node_dead(n, self.now))
        elif r < 0.63 and faults and "H" not in self.down and self.rng.random() < self.crash_p * 5:
            self.down.add("H")  # the home crashes; it restarts from its journal
            self.net = [m for m in self.net if m[0] != "H"]
        elif r < 0.7 and self.down:
            n = self.rng.choice(sorted(self.down))
            self.down.discard(n)
            if n == "H":
                self.home = h.HomeSide("H")
                self.home.restore(_copy_home(self.home_saved))
                return
            g = self.guests[n] = h.GuestSide(n)
            for ent in self.persisted[n].values():
                g.restore(_copy(ent))
            g.tombstones.update(self.tombs[n])
        else:
            if "H" not in self.down:
                self.emit("H", self.home.tick(self.now))
            for n in NODES:
                if n not in self.down:
                    self.emit(n, self.guests[n].tick(self.now))

    def handle(self, dst: str, src: str, req: Any) -> h.Reply:
        if dst == "H":
            if isinstance(req, h.Query):
                reply, outs = self.home.on_query(src, req)
                self.emit("H", outs)
                return reply
            if isinstance(req, h.MoveRequest):
                reply, outs = self.home.on_move_request(src, req, self.now)
                self.emit("H", outs)
                return reply
            if isinstance(req, h.Report):
                reply, outs = self.home.on_report(src, req)
                self.emit("H", outs)
                return reply
            raise AssertionError(req)
        g = self.guests[dst]
        if isinstance(req, h.Offer):
            refusal = None if self.rng.random() < 0.8 else "busy"
            reply, _ = g.on_offer(src, req, self.now, refusal)
            self.emit(dst, [])
            return reply
        if isinstance(req, h.Commit):
            reply, outs = g.on_commit(req, self.now)
        elif isinstance(req, h.Abort):
            reply, outs = g.on_abort(req)
        elif isinstance(req, h.Revoke):
            reply, outs = g.on_revoke(req)
        elif isinstance(req, h.Cancel):
            reply, outs = g.on_cancel(req)
        else:
            raise AssertionError(req)
        self.emit(dst, outs)
        return reply

    def feed_reply(self, src: str, dst: str, req: Any, reply: h.Reply | None) -> None:
        if src == "H":
            self.emit("H", self.home.on_reply(dst, req, reply, self.now))
        else:
            self.emit(src, self.guests[src].on_reply(dst, req, reply, self.now))


def _copy_home(e: h.HomeEntry) -> h.HomeEntry:
    return h.home_entry_from_wire(wire.unpack(wire.pack(h.home_entry_to_wire(e))))


def _copy(e: h.GuestEntry) -> h.GuestEntry:
    return h.guest_entry_from_wire(wire.unpack(wire.pack(h.guest_entry_to_wire(e))))


@settings(max_examples=250, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    loss=st.sampled_from([0.0, 0.1, 0.3]),
    dup=st.sampled_from([0.0, 0.1, 0.3]),
    crash=st.sampled_from([0.0, 0.01, 0.03]),
    moves=st.booleans(),
)
def test_one_place_at_a_time_and_exactly_one_result(
    seed: int, loss: float, dup: float, crash: float, moves: bool
) -> None:
    w = World(seed, loss, dup, crash, moves)
    for _ in range(400):
        w.step(faults=True)
        assert len(w.runnable_places()) <= 1, (w.runnable_places(), w.home.entries["t1"])
    # heal: every node comes back, no more faults; the task must finish exactly once
    if "H" in w.down:
        w.down.discard("H")
        w.home = h.HomeSide("H")
        w.home.restore(_copy_home(w.home_saved))
    for n in sorted(w.down):
        w.down.discard(n)
        g = w.guests[n] = h.GuestSide(n)
        for ent in w.persisted[n].values():
            g.restore(_copy(ent))
        g.tombstones.update(w.tombs[n])
    for _ in range(4000):
        if (
            w.finals
            and not w.home.entries["t1"].revokes
            and not any(g.entries for g in w.guests.values())
        ):
            break
        w.step(faults=False)
        assert len(w.runnable_places()) <= 1
    assert len(w.finals) == 1, w.finals
    assert w.home.entries["t1"].phase is h.HomePhase.DONE
    assert all(not g.entries for g in w.guests.values()), {
        n: g.entries for n, g in w.guests.items()
    }


def test_wire_round_trip_of_every_request() -> None:
    reqs: list[h.Request] = [
        h.Offer("t1", 3, SPEC),
        h.Commit("t1", 3),
        h.Abort("t1", 3),
        h.Query("t1", 3),
        h.MoveRequest("t1", 3, "B"),
        h.Revoke("t1", 3),
        h.Cancel("t1", 3),
        h.Report("t1", 3, "failed", exit_code=2, reason="exited 2", at=5.0),
    ]
    for r in reqs:
        assert h.request_from_wire(wire.unpack(wire.pack(h.request_to_wire(r)))) == r
    rep = h.Reply("t1", 3, True, h.Verdict.YOURS, "x")
    assert h.reply_from_wire(h.reply_to_wire(rep)) == rep


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["kind", "task_id", "epoch", "spec", "x"]),
        st.integers() | st.text(max_size=5),
    )
)
def test_decoder_rejects_junk_with_wire_errors_only(obj: dict[str, Any]) -> None:
    try:
        h.request_from_wire(obj)
    except wire.WireError:
        pass


def test_stale_report_is_rejected_and_revoked() -> None:
    home = h.HomeSide("H")
    home.offer(SPEC, "A", 0.0)
    outs = home.on_offer_reply(h.Offer("t1", 1, SPEC), h.Reply("t1", 1, True), 0.1)
    assert any(isinstance(o, h.Committed) for o in outs)
    assert any(isinstance(o, h.HolderLost) for o in home.on_node_dead("A", 1.0))
    reply, outs = home.on_report("A", h.Report("t1", 1, "succeeded", exit_code=0))
    assert not reply.ok and reply.verdict is h.Verdict.GONE and outs == []
    assert home.entries["t1"].revokes == {"A": 1}


def test_restarted_guest_asks_before_running() -> None:
    g = h.GuestSide("A")
    reply, entry = g.on_offer("H", h.Offer("t1", 1, SPEC), 0.0, None)
    assert reply.ok and entry is not None
    _, outs = g.on_commit(h.Commit("t1", 1), 0.1)
    assert outs == [h.RunNow("t1")]
    g2 = h.GuestSide("A")
    g2.restore(_copy(entry))
    assert not g2.may_run("t1")
    sends = g2.tick(1.0)
    q = h.Query("t1", 1, g2.entries["t1"].seq)
    assert sends == [h.Send("H", q)]
    outs = g2.on_reply("H", q, h.Reply("t1", 1, True, h.Verdict.YOURS), 1.1)
    assert outs == [h.RunNow("t1")] and g2.may_run("t1")


def test_only_a_settled_home_entry_can_be_forgotten() -> None:
    home = h.HomeSide("H")
    assert home.settled("t1") and not home.forget("t1")  # nothing tracked
    home.offer(SPEC, "A", 0.0)
    assert not home.settled("t1") and not home.forget("t1")  # offered: in flight
    home.on_offer_reply(h.Offer("t1", 1, SPEC), h.Reply("t1", 1, True), 0.1)
    assert not home.settled("t1")  # held by A
    reply, _ = home.on_report("A", h.Report("t1", 1, "succeeded", exit_code=0))
    assert reply.ok and home.entries["t1"].phase is h.HomePhase.DONE
    assert home.settled("t1") and home.forget("t1") and "t1" not in home.entries
    # a revoke still owed to a former holder pins the entry
    home.offer(SPEC, "A", 2.0)
    home.on_offer_reply(h.Offer("t1", 1, SPEC), h.Reply("t1", 1, True), 2.1)
    home.on_node_dead("A", 3.0)
    home.on_report("A", h.Report("t1", 1, "succeeded", exit_code=0))
    assert home.entries["t1"].revokes == {"A": 1}
    assert not home.settled("t1") and not home.forget("t1")


def test_a_guest_with_nothing_to_send_is_parked_until_it_has() -> None:
    """tick() parks an entry that has nothing to resend (issue 23: thousands of queued
    guests were looked at on every tick); a start, an end or a move wakes it."""
    g = h.GuestSide("A")
    g.on_offer("H", h.Offer("t1", 1, SPEC), 0.0, None)
    g.on_commit(h.Commit("t1", 1), 0.1)
    assert g.tick(10.0) == [] and g.entries["t1"].next_at == float("inf")
    (started,) = g.started("t1", 11.0)
    assert g.tick(100.0) == [started]  # unanswered: sent again
    g.on_reply("H", started.request, h.Reply("t1", 1, True), 100.1)
    assert g.tick(200.0) == [] and g.entries["t1"].next_at == float("inf")
    (final,) = g.finished(h.Report("t1", 1, "succeeded", exit_code=0, at=201.0), 201.0)
    assert g.tick(300.0) == [final]
    g2 = h.GuestSide("B")
    g2.on_offer("H", h.Offer("t2", 1, attrs.evolve(SPEC, id="t2")), 0.0, None)
    g2.on_commit(h.Commit("t2", 1), 0.1)
    assert g2.tick(10.0) == []
    (move,) = g2.request_move("t2", "C", 11.0)
    assert g2.tick(100.0) == [h.Send("H", h.Query("t2", 1, g2.entries["t2"].seq, True))]
    assert move.request == h.MoveRequest("t2", 1, "C")


def test_a_settled_home_entry_is_parked_until_a_revoke_is_owed() -> None:
    """HomeSide.tick parks an entry with nothing unanswered (issue 23); a revoke owed
    later (here: a stale holder's report) is sent at the next tick all the same."""
    home = h.HomeSide("H")
    home.offer(SPEC, "A", 0.0)
    home.on_offer_reply(h.Offer("t1", 1, SPEC), h.Reply("t1", 1, True), 0.1)
    home.on_report("A", h.Report("t1", 1, "running"))  # the commit evidently arrived
    assert home.tick(10.0) == [] and home.entries["t1"].next_at == float("inf")
    reply, _ = home.on_report("B", h.Report("t1", 1, "running"))  # B is not the holder
    assert not reply.ok
    assert home.tick(11.0) == [h.Send("B", h.Revoke("t1", 1))]


def test_the_home_is_pending_while_an_entry_may_have_something_to_resend() -> None:
    """`HomeSide.pending` (the node's retry timer reads it instead of scanning every
    entry) is never False while `busy()` names an entry."""
    home = h.HomeSide("H")
    home.offer(SPEC, "A", 0.0)
    assert home.pending and list(home.busy())
    home.on_offer_reply(h.Offer("t1", 1, SPEC), h.Reply("t1", 1, True), 0.1)
    home.on_report("A", h.Report("t1", 1, "running"))
    home.tick(10.0)  # parked: nothing in flight
    assert not home.pending and not list(home.busy())
    home.on_report("B", h.Report("t1", 1, "running"))  # a revoke is owed to B
    assert home.pending and list(home.busy())
    home.tick(11.0)  # sent; still owed until acknowledged
    assert home.pending


def test_a_later_homes_offer_of_a_task_that_ended_here_is_answered_with_its_end() -> None:
    """Stop 54: a run ended here, its end not taken (its home died); the adopter's
    offer was taken as a new task and run a second time. Now it is taken with the end,
    which goes to the adopter on its commit; a fenced end (a lapsed lease) is not an
    end, and the offer is a new run."""
    g = h.GuestSide("A")
    g.on_offer("H", h.Offer("t1", 1, SPEC), 0.0, None)
    g.on_commit(h.Commit("t1", 1), 0.1)
    g.started("t1", 0.2)
    g.finished(h.Report("t1", 1, "failed", exit_code=3, at=0.5), 0.5)
    home = h.HomeSide("B")  # the adopter
    home.adopt(attrs.evolve(SPEC, home="B"), 2 << 32, finished=False)
    (send,) = home.offer(home.entries["t1"].spec, "A", 9.0)
    later = send.request
    assert isinstance(later, h.Offer) and later.epoch > 2 << 32
    reply, entry = g.on_offer("B", later, 9.0, "full")  # no room needed: it ran
    assert reply.ok and entry is not None and entry.phase is h.GuestPhase.FINISHED
    assert not g.may_run("t1")
    end = h.Report("t1", later.epoch, "failed", exit_code=3, at=0.5)
    assert entry.report == end
    assert g.tick(9.1) == []  # nothing before the commit: the adopter is still offering
    (commit,) = [o for o in home.on_offer_reply(later, reply, 9.1) if isinstance(o, h.Send)]
    assert isinstance(commit.request, h.Commit)
    _, outs = g.on_commit(commit.request, 9.2)
    assert outs == [h.Send("B", end)]  # no RunNow
    reply2, outs2 = home.on_report("A", end)  # taken as its holder's final report
    assert reply2.ok and outs2 == [h.Reported("t1", "A", end)]
    # a fenced run's end is no end: the next offer is a new run
    f = h.GuestSide("A")
    f.on_offer("H", h.Offer("t1", 1, SPEC), 0.0, None)
    f.on_commit(h.Commit("t1", 1), 0.1)
    f.finished(h.Report("t1", 1, "fenced"), 0.5)
    reply, entry = f.on_offer("B", later, 9.0, None)
    assert reply.ok and entry is not None and entry.phase is h.GuestPhase.PENDING


def test_an_offer_of_a_task_whose_run_here_ended_and_was_taken_is_answered_with_its_end() -> None:
    """Stop 55 (copies walk seed 81644): the run ended here and its old home took the
    end (the entry is gone, tombstoned), then died; an adopter whose copy came late
    never heard of the end and offered the task again, and it ran a second time. Now
    the offer is taken with the end the caller read from its record (`ended`); without
    one, or with a fenced one, the offer is a new run."""
    g = h.GuestSide("A")
    g.on_offer("H", h.Offer("t1", 1, SPEC), 0.0, None)
    g.on_commit(h.Commit("t1", 1), 0.1)
    g.started("t1", 0.2)
    g.finished(h.Report("t1", 1, "succeeded", exit_code=0, at=0.5), 0.5)
    done = h.Report("t1", 1, "succeeded", exit_code=0, at=0.5)
    g.on_reply("H", done, h.Reply("t1", 1, True), 0.6)
    assert "t1" not in g.entries and g.tombstones["t1"] == 1  # the end was taken
    later = h.Offer("t1", 2 << 32, attrs.evolve(SPEC, home="B"))
    own = h.Report("t1", 0, "succeeded", exit_code=0, at=0.5)
    reply, entry = g.on_offer("B", later, 9.0, "full", own)  # no room needed: it ran
    assert reply.ok and entry is not None and entry.phase is h.GuestPhase.FINISHED
    assert entry.report == attrs.evolve(own, epoch=later.epoch) and not g.may_run("t1")
    _, outs = g.on_commit(h.Commit("t1", later.epoch), 9.2)
    assert outs == [h.Send("B", entry.report)]  # no RunNow
    for ended in (None, h.Report("t1", 0, "fenced")):
        f = h.GuestSide("A")
        reply, entry = f.on_offer("B", later, 9.0, None, ended)
        assert reply.ok and entry is not None and entry.phase is h.GuestPhase.PENDING
