"""Home failover and replicas (issue 19, pure part): swarm/cluster/succession.py.

Table-driven unit tests of replica choice, adoption, notices and doubt; then property
tests that drive 3-9 nodes' `Succession`s through random membership histories (kills
for good, restarts with the journal, false suspicions, false deaths refuted late,
message delays, clock offsets) on a fake network, and check each adoption against an
independent reading of the adopter's own view, and the end state once views converge.
"""

from __future__ import annotations

import heapq
import itertools
import random
import re
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm import wire
from swarm.cluster.actor import rendezvous_order
from swarm.cluster.membership_events import EventKind, MemberEvent
from swarm.cluster.succession import (
    Adopt,
    Notice,
    NoticeAction,
    Record,
    Rereplicate,
    Succession,
    claim_key,
    notice_from_wire,
    notice_to_wire,
    replica_of,
    replicas_wanted,
)
from swarm.model import Member, MemberState

ALIVE, SUSPECT, DEAD, LEFT = (
    MemberState.ALIVE,
    MemberState.SUSPECT,
    MemberState.DEAD,
    MemberState.LEFT,
)
GRACE = 5.0
NODES = [f"n{i}" for i in range(6)]

# ---------------------------------------------------------------- replicas


@pytest.mark.parametrize(
    ("size", "configured", "want"),
    [
        (0, None, 1),
        (1, None, 1),
        (2, None, 1),
        (3, None, 2),
        (9, None, 2),
        (100, None, 2),
        (5, 1, 1),  # replicas = 1: today's behaviour
        (5, 3, 3),
        (2, 2, 2),  # configured wins below 3
        (2, 3, 2),  # clamped to the cluster
        (5, 0, 1),
        (5, -4, 1),
        (100, 99, 16),  # clamped to MAX_COPIES
    ],
)
def test_replicas_wanted(size: int, configured: int | None, want: int) -> None:
    assert replicas_wanted(size, configured) == want


def test_replica_of_is_the_rendezvous_order_without_the_home() -> None:
    for i in range(50):
        tid = f"task-{i}"
        home = NODES[i % len(NODES)]
        order = rendezvous_order(tid, [n for n in NODES if n != home])
        assert replica_of(tid, home, NODES) == tuple(order[:1])
        assert replica_of(tid, home, NODES, 3) == tuple(order[:3])
        assert home not in replica_of(tid, home, NODES, 5)
        assert replica_of(tid, home, reversed(NODES), 2) == replica_of(tid, home, NODES, 2)
    assert replica_of("t", "n0", ["n0"], 2) == ()
    assert replica_of("t", "n0", [], 1) == ()
    assert replica_of("t", "n0", NODES, 0) == ()
    assert len(replica_of("t", "n0", NODES, 99)) == len(NODES) - 1
    with pytest.raises(ValueError):
        replica_of("t", "n0", NODES, -1)


def test_replicas_are_stable_when_unrelated_members_come_and_go() -> None:
    moved = 0
    for i in range(200):
        tid = f"task-{i}"
        chosen = replica_of(tid, "n0", NODES, 2)
        for other in NODES[1:]:
            if other in chosen:
                continue
            without = [n for n in NODES if n != other]
            assert replica_of(tid, "n0", without, 2) == chosen  # an unrelated one left
        joined = replica_of(tid, "n0", [*NODES, "n9"], 2)
        if "n9" not in joined:
            assert joined == chosen  # an unrelated one joined
        else:
            moved += 1
    assert 0 < moved < 200  # a newcomer takes some tasks' replica seats, not all


def test_replicas_spread_over_members() -> None:
    firsts = {replica_of(f"t{i}", "n0", NODES)[0] for i in range(60)}
    assert firsts == set(NODES[1:])


def test_claims_compare_by_epoch_then_node() -> None:
    assert claim_key(3, "a") > claim_key(2, "z")
    assert claim_key(2, "b") > claim_key(2, "a")
    assert Record("b", 2).key[:2] == claim_key(2, "b")
    # one claimant's records order by version; the version never outweighs a claim
    assert Record("b", 2, version=1).key > Record("b", 2).key
    assert Record("a", 3).key > Record("b", 2, version=9).key


# ------------------------------------------------------------------ adoption


def rec_of(text: str) -> Record:
    """'home epoch runner replicas' ('-': none), e.g. 'h 1 r a,b' or 'a 2 - -'."""
    home, epoch, runner, replicas = text.split()
    return Record(
        home,
        int(epoch),
        None if runner == "-" else runner,
        () if replicas == "-" else tuple(replicas.split(",")),
    )


def events_of(text: str) -> list[tuple[str, MemberState, float]]:
    """'node:state@at ...', e.g. 'h:dead@10 r:alive@0'."""
    out = []
    for item in text.split():
        node, rest = item.split(":")
        state, at = rest.split("@")
        out.append((node, MemberState(state), float(at)))
    return out


# (title, me, our record, membership events in order, now, adopts)
CASES = [
    ("runner: home dead past grace", "r", "h 4 r a", "h:dead@10", 15.0, True),
    ("runner: home dead, grace not over", "r", "h 4 r a", "h:dead@10", 14.9, False),
    ("runner: home only suspect", "r", "h 4 r a", "h:suspect@0", 999.0, False),
    ("runner: home left past grace", "r", "h 4 r -", "h:left@0", 5.0, True),
    ("runner: home never heard of", "r", "h 4 r -", "", 999.0, False),
    ("runner: home dead, then back", "r", "h 4 r -", "h:dead@0 h:alive@3", 99.0, False),
    ("runner: grace from the death", "r", "h 4 r -", "h:suspect@0 h:dead@8", 12.0, False),
    ("runner: dead then left", "r", "h 4 r -", "h:dead@0 h:left@4", 5.0, True),
    ("runner: itself declared dead", "r", "h 4 r -", "h:dead@0 r:dead@1", 99.0, False),
    ("runner: refuted its death", "r", "h 4 r -", "h:dead@0 r:dead@1 r:alive@2", 99.0, True),
    ("replica: queued task", "a", "h 4 - a,b", "h:dead@0", 10.0, True),
    ("replica: queued task, one grace only", "a", "h 4 - a,b", "h:dead@0", 9.9, False),
    ("replica: task runs at its home", "a", "h 4 h a", "h:dead@0", 10.0, True),
    ("replica: runner alive", "a", "h 4 r a", "h:dead@0 r:alive@0", 99.0, False),
    ("replica: runner suspect", "a", "h 4 r a", "h:dead@0 r:suspect@0", 99.0, False),
    ("replica: runner never heard of", "a", "h 4 r a", "h:dead@0", 99.0, False),
    ("replica: runner dead, in grace", "a", "h 4 r a", "h:dead@0 r:dead@6", 10.9, False),
    ("replica: runner dead past grace", "a", "h 4 r a", "h:dead@0 r:dead@6", 11.0, True),
    ("2nd replica: 1st alive", "b", "h 4 - a,b", "h:dead@0 a:alive@0", 99.0, False),
    ("2nd replica: 1st suspect", "b", "h 4 - a,b", "h:dead@0 a:suspect@0", 99.0, False),
    ("2nd replica: 1st never heard of", "b", "h 4 - a,b", "h:dead@0", 99.0, False),
    ("2nd replica: 1st dead, in grace", "b", "h 4 - a,b", "h:dead@0 a:dead@6", 10.9, False),
    ("2nd replica: 1st dead past grace", "b", "h 4 - a,b", "h:dead@0 a:dead@6", 11.0, True),
    ("not a successor", "x", "h 4 r a", "h:dead@0", 99.0, False),
    ("the home itself", "h", "h 4 - a", "h:dead@0", 99.0, False),
]


@pytest.mark.parametrize(
    ("title", "me", "ours", "events", "now", "adopts"), CASES, ids=[c[0] for c in CASES]
)
def test_who_adopts_when(
    title: str, me: str, ours: str, events: str, now: float, adopts: bool
) -> None:
    s = Succession(me, GRACE)
    rec = rec_of(ours)
    s.hold("t1", rec.home, rec.epoch, rec.runner, rec.replicas)
    for node, state, at in events_of(events):
        s.on_member(node, state, at)
    got = [d for d in s.step(now) if isinstance(d, Adopt)]
    if not adopts:
        assert got == [] and s.is_authority("t1") == (me == rec.home)
        return
    assert len(got) == 1
    a = got[0]
    assert (a.task_id, a.from_home, a.epoch, a.as_runner) == ("t1", rec.home, 5, rec.runner == me)
    assert "adopted" in a.reason and rec.home in a.reason
    new = s.record("t1")
    assert new is not None and new.home == me and new.epoch == 5
    assert new.runner == (me if a.as_runner else None)
    assert [d for d in s.step(now + 100) if isinstance(d, Adopt)] == []  # once


def test_an_adopter_picks_new_replicas_among_alive_members() -> None:
    s = Succession("a", GRACE)
    s.hold("t1", "h", 1, None, ("a", "b"))
    for n, state in (("h", DEAD), ("b", ALIVE), ("c", SUSPECT), ("d", ALIVE), ("e", DEAD)):
        s.on_member(n, state, 0.0)
    (a, *_) = s.step(10.0)
    assert isinstance(a, Adopt)
    assert a.replicas == replica_of("t1", "a", ["a", "b", "d"], 2)
    assert "c" not in a.replicas and "e" not in a.replicas


def test_an_adopter_tells_every_member_and_a_returning_home_again() -> None:
    s = Succession("r", GRACE)
    s.hold("t1", "h", 1, "r", ("a",))
    s.on_event(MemberEvent(EventKind.JOINED, Member("a", "10.0.0.1", 1), 0.0))
    s.on_event(MemberEvent(EventKind.SUSPECT, Member("b", "10.0.0.2", 1, SUSPECT), 0.0))
    s.on_event(MemberEvent(EventKind.DEAD, Member("h", "10.0.0.3", 1, DEAD), 0.0))
    out = s.step(5.0)
    assert isinstance(out[0], Adopt)
    notices = out[1:]
    assert all(isinstance(n, Notice) for n in notices)
    assert sorted(n.to for n in notices if isinstance(n, Notice)) == ["a", "b"]  # not h
    want = Notice("a", "t1", "r", 2, "r", out[0].replicas)
    assert want in notices
    assert s.step(6.0) == []  # told once per return
    s.on_member("h", ALIVE, 7.0)  # the home is back
    assert s.step(8.0) == [Notice("h", "t1", "r", 2, "r", out[0].replicas)]
    assert s.step(9.0) == []
    s.on_member("h", DEAD, 10.0)
    s.on_member("h", ALIVE, 11.0)
    assert [n.to for n in s.step(12.0) if isinstance(n, Notice)] == ["h"]
    s.restarted(13.0)  # a fresh view: everyone is owed the notice again
    s.on_member("a", ALIVE, 13.0)
    assert [n.to for n in s.step(13.0) if isinstance(n, Notice)] == ["a"]
    s.release("t1")
    s.on_member("h", DEAD, 14.0)
    s.on_member("h", ALIVE, 15.0)
    assert s.step(16.0) == [] and s.record("t1") is None


# ----------------------------------------------------------------- notices

# (title, me, our record, the notice's record, action, our record after)
DROP, FOLLOW, FORWARD, STALE, IGNORE = (
    NoticeAction.DROP,
    NoticeAction.FOLLOW,
    NoticeAction.FORWARD,
    NoticeAction.STALE,
    NoticeAction.IGNORE,
)
NOTICES = [
    ("old home, not running it", "h", "h 1 r a", "r 2 r b", DROP, "r 2 r b"),
    ("old home, task queued at it", "h", "h 1 - a", "a 2 - b", DROP, "a 2 - b"),
    ("old home running it, thought dead", "h", "h 1 h a", "a 2 - b", FORWARD, "a 2 - b"),
    ("runner, a replica adopted", "r", "h 1 r a", "a 2 - b", FORWARD, "a 2 - b"),
    ("runner, kept as runner", "r", "h 1 r a", "a 2 r b", FOLLOW, "a 2 r b"),
    ("old home kept as runner", "h", "h 1 h a", "a 2 h b", FOLLOW, "a 2 h b"),
    ("replica follows", "a", "h 1 r a", "r 2 r b", FOLLOW, "r 2 r b"),
    ("adopter yields to a larger node", "a", "a 2 - c", "b 2 - d", DROP, "b 2 - d"),
    ("adopter keeps a smaller node out", "b", "b 2 - d", "a 2 - c", STALE, "b 2 - d"),
    ("an older epoch is stale", "a", "h 3 - a", "z 2 - -", STALE, "h 3 - a"),
    ("a duplicate", "a", "r 2 r a", "r 2 r a", IGNORE, "r 2 r a"),
    ("the same claimant places it", "a", "r 2 - a", "r 2 x a", FOLLOW, "r 2 x a"),
    ("our own claim echoed", "r", "r 2 r a", "r 2 - -", IGNORE, "r 2 r a"),
    ("named as a new replica", "c", "", "r 2 r c", FOLLOW, "r 2 r c"),
    ("named as the runner", "c", "", "r 2 c -", FOLLOW, "r 2 c -"),
    ("not ours", "x", "", "r 2 r c", IGNORE, ""),
    ("an epoch out of range", "a", "h 1 - a", f"z {2**63} - -", IGNORE, "h 1 - a"),
]


def test_an_adopter_restarted_from_its_journal_tells_the_old_home_again() -> None:
    """Stop 52 (the copies stateful test): a restarted agent's succession core is new;
    its adoptions come back from the journal as held records (`hold`, epoch > 1).
    Before, nothing owed their notices, and an old home that came back afterwards ran
    the task again once its doubt ended."""
    s = Succession("r", GRACE)
    s.hold("t1", "r", 2, "r", ("a",))  # our adoption, from the journal
    s.hold("t2", "r", 1, None, ("a",))  # a task of our own: no notice owed
    s.on_member("a", ALIVE, 0.0)
    s.on_member("h", DEAD, 0.0)
    assert [(n.to, n.task_id) for n in s.step(1.0) if isinstance(n, Notice)] == [("a", "t1")]
    s.on_member("h", ALIVE, 2.0)  # the old home is back
    assert s.step(3.0) == [Notice("h", "t1", "r", 2, "r", ("a",))]


@pytest.mark.parametrize(
    ("title", "me", "ours", "notice", "action", "after"), NOTICES, ids=[c[0] for c in NOTICES]
)
def test_adoption_notices(
    title: str, me: str, ours: str, notice: str, action: NoticeAction, after: str
) -> None:
    s = Succession(me, GRACE)
    if ours:
        r = rec_of(ours)
        s.hold("t1", r.home, r.epoch, r.runner, r.replicas)
    n = rec_of(notice)
    assert s.on_notice(Notice(me, "t1", n.home, n.epoch, n.runner, n.replicas)) is action
    want = rec_of(after) if after else None
    assert s.record("t1") == want
    if action is NoticeAction.STALE:
        assert want is not None
        reply = Notice("x", "t1", want.home, want.epoch, want.runner, want.replicas)
        assert s.notice_for("t1", "x") == reply


def test_a_yielded_adopter_stops_telling() -> None:
    s = Succession("a", GRACE)
    s.hold("t1", "h", 1, None, ("a",))
    s.on_member("h", DEAD, 0.0)
    s.on_member("b", ALIVE, 0.0)
    assert isinstance(s.step(10.0)[0], Adopt) and s.is_authority("t1")  # a replica: 2 graces
    assert s.on_adoption_notice("t1", "b", 2) is NoticeAction.DROP
    assert not s.is_authority("t1")
    s.on_member("h", ALIVE, 11.0)
    assert s.step(12.0) == []


def test_a_bystander_remembers_the_larger_claim_and_answers_a_smaller_one_stale() -> None:
    """Two replicas adopted in split views, epoch 2 both: c's claim (2, c) beats
    (2, b). b names d as its replica; c, seeing nobody, names none. If c's notice
    reaches d first, d is no successor of c's record and holds nothing, yet must not
    follow b's smaller claim when it comes: it answers STALE with c's record, so b
    yields (CI found d following b for good, two records of one epoch)."""
    d = Succession("d", GRACE)
    assert d.on_adoption_notice("t0", "c", 2) is NoticeAction.IGNORE
    assert d.record("t0") is None and not d.held()
    assert d.on_adoption_notice("t0", "b", 2, None, ("c", "d")) is NoticeAction.STALE
    assert d.record("t0") is None
    assert d.notice_for("t0", "b") == Notice("b", "t0", "c", 2, None, ())
    # a larger claim naming d is followed; a restart forgets what was only heard
    assert d.on_adoption_notice("t0", "c", 3, None, ("d",)) is NoticeAction.FOLLOW
    assert d.on_adoption_notice("t1", "c", 2) is NoticeAction.IGNORE
    d.restarted(10.0)
    assert d.notice_for("t1", "b") is None
    assert not d.hold("t0", "c", 2, None, ("d",))  # older than the record held


def test_an_authority_names_a_new_replica_for_one_gone_for_a_grace() -> None:
    h = Succession("h", GRACE)
    h.hold("t1", "h", 1, None, ("a",))
    h.hold("t2", "x", 1, "h", ("a",))  # not ours: never re-replicated here
    for n in ("a", "b", "c"):
        h.on_member(n, ALIVE, 0.0)
    h.on_member("a", SUSPECT, 1.0)
    h.on_member("a", DEAD, 2.0)
    assert h.step(6.9) == []  # a is not gone for a grace yet
    (again, *notices) = h.step(7.0)
    assert isinstance(again, Rereplicate)
    (b,) = replica_of("t1", "h", ["b", "c"], 1)
    assert again == Rereplicate("t1", 1, 1, (b,), (b,), "replicas a gone")
    assert h.record("t1") == Record("h", 1, None, (b,), 1)
    assert {n.to for n in notices} == {"b", "c"}  # everybody learns the new record
    assert all(n.version == 1 for n in notices)
    assert h.step(8.0) == []
    # the new replica follows; a late copy of the older version is answered STALE
    r = Succession(b, GRACE)
    r.hold("t1", "h", 1, None, ("a",))
    assert r.on_notice(notices[0] if notices[0].to == b else notices[1]) is NoticeAction.FOLLOW
    assert r.on_adoption_notice("t1", "h", 1, None, ("a",)) is NoticeAction.STALE
    # a home in doubt does not re-replicate, nor one that sees nobody to stand in
    d = Succession("h", GRACE)
    d.hold("t1", "h", 1, None, ("a",))
    d.on_member("a", DEAD, 0.0)
    assert d.step(10.0) == []  # nobody alive to name
    d.on_member("h", DEAD, 10.0)
    d.on_member("h", ALIVE, 10.5)
    d.on_member("b", ALIVE, 10.5)
    assert d.in_doubt("t1", 11.0) and d.step(11.0) == []
    assert isinstance(d.step(15.0)[0], Rereplicate)


def test_an_adopter_that_saw_nobody_alive_names_replicas_when_they_return() -> None:
    a = Succession("a", GRACE)
    a.hold("t1", "h", 1, None, ("a",))
    a.on_member("h", DEAD, 0.0)
    a.on_member("b", DEAD, 0.0)
    (adopt,) = a.step(10.0)  # a replica waits two graces
    assert isinstance(adopt, Adopt) and adopt.replicas == ()
    a.on_member("b", ALIVE, 11.0)
    (again, notice) = a.step(11.5)
    assert again == Rereplicate("t1", 2, 1, ("b",), ("b",), "0 of 1 replicas")
    assert notice == Notice("b", "t1", "a", 2, None, ("b",), 1)


def test_a_runner_adopts_with_the_copies_the_known_cluster_calls_for() -> None:
    """Stop 53 (the copies walks with a second loss): a runner's record comes from its
    guest entry, which names no replicas; it adopted with none, and the next loss
    took the task. An adoption now aims for the known cluster's copies."""
    b = Succession("b", GRACE)
    b.hold("t1", "h", 1, "b", ())
    b.on_member("h", ALIVE, 0.0)
    b.on_member("c", ALIVE, 0.0)
    assert b.known_size() == 3 and b.copies_wanted() == 1
    b.on_member("h", DEAD, 1.0)
    adopt = next(d for d in b.step(1.0 + GRACE) if isinstance(d, Adopt))
    assert adopt.as_runner and adopt.replicas == ("c",)


def test_an_adoption_read_back_with_too_few_copies_names_more_as_members_come() -> None:
    """A restarted adopter holds its adoption from the journal, with the copies it
    had then (none: the others were down): it names one once a member is back."""
    a = Succession("a", GRACE)
    a.hold("t1", "a", 2, "a", ())
    assert [d for d in a.step(1.0) if isinstance(d, Rereplicate)] == []  # none known
    a.on_member("b", ALIVE, 2.0)
    a.on_member("c", DEAD, 2.0)  # down, not left: the cluster is three nodes
    (again,) = [d for d in a.step(3.0) if isinstance(d, Rereplicate)]
    assert again.added == ("b",)
    a.on_member("c", LEFT, 4.0)  # left for good: two nodes, no copy wanted
    assert a.known_size() == 2 and a.copies_wanted() == 0


def test_a_counter_claim_only_over_a_claim_that_names_no_other_runner() -> None:
    """Stop 54 (`counter`): the node whose run ended claims above an adoption that
    names no runner but its claimant, as the runner of the record taken over, or
    against a tie its own runner's adoption lost; never against a claim naming another
    runner, nor one above its own epoch (so a counter is not countered in turn); an
    adoption that ended names no new replicas."""
    b = Succession("b", GRACE)
    for n in ("h", "c"):
        b.on_member(n, ALIVE, 0.0)
    b.hold("t1", "h", 1, "b", ())
    old = b.record("t1")
    assert old is not None
    assert b.counter("t1", old, Notice("b", "t1", "c", 2, "d", ())) is None  # d runs it
    d = b.counter("t1", old, Notice("b", "t1", "c", 2, None, ("b",)))
    assert d is not None and (d.from_home, d.epoch, d.as_runner) == ("h", 3, True)
    assert b.record("t1") == Record("b", 3, "b", d.replicas) and b.is_authority("t1")
    told = [n.to for n in b.step(1.0) if isinstance(n, Notice)]
    assert told == ["c", "h"]
    ours = b.record("t1")
    assert ours is not None
    assert b.counter("t1", ours, Notice("b", "t1", "z", 4, None, ())) is None  # no tie
    d = b.counter("t1", ours, Notice("b", "t1", "z", 3, "z", ()))  # a tie, z's own run
    assert d is not None and d.epoch == 4
    h = Succession("h", GRACE)  # an adopter whose task ended at its runner r
    h.hold("t2", "h", 2, "r", ())
    ours = h.record("t2")
    assert ours is not None and h.counter("t2", ours, Notice("h", "t2", "z", 2, None, ()))
    b.hold("t1", "b", 4, "b", ())  # its copies released: none named now
    b.ended("t1")
    assert [x for x in b.step(2.0) if isinstance(x, Rereplicate)] == []


def test_a_claim_by_another_node_says_an_old_homes_word_is_out_of_date() -> None:
    r = Succession("r", GRACE)
    r.hold("t1", "h", 1, None, ("r",))
    assert r.taken_from("t1", "h") is None  # h's own first claim
    r.on_adoption_notice("t1", "b", 2, None, ("r",))
    taken = r.taken_from("t1", "h")
    assert taken is not None and (taken.home, taken.epoch) == ("b", 2)
    assert r.taken_from("t1", "b") is None and r.taken_from("t9", "h") is None


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "me"]), st.sampled_from(list(MemberState))),
        max_size=30,
    )
)
def test_the_known_size_kept_as_members_change_is_their_count(
    changes: list[tuple[str, MemberState]],
) -> None:
    """known_size is kept by on_member (each submission asks it): it is always the
    members not known to have left, ourselves included, and a restart starts over."""
    s = Succession("me", GRACE)
    for k, (node, state) in enumerate(changes):
        s.on_member(node, state, float(k))
        seen = {n for n, _ in changes[: k + 1] if n != "me"}
        last = {n: x for n, x in changes[: k + 1]}
        assert s.known_size() == 1 + sum(1 for n in seen if last[n] is not LEFT)
    s.restarted(100.0)
    assert s.known_size() == 1


def test_an_adoption_let_go_is_remembered_as_a_claim_heard() -> None:
    """Stop 53: a node that released an adopter's record (nothing of it held here any
    more) forgot the claim, and took an old home's stale copy later; it remembers the
    claim now, and a task it comes to run for that adopter is held at its epoch."""
    c = Succession("c", GRACE)
    c.hold("t1", "b", 2, None, ("c",))
    c.release("t1")
    assert c.record("t1") is None
    taken = c.taken_from("t1", "a")
    assert taken is not None and (taken.home, taken.epoch) == ("b", 2)
    assert c.epoch_of("t1", "b") == 2 and c.epoch_of("t1", "a") == 1
    assert c.hold("t1", "b", 2, "c", ())  # run here for b: held at its claim
    mine = Succession("b", GRACE)
    mine.hold("t1", "b", 2, None, ())
    mine.release("t1")  # our own adoption ended: nothing to remember
    assert mine.taken_from("t1", "a") is None


def test_a_later_claim_of_the_same_home_is_followed_where_we_run_it() -> None:
    r = Succession("r", GRACE)
    r.hold("t1", "a", 1, "r")  # we run it for a (after a took it over and placed it)
    assert r.on_adoption_notice("t1", "a", 2, None, ("c",)) is NoticeAction.FOLLOW
    assert r.record("t1") == Record("a", 2, "r", ("c",))


def test_hold_keeps_the_larger_claim() -> None:
    s = Succession("a", GRACE)
    assert s.hold("t1", "h", 2, None, ("a",))
    assert not s.hold("t1", "h", 1, "r", ("a",))
    assert s.hold("t1", "h", 2, "r", ("a",))  # the same home places it
    assert s.record("t1") == Record("h", 2, "r", ("a",))
    assert s.held() == {"t1": Record("h", 2, "r", ("a",))}
    assert s.notice_for("zz", "b") is None
    with pytest.raises(ValueError):
        s.hold("t2", "h", 0)
    with pytest.raises(ValueError):
        Succession("a", -1.0)
    with pytest.raises(ValueError):
        Succession("a", float("nan"))


def test_a_home_declared_dead_or_restarted_is_in_doubt_for_a_grace() -> None:
    s = Succession("h", GRACE)
    s.hold("t1", "h", 1, None, ("a",))
    s.hold("t2", "h", 1, "r", ("a",))
    s.hold("t3", "x", 1, "h", ())
    assert not s.in_doubt("t1", 0.0)
    s.on_member("h", DEAD, 10.0)  # it hears its own death (and refutes it)
    assert s.in_doubt("t1", 10.0) and s.in_doubt("t2", 14.9) and not s.in_doubt("t3", 11.0)
    assert not s.in_doubt("t1", 15.0)
    assert s.on_adoption_notice("t2", "r", 2, "r") is NoticeAction.DROP
    assert not s.in_doubt("t2", 11.0)
    s.restarted(20.0)
    assert s.in_doubt("t1", 24.0) and not s.in_doubt("t1", 25.0)
    assert s.gone_for("h", 21.0) is None  # a fresh view


# ------------------------------------------------------------ fake network

SUSPECT_AFTER = 1.0  # a stopped node is suspected this long after it stops
DEAD_AFTER = 3.0  # and declared dead this long after (its suspicion timed out)
DT = 0.5


class Net:
    """3-9 nodes' Successions on a fake network with a global clock; each node sees it
    with its own offset. Membership events reach each node in order, after a delay;
    notices arrive after a delay, and wait for a stopped node's restart."""

    def __init__(self, nodes: list[str], rng: random.Random, consistent: bool) -> None:
        self.nodes = nodes
        self.rng = rng
        self.consistent = consistent
        self.delay = 0.0 if consistent else 2.0
        self.off = {n: 0.0 if consistent else rng.uniform(-50, 50) for n in nodes}
        self.succ = {n: Succession(n, GRACE) for n in nodes}
        self.up = dict.fromkeys(nodes, True)
        self.gen = dict.fromkeys(nodes, 0)  # +1 at each stop and restart
        self.declared = dict.fromkeys(nodes, ALIVE)
        self.log: dict[str, list[tuple[float, str, MemberState]]] = {n: [] for n in nodes}
        self.last = dict.fromkeys(nodes, 0.0)  # last membership delivery time, per node
        self.pending: dict[str, list[tuple[str, Notice]]] = {n: [] for n in nodes}
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.adoptions: list[tuple[float, str, Adopt, Record]] = []
        self.rereplications: list[tuple[float, str, Rereplicate]] = []
        for x in nodes:
            for y in nodes:
                if y != x:
                    self._member(x, y, ALIVE)

    def local(self, x: str) -> float:
        return self.now + self.off[x]

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.queue, (t, next(self.seq), fn))

    # membership
    def _member(self, x: str, node: str, state: MemberState) -> None:
        self.succ[x].on_member(node, state, self.local(x))
        self.log[x].append((self.local(x), node, state))

    def announce(self, node: str, state: MemberState, *, to_self: bool = False) -> None:
        self.declared[node] = state
        for x in self.nodes:
            if (x == node and not to_self) or not self.up[x]:
                continue
            t = max(self.last[x], self.now + self.rng.uniform(0, self.delay))
            self.last[x] = t
            g = self.gen[x]

            def deliver(x: str = x, g: int = g) -> None:
                if self.up[x] and self.gen[x] == g:
                    self._member(x, node, state)

            self.at(t, deliver)

    # incidents
    def stop(self, x: str, down_for: float | None) -> None:
        if not self.up[x]:
            return
        self.up[x] = False
        self.gen[x] += 1
        g = self.gen[x]
        self.at(
            self.now + SUSPECT_AFTER, self.unless_moved(x, g, partial(self.announce, x, SUSPECT))
        )
        self.at(self.now + DEAD_AFTER, self.unless_moved(x, g, partial(self.announce, x, DEAD)))
        if down_for is not None:
            self.at(self.now + down_for, self.unless_moved(x, g, partial(self.restart, x)))

    def unless_moved(self, x: str, g: int, fn: Callable[[], None]) -> Callable[[], None]:
        """`fn`, unless `x` stopped or restarted since (its generation is no longer g)."""

        def run() -> None:
            if self.gen[x] == g:
                fn()

        return run

    def restart(self, x: str) -> None:
        self.up[x] = True
        self.gen[x] += 1
        self.succ[x].restarted(self.local(x))
        self.log[x] = []
        for y in self.nodes:
            if y != x:
                self._member(x, y, self.declared[y])
        self.announce(x, ALIVE)
        waiting, self.pending[x] = self.pending[x], []
        for sender, n in waiting:
            self.receive(sender, n)

    def false_suspect(self, x: str, dur: float) -> None:
        if not self.up[x]:
            return
        g = self.gen[x]
        self.announce(x, SUSPECT)
        self.at(self.now + min(dur, 1.5), self.unless_moved(x, g, partial(self.announce, x, ALIVE)))

    def false_death(self, x: str, refute_after: float, hears: bool) -> None:
        if not self.up[x]:
            return
        g = self.gen[x]
        self.announce(x, SUSPECT)

        def dead() -> None:
            if self.gen[x] == g:
                self.announce(x, DEAD, to_self=hears)
                self.at(self.now + refute_after, refute)

        def refute() -> None:
            if self.gen[x] == g:
                self.announce(x, ALIVE, to_self=True)

        self.at(self.now + 2.0, dead)

    def check_rereplication(self, x: str, d: Rereplicate, before: Record) -> None:
        """Only the authority names new replicas, within its claim, and only nodes alive
        in its view, to stand in for replicas gone for a grace in its view."""
        log, local = self.log[x], self.local(x)
        assert before.home == x and d.epoch == before.epoch and d.version == before.version + 1
        assert d.added and set(d.added) <= set(d.replicas) and x not in d.replicas
        for a in d.added:
            assert a not in before.replicas and gone_since(log, a) is None
        for r in set(before.replicas) - set(d.replicas):
            g = gone_since(log, r)
            assert g is not None and local - g >= GRACE, f"{r} dropped before its grace"

    # notices
    def send(self, sender: str, n: Notice) -> None:
        if self.consistent:
            self.receive(sender, n)
        else:
            self.at(self.now + self.rng.uniform(0, 2.0), lambda: self.receive(sender, n))

    def receive(self, sender: str, n: Notice) -> None:
        x = n.to
        if not self.up[x]:
            self.pending[x].append((sender, n))  # retried until it is back
            return
        if self.succ[x].on_notice(n) is NoticeAction.STALE:
            reply = self.succ[x].notice_for(n.task_id, sender)
            assert reply is not None
            self.send(x, reply)

    # time
    def run_until(self, end: float, check: Callable[[float, str, Adopt, Record], None]) -> None:
        while self.now <= end:
            while self.queue and self.queue[0][0] <= self.now:
                heapq.heappop(self.queue)[2]()
            order = [x for x in self.nodes if self.up[x]]
            self.rng.shuffle(order)
            for x in order:
                if not self.up[x]:
                    continue
                before = self.succ[x].held()
                for d in self.succ[x].step(self.local(x)):
                    if isinstance(d, Adopt):
                        self.adoptions.append((self.now, x, d, before[d.task_id]))
                        check(self.now, x, d, before[d.task_id])
                    elif isinstance(d, Rereplicate):
                        self.rereplications.append((self.now, x, d))
                        self.check_rereplication(x, d, before[d.task_id])
                    else:
                        self.send(x, d)
            self.now += DT


def gone_since(log: list[tuple[float, str, MemberState]], node: str) -> float | None:
    """Read independently from a node's log: since when `node` is dead or left."""
    since = None
    for t, n, state in log:
        if n != node:
            continue
        since = (t if since is None else since) if state in (DEAD, LEFT) else None
    return since


@st.composite
def histories(draw: Any, consistent: bool) -> dict[str, Any]:
    n = draw(st.integers(3, 9))
    nodes = [f"n{i}" for i in range(n)]
    tasks = []
    for i in range(draw(st.integers(1, 3))):
        tid = f"t{i}"
        home = draw(st.sampled_from(nodes))
        copies = replicas_wanted(n, draw(st.sampled_from([None, 2, 3])))
        runner = draw(st.one_of(st.none(), st.sampled_from(nodes)))
        tasks.append((tid, home, runner, replica_of(tid, home, nodes, copies - 1)))
    kinds = ["stop", "suspect"] if consistent else ["stop", "suspect", "false_dead", "restart"]
    times = st.integers(0, 120).map(lambda q: q / 4)
    incidents = draw(
        st.lists(
            st.tuples(st.sampled_from(kinds), st.sampled_from(nodes), times, times, st.booleans()),
            max_size=6,
        )
    )
    if draw(st.booleans()):  # the first task's home dies for good, often
        incidents.append(("stop", tasks[0][1], draw(times), 0.0, False))
    seed = draw(st.integers(0, 2**32 - 1))
    return {"nodes": nodes, "tasks": tasks, "incidents": incidents, "seed": seed}


def claimed(net: Net, tid: str) -> list[tuple[int, str]]:
    """The claims made to a task's authority (adoptions)."""
    return [(a.epoch, x) for _, x, a, _ in net.adoptions if a.task_id == tid]


def simulate(h: dict[str, Any], consistent: bool) -> Net:
    net = Net(h["nodes"], random.Random(h["seed"]), consistent)
    stopped_at: dict[str, float] = {}
    for tid, home, runner, replicas in h["tasks"]:
        for x in {home, runner, *replicas} - {None}:
            net.succ[x].hold(tid, home, 1, runner, replicas)
    for kind, x, t, span, flag in h["incidents"]:
        if kind == "stop":

            def stop(x: str = x, t: float = t) -> None:
                if net.up[x]:
                    stopped_at[x] = t
                    net.stop(x, None)

            net.at(t, stop)
        elif kind == "restart":
            net.at(t, partial(net.stop, x, max(span, 0.5)))
        elif kind == "suspect":
            net.at(t, partial(net.false_suspect, x, span))
        else:
            net.at(t, partial(net.false_death, x, span, flag))

    def check(now: float, x: str, a: Adopt, before: Record) -> None:
        # the adopter's own view, read from its log, allowed it
        log, local = net.log[x], net.local(x)
        assert a.from_home == before.home and a.epoch == before.epoch + 1
        assert before.successor_of(x) and a.as_runner == (before.runner == x)
        home_gone = gone_since(log, before.home)
        assert home_gone is not None, "adopted while the home was not dead in its view"
        assert local - home_gone >= GRACE, "adopted before the grace was over"
        assert gone_since(log, x) is None, "adopted while declared dead itself"
        if not a.as_runner:
            waits = [before.runner] if before.runner not in (None, before.home) else []
            waits += list(before.replicas[: before.replicas.index(x)])
            for w in waits:
                g = gone_since(log, w)
                assert g is not None and local - g >= GRACE, f"{w} came first"
        if consistent:
            r = before.runner
            if r is not None and r != before.home and net.up[r]:
                assert x == r, "a replica adopted a task whose runner is alive"
            assert not net.up[before.home]

    net.run_until(30.0 + 15.0 + DEAD_AFTER + 2.0 + 4 * GRACE + 10.0, check)
    # each claim once; in a consistent view, one adopter per epoch
    claims = [(a.task_id, a.epoch, x) for _, x, a, _ in net.adoptions]
    assert len(claims) == len(set(claims))
    if consistent:
        per_epoch = [(tid, e) for tid, e, _ in claims]
        assert len(per_epoch) == len(set(per_epoch)), "two adopters in one epoch"
    # the views have converged: at most one authority per task remains, and every live
    # node that can succeed to the task holds its record; none remains only when no
    # live node could succeed to it
    for tid, home, runner, _ in h["tasks"]:
        live = [x for x in net.nodes if net.up[x]]
        authorities = [x for x in live if net.succ[x].is_authority(tid)]
        assert len(authorities) <= 1, f"{tid}: authorities {authorities}"
        participants = {}
        for x in live:
            rec = net.succ[x].record(tid)
            if rec is not None and (rec.home == x or rec.successor_of(x)):
                participants[x] = rec
        if authorities:
            top = participants[authorities[0]]
            assert all(rec == top for rec in participants.values()), participants
            # it holds the largest live claim, unless a larger claim died with its node
            # before anyone it could tell came back (the older claimant never heard: the
            # task is not lost, it may run twice)
            made = claimed(net, tid)
            if not any(k > top.key[:2] and not net.up[k[1]] for k in made):
                assert all(top.key[:2] >= k for k in made if net.up[k[1]]), (top, made)
        else:
            assert participants == {}, f"{tid}: nobody adopts it, yet {participants}"
        if len(stopped_at) <= 1:  # losing one node for good loses nothing
            assert authorities, f"{tid} lost"
        if consistent and runner not in (None, home) and net.up[runner] and home in stopped_at:
            assert authorities == [runner]  # promptly: first tick past death + grace
            (t_adopt,) = [t for t, x, a, _ in net.adoptions if a.task_id == tid]
            assert t_adopt <= stopped_at[home] + DEAD_AFTER + GRACE + DT
    return net


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(consistent=True))
def test_consistent_views_one_adopter_the_runner_first_and_liveness(h: dict[str, Any]) -> None:
    simulate(h, consistent=True)


@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(consistent=False))
def test_delays_false_deaths_and_restarts_converge_to_one_authority(h: dict[str, Any]) -> None:
    simulate(h, consistent=False)


def test_the_simulation_does_adopt() -> None:
    """The fake network is not vacuous: a home stopped for good under a running task
    and under a queued one; the runner and a replica adopt, and the home, restarted,
    yields."""
    nodes = [f"n{i}" for i in range(5)]
    q = replica_of("q", "n0", nodes, 1)
    h = {
        "nodes": nodes,
        "tasks": [("r", "n0", "n1", replica_of("r", "n0", nodes, 1)), ("q", "n0", None, q)],
        "incidents": [("restart", "n0", 2.0, 30.0, False)],
        "seed": 1,
    }
    net = simulate(h, consistent=False)
    assert sorted((a.task_id, x, a.epoch) for _, x, a, _ in net.adoptions) == [
        ("q", q[0], 2),
        ("r", "n1", 2),
    ]
    for tid in ("r", "q"):  # the home, back, learnt of both adoptions
        assert net.succ["n0"].record(tid) == net.succ[q[0] if tid == "q" else "n1"].record(tid)
    assert not net.succ["n0"].is_authority("r") and not net.succ["n0"].is_authority("q")
    assert net.up["n0"]


# ------------------------------------------------------------------------ wire


def test_notices_round_trip_and_bad_fields_are_named() -> None:
    n = Notice("n1", "t1", "n2", 3, None, ("n3",), 2)
    assert notice_from_wire(notice_to_wire(n), "n1") == n
    good = notice_to_wire(n)
    for field, value, says in [
        ("id", "../etc", "field 'id'"),
        ("epoch", 0, "field 'epoch'"),
        ("home", "", "field 'home'"),
        ("replicas", ["a"] * 17, "field 'replicas'"),
        ("replicas", [""], "field 'replicas'"),
        ("version", -1, "field 'version'"),
        ("extra", 1, "unknown field(s) 'extra'"),
    ]:
        with pytest.raises(wire.SchemaError, match=re.escape(says)):
            notice_from_wire({**good, field: value}, "n1")
