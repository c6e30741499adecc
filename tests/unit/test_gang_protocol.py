"""The gang protocol's two sides, one stimulus at a time (issue 22): a node's
`HoldBook` and a home's `Coordinator` (swarm/cluster/gang*.py)."""

from __future__ import annotations

import random

import pytest

from swarm import wire
from swarm.cluster import gang as g
from swarm.cluster import gangwire
from swarm.cluster.gangcoord import Coordinator, Phase
from swarm.cluster.gangholds import HoldBook
from swarm.cluster.gangholds import Phase as HPhase

G = "g0123456789abcdef"
T = g.Timers()


def sends(out: list[g.Instruction]) -> list[tuple[str, g.Message]]:
    return [(i.to, i.msg) for i in out if isinstance(i, g.Send)]


def only(out: list[g.Instruction], kind: type) -> list:
    return [i for i in out if isinstance(i, kind)]


def wake(out: list[g.Instruction]) -> float | None:
    w = only(out, g.WakeAt)
    return w[-1].at if w else None


# ------------------------------------------------------------------ the spec


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"size": 0}, "size"),
        ({"size": g.MAX_GANG + 1}, "size"),
        ({"size": 4, "mode": g.Mode.NONSTRICT, "min_available": 5}, "min-available"),
        ({"size": 4, "mode": g.Mode.NONSTRICT, "min_available": 0}, "min-available"),
        ({"size": 4, "timeout": -1.0}, "timeout"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        g.GangSpec(G, **kw)


def test_the_partial_bound_is_what_the_timers_allow() -> None:
    t = g.Timers(run_ttl=15.0, max_delay=1.0, drift=0.0)
    assert t.partial_bound() == pytest.approx(10.0 + 2.0 + 15.0)
    assert t.lapse_wait() > t.run_ttl + t.max_delay


# ------------------------------------------------------------------ a node's holds


def prep(
    book: HoldBook,
    now: float,
    rnd: int = 1,
    slots=(0, 1),
    room: int = 4,
    home: str = "h",
    gang: str = G,
):
    return book.on_message(
        now, home, g.Prepare(gang, rnd, tuple(slots), 5.0), room=room, port=29500
    )


def test_a_hold_is_granted_when_it_fits_and_lapses_at_its_deadline() -> None:
    book = HoldBook("n1")
    out = prep(book, 10.0)
    assert sends(out) == [("h", g.Granted(G, 1, 29500))]
    assert only(out, g.HoldChanged) and book.held_slots() == 2
    assert wake(out) == 15.0
    assert book.tick(14.999) and book.held_slots() == 2  # the WakeAt again, nothing dropped
    out = book.tick(15.0)
    assert only(out, g.HoldChanged) and book.held_slots() == 0 and book.lapsed_holds == 1
    # a commit after the lapse starts nothing
    out = book.on_message(15.1, "h", g.Commit(G, 1, {0: 0, 1: 1}, 2, "n1", 29500, 15.0))
    assert sends(out) == [("h", g.Gone(G, 1, "no hold for this round"))] and not only(
        out, g.StartMembers
    )


def test_a_prepare_that_does_not_fit_or_passes_the_bound_is_refused_at_once() -> None:
    book = HoldBook("n1", max_holds=2)
    [(_, r)] = sends(prep(book, 0.0, room=1))
    assert isinstance(r, g.Refused) and "room for 1 of 2" in r.reason
    prep(book, 0.0, gang="ga000000000000001")
    prep(book, 0.0, gang="ga000000000000002")
    [(_, r)] = sends(prep(book, 0.0, gang="ga000000000000003"))
    assert isinstance(r, g.Refused) and "2 holds here already" in r.reason
    assert book.refused == 2 and book.holds() == 2


def test_duplicates_and_stale_rounds_create_nothing() -> None:
    book = HoldBook("n1")
    prep(book, 0.0, rnd=3)
    [(_, again)] = sends(prep(book, 1.0, rnd=3))
    assert again == g.Granted(G, 3, 29500) and book.entries[G].deadline == 5.0  # not extended
    [(_, old)] = sends(prep(book, 1.0, rnd=2))
    assert isinstance(old, g.Refused) and old.reason == "stale round"
    # an abort, then a late copy of the aborted round's prepare
    out = book.on_message(2.0, "h", g.Abort(G, 3, "x"))
    assert sends(out) == [("h", g.Aborted(G, 3))] and book.held_slots() == 0
    [(_, late)] = sends(prep(book, 2.5, rnd=3))
    assert isinstance(late, g.Refused) and book.held_slots() == 0


def test_a_later_prepare_keeps_a_hold_an_older_copy_does_not() -> None:
    book = HoldBook("n1")
    book.on_message(0.0, "h", g.Prepare(G, 1, (0,), 5.0, seq=0), room=4)
    out = book.on_message(3.0, "h", g.Prepare(G, 1, (0,), 5.0, seq=1), room=0)
    assert sends(out) == [("h", g.Granted(G, 1, 0, 1))] and book.entries[G].deadline == 8.0
    book.on_message(4.0, "h", g.Prepare(G, 1, (0,), 5.0, seq=1), room=0)  # a late copy
    assert book.entries[G].deadline == 8.0


def test_first_in_line_keeps_other_gangs_out_until_its_room_is_there() -> None:
    book = HoldBook("n1", max_waiting=1)
    out = book.on_message(0.0, "h", g.Prepare(G, 1, (0, 1), 5.0), room=1)
    [(_, q)] = sends(out)
    assert isinstance(q, g.Queued) and "first in line" in q.reason and book.held_slots() == 0
    # another gang that would fit is refused while G waits; so is a second waiter
    other = "g0000000000000009"
    [(_, r)] = sends(book.on_message(0.1, "h2", g.Prepare(other, 1, (0,), 5.0), room=1))
    assert isinstance(r, g.Refused) and f"gang {G} is waiting here" in r.reason
    # a commit finds no hold
    [(_, gone)] = sends(book.on_message(0.2, "h", g.Commit(G, 1, {0: 0, 1: 1}, 2, "n1", 0, 15.0)))
    assert isinstance(gone, g.Gone)
    # the home asks again (a later seq); the room is there now
    out = book.on_message(1.0, "h", g.Prepare(G, 1, (0, 1), 5.0, seq=1), room=2)
    assert sends(out) == [("h", g.Granted(G, 1, 0, 1))] and book.held_slots() == 2
    assert only(out, g.HoldChanged)


def test_a_waiting_gang_whose_home_stops_asking_leaves_the_line() -> None:
    book = HoldBook("n1", max_waiting=1)
    book.on_message(0.0, "h", g.Prepare(G, 1, (0, 1), 5.0), room=0)
    book.on_message(2.0, "h", g.Prepare(G, 1, (0, 1), 5.0, seq=1), room=0)  # still waits
    assert book.tick(6.9) and G in book.entries
    book.tick(7.0)
    assert G not in book.entries
    other = "g0000000000000009"
    [(_, ok)] = sends(book.on_message(7.1, "h2", g.Prepare(other, 1, (0,), 5.0), room=1))
    assert isinstance(ok, g.Granted)


def test_without_a_line_no_room_is_refused_at_once() -> None:
    book = HoldBook("n1")  # max_waiting 0, the default
    [(_, r)] = sends(book.on_message(0.0, "h", g.Prepare(G, 1, (0,), 5.0), room=0))
    assert isinstance(r, g.Refused) and G not in book.entries


def test_a_commit_starts_the_held_members_under_a_run_lease() -> None:
    book = HoldBook("n1")
    prep(book, 0.0, slots=(2, 5))
    out = book.on_message(1.0, "h", g.Commit(G, 1, {2: 2, 5: 5}, 8, "n0", 29501, 15.0))
    [start] = only(out, g.StartMembers)
    assert start == g.StartMembers(G, 1, {2: 2, 5: 5}, 8, "n0", 29501)
    assert sends(out) == [("h", g.Started(G, 1, (2, 5)))]
    assert book.held_slots() == 0 and book.running_slots() == 2 and wake(out) == 16.0
    # a duplicate commit answers again and starts nothing
    out = book.on_message(1.1, "h", g.Commit(G, 1, {2: 2, 5: 5}, 8, "n0", 29501, 15.0))
    assert not only(out, g.StartMembers) and sends(out) == [("h", g.Started(G, 1, (2, 5)))]
    # a commit from another node than the hold's home is not the home's
    out = book.on_message(1.2, "evil", g.Commit(G, 1, {2: 2}, 8, "n0", 1, 15.0))
    assert sends(out)[0][1] == g.Gone(G, 1, "no hold for this round")


def test_renewals_extend_once_per_seq_and_a_lapse_stops_the_members() -> None:
    book = HoldBook("n1")
    prep(book, 0.0)
    book.on_message(1.0, "h", g.Commit(G, 1, {0: 0, 1: 1}, 2, "n1", 29500, 15.0))
    out = book.on_message(5.0, "h", g.Renew(G, 1, 1, 15.0))
    assert sends(out) == [("h", g.Alive(G, 1, (0, 1), {}))] and book.entries[G].deadline == 20.0
    book.on_message(12.0, "h", g.Renew(G, 1, 1, 15.0))  # the same seq, late: no extension
    assert book.entries[G].deadline == 20.0
    out = book.tick(20.0)
    [stop] = only(out, g.StopMembers)
    assert stop.slots == (0, 1) and "lease lapsed" in stop.reason and book.lapsed_runs == 1
    # and a late renewal or commit of that round finds nothing
    out = book.on_message(20.5, "h", g.Renew(G, 1, 2, 15.0))
    assert isinstance(sends(out)[0][1], g.Gone)


def test_a_member_exit_is_told_at_once_and_read_on_renewal() -> None:
    book = HoldBook("n1")
    prep(book, 0.0)
    book.on_message(1.0, "h", g.Commit(G, 1, {0: 0, 1: 1}, 2, "n1", 29500, 15.0))
    out = book.on_member_exit(2.0, G, 1, 0, 0)
    assert sends(out) == [("h", g.Alive(G, 1, (1,), {0: 0}))]
    out = book.on_member_exit(3.0, G, 1, 1, 3)
    assert sends(out) == [("h", g.Alive(G, 1, (), {0: 0, 1: 3}))]
    assert book.entries[G].phase is HPhase.ENDED
    out = book.on_message(4.0, "h", g.Renew(G, 1, 1, 15.0))
    assert sends(out) == [("h", g.Alive(G, 1, (), {0: 0, 1: 3}))]


def test_a_newer_round_ends_what_an_older_one_left() -> None:
    book = HoldBook("n1")
    prep(book, 0.0, rnd=1)
    book.on_message(0.5, "h", g.Commit(G, 1, {0: 0, 1: 1}, 2, "n1", 29500, 15.0))
    out = prep(book, 1.0, rnd=2)
    [stop] = only(out, g.StopMembers)
    assert stop.round == 1 and stop.slots == (0, 1)
    assert book.entries[G].round == 2 and book.held_slots() == 2


# ------------------------------------------------------------------ the home


def coord(size: int = 3, **kw) -> Coordinator:
    spec = g.GangSpec(G, size, **kw)
    return Coordinator(spec, "h", 0.0, random.Random(1), T)


def start_round(c: Coordinator, now: float, targets: list[str]) -> list[g.Instruction]:
    out = c.tick(now)
    assert only(out, g.NeedTargets) == [g.NeedTargets(G, c.round + 1)]
    return c.on_targets(now, targets)


def test_prepares_go_one_node_at_a_time_in_node_id_order_then_commit() -> None:
    c = coord(3)
    out = start_round(c, 0.0, ["n3", "n1", "n3"])
    assert only(out, g.RoundStarted) == [g.RoundStarted(G, 1)]
    assert sends(out) == [("n1", g.Prepare(G, 1, (1,), T.hold_ttl))]
    out = c.on_message(0.01, "n1", g.Granted(G, 1, 29501))
    assert sends(out) == [("n3", g.Prepare(G, 1, (0, 2), T.hold_ttl))]
    out = c.on_message(0.02, "n3", g.Granted(G, 1, 29503))
    commits = dict(sends(out))
    assert commits["n1"] == g.Commit(G, 1, {1: 1}, 3, "n3", 29503, T.run_ttl)
    assert commits["n3"] == g.Commit(G, 1, {0: 0, 2: 2}, 3, "n3", 29503, T.run_ttl)
    c.on_message(0.03, "n1", g.Started(G, 1, (1,)))
    assert c.phase is Phase.COMMITTING
    out = c.on_message(0.04, "n3", g.Started(G, 1, (0, 2)))
    assert only(out, g.GangRunning) == [g.GangRunning(G, 1, {0: "n3", 1: "n1", 2: "n3"}, 3)]


def running(c: Coordinator, now: float = 0.0) -> None:
    start_round(c, now, ["n1", "n2", "n3"][: c.spec.size])
    for n in ("n1", "n2", "n3")[: c.spec.size]:
        c.on_message(now, n, g.Granted(G, c.round))
    for i, n in enumerate(("n1", "n2", "n3")[: c.spec.size]):
        c.on_message(now, n, g.Started(G, c.round, (i,)))
    assert c.phase is Phase.RUNNING


def test_members_that_end_before_every_start_is_answered_still_count() -> None:
    """A short member's exit can reach the home before another node's `started`
    (found by `swarm sim gang`: gangs of near-zero run time failed every round)."""
    c = coord(2)
    start_round(c, 0.0, ["n1", "n2"])
    c.on_message(0.01, "n1", g.Granted(G, 1))
    c.on_message(0.02, "n2", g.Granted(G, 1))
    c.on_message(0.03, "n1", g.Started(G, 1, (0,)))
    c.on_message(0.031, "n1", g.Alive(G, 1, (), {0: 0}))
    out = c.on_message(0.04, "n2", g.Started(G, 1, (1,)))
    assert only(out, g.GangRunning) == [g.GangRunning(G, 1, {0: "n1", 1: "n2"}, 2)]
    out = c.on_message(0.05, "n2", g.Alive(G, 1, (), {1: 0}))
    assert c.result is not None and c.result.ok


def test_a_refusal_fails_a_strict_round_releases_its_holds_and_backs_off() -> None:
    c = coord(3)
    start_round(c, 0.0, ["n1", "n2", "n3"])
    c.on_message(0.01, "n1", g.Granted(G, 1))
    out = c.on_message(0.02, "n2", g.Refused(G, 1, "room for 0 of 1"))
    assert sorted(sends(out)) == [
        ("n1", g.Abort(G, 1, "n2 refused: room for 0 of 1")),
        ("n2", g.Abort(G, 1, "n2 refused: room for 0 of 1")),
    ]
    assert c.phase is Phase.WAITING and "refused" in c.why
    assert not only(c.tick(0.05), g.NeedTargets)  # backing off (0.1..0.3 s)
    assert only(c.tick(c.wait_until), g.NeedTargets)


def test_a_silent_node_is_asked_again_then_counts_as_refused() -> None:
    c = coord(2)
    start_round(c, 0.0, ["n1", "n2"])
    out = c.tick(T.resend)
    assert sends(out) == [("n1", g.Prepare(G, 1, (0,), T.hold_ttl, seq=1))]
    out = c.tick(T.answer_timeout)
    assert c.phase is Phase.WAITING and "no answer" in c.why


def test_a_round_first_in_line_asks_again_keeps_its_holds_and_gives_up_in_time() -> None:
    t = g.Timers(queue_wait=3.0)
    c = Coordinator(g.GangSpec(G, 2), "h", 0.0, random.Random(1), t)
    c.tick(0.0)
    c.on_targets(0.0, ["n1", "n2"])
    c.on_message(0.01, "n1", g.Granted(G, 1, 0, 0))
    c.on_message(0.02, "n2", g.Queued(G, 1, 0, "room for 0 of 1; first in line"))
    assert c.phase is Phase.PREPARING and "first in line" in c.why
    out = c.tick(0.02 + t.resend)
    assert sends(out) == [("n2", g.Prepare(G, 1, (1,), t.hold_ttl, seq=1))]  # asks again
    out = c.tick(t.hold_ttl / 3 + 0.01)
    assert ("n1", g.Prepare(G, 1, (0,), t.hold_ttl, seq=1)) in sends(out)  # keeps n1's hold
    c.on_message(t.hold_ttl / 3 + 0.02, "n1", g.Granted(G, 1, 0, 1))
    assert c.shares["n1"].hold_from == pytest.approx(t.hold_ttl / 3 + 0.01)
    c.tick(3.0)
    assert c.phase is Phase.PREPARING
    c.tick(3.02)
    assert c.phase is Phase.WAITING and "waited 3 s for room at n2" in c.why

    # granted while in line: the round goes on to its commit
    c = Coordinator(g.GangSpec(G, 2), "h", 0.0, random.Random(1), t)
    c.tick(0.0)
    c.on_targets(0.0, ["n1", "n2"])
    c.on_message(0.01, "n1", g.Granted(G, 1))
    c.on_message(0.02, "n2", g.Queued(G, 1))
    out = c.on_message(1.0, "n2", g.Granted(G, 1, 0, 3))
    assert {n for n, m in sends(out) if isinstance(m, g.Commit)} == {"n1", "n2"}


def test_a_home_that_does_not_wait_in_line_takes_queued_as_refused() -> None:
    c = coord(2)  # queue_wait 0
    start_round(c, 0.0, ["n1", "n2"])
    c.on_message(0.01, "n1", g.Queued(G, 1, 0, "room for 0 of 1"))
    assert c.phase is Phase.WAITING and "room for 0 of 1" in c.why


def test_renewals_go_only_while_the_gang_is_whole() -> None:
    c = coord(3)
    running(c)
    out = c.tick(T.renew_every)
    assert {n for n, msg in sends(out) if isinstance(msg, g.Renew)} == {"n1", "n2", "n3"}
    for i, n in enumerate(("n1", "n2")):
        c.on_message(T.renew_every + 0.01, n, g.Alive(G, 1, (i,)))
    # n3 never answers: asked again every `resend`, then silent past ack_fresh
    out = c.tick(T.renew_every + T.resend)
    assert sends(out) == [("n3", g.Renew(G, 1, 1, T.run_ttl))]
    out = c.tick(T.ack_fresh)
    assert c.phase is Phase.ENDED and not c.result.ok and "silent" in c.result.reason
    assert {n for n, msg in sends(out) if isinstance(msg, g.Abort)} == {"n1", "n2", "n3"}


def test_a_failed_member_fails_a_strict_gang_or_restarts_it_after_the_lease() -> None:
    c = coord(2)
    running(c)
    out = c.on_message(1.0, "n2", g.Alive(G, 1, (), {1: 3}))
    assert c.result == g.GangEnded(G, 1, False, "round 1 failed: rank 1 exited 3", {1: 3})
    assert ("n1", g.Abort(G, 1, "rank 1 exited 3")) in sends(out)

    c = coord(2, restart=True)
    running(c)
    c.on_message(1.0, "n2", g.Alive(G, 1, (), {1: 3}))
    assert c.phase is Phase.WAITING
    # the next round waits for the leases to lapse, unless every node acknowledges
    assert not only(c.tick(2.0), g.NeedTargets)
    c.on_message(2.0, "n1", g.Aborted(G, 1))
    c.on_message(2.0, "n2", g.Aborted(G, 1))
    assert only(c.tick(max(2.0, c.wait_until)), g.NeedTargets)


def test_without_acknowledgements_the_next_round_waits_out_the_lease() -> None:
    c = coord(2, restart=True)
    running(c)
    c.on_message(1.0, "n2", g.Alive(G, 1, (), {1: 3}))
    assert c.lapse_until == pytest.approx(T.lapse_wait())  # the commit at 0 gave the last lease
    assert not only(c.tick(T.lapse_wait() - 0.01), g.NeedTargets)
    assert only(c.tick(T.lapse_wait()), g.NeedTargets)


def test_every_member_exiting_zero_ends_the_gang() -> None:
    c = coord(2)
    running(c)
    c.on_message(1.0, "n1", g.Alive(G, 1, (), {0: 0}))
    assert c.phase is Phase.RUNNING
    out = c.on_message(2.0, "n2", g.Alive(G, 1, (), {1: 0}))
    assert only(out, g.GangEnded) == [
        g.GangEnded(G, 1, True, "every member exited 0", {0: 0, 1: 0})
    ]


def test_a_nonstrict_gang_skips_refusals_and_ranks_the_members_it_got() -> None:
    c = coord(3, mode=g.Mode.NONSTRICT, min_available=2)
    start_round(c, 0.0, ["n1", "n2", "n3"])
    c.on_message(0.01, "n1", g.Refused(G, 1, "busy"))
    c.on_message(0.02, "n2", g.Granted(G, 1, 7))
    out = c.on_message(0.03, "n3", g.Granted(G, 1, 8))
    commits = dict(sends(out))
    assert commits == {
        "n2": g.Commit(G, 1, {1: 0}, 2, "n2", 7, T.run_ttl),
        "n3": g.Commit(G, 1, {2: 1}, 2, "n2", 7, T.run_ttl),
    }
    c.on_message(0.04, "n2", g.Started(G, 1, (1,)))
    out = c.on_message(0.05, "n3", g.Started(G, 1, (2,)))
    assert only(out, g.GangRunning)[0].world == 2
    # one member lost of two: under min-available, the gang fails
    c.on_node_dead(1.0, "n3")
    assert c.phase is Phase.ENDED and not c.result.ok


def test_a_nonstrict_gang_keeps_running_while_min_available_live() -> None:
    c = coord(3, mode=g.Mode.NONSTRICT, min_available=2)
    running(c)
    c.on_node_dead(1.0, "n3")
    assert c.phase is Phase.RUNNING
    out = c.tick(T.renew_every)
    assert {n for n, msg in sends(out) if isinstance(msg, g.Renew)} == {"n1", "n2"}


def test_a_node_dying_while_a_strict_gang_runs_fails_it() -> None:
    c = coord(3)
    running(c)
    c.on_node_dead(1.0, "n2")
    assert c.phase is Phase.ENDED and "n2 died" in c.result.reason


def test_cancel_timeout_and_round_limit_end_the_gang() -> None:
    c = coord(2)
    running(c)
    out = c.cancel(1.0, "cancelled by its user")
    assert c.result.reason == "cancelled by its user" and len(only(out, g.Send)) == 2

    c = coord(2, timeout=5.0)
    c.tick(0.0)
    c.on_targets(0.0, None, "no room")
    assert "no placement: no room" in c.why
    out = c.tick(5.0)
    assert c.phase is Phase.ENDED and "gang-timeout" in only(out, g.GangEnded)[0].reason

    c = coord(2, max_rounds=1)
    start_round(c, 0.0, ["n1", "n2"])
    c.on_message(0.01, "n1", g.Refused(G, 1, "busy"))
    assert c.phase is Phase.ENDED and "after 1 rounds" in c.result.reason


def test_answers_of_other_rounds_and_strangers_change_nothing() -> None:
    c = coord(2)
    start_round(c, 0.0, ["n1", "n2"])
    assert not sends(c.on_message(0.01, "n1", g.Granted(G, 0)))
    assert not sends(c.on_message(0.01, "n9", g.Granted(G, 1)))
    assert not sends(c.on_message(0.01, "n2", g.Granted(G, 1)))  # not its turn yet
    assert c.next_ask == 0 and c.phase is Phase.PREPARING


def test_a_commit_gone_fails_a_strict_round() -> None:
    c = coord(2)
    start_round(c, 0.0, ["n1", "n2"])
    c.on_message(0.01, "n1", g.Granted(G, 1))
    c.on_message(0.02, "n2", g.Granted(G, 1))
    c.on_message(0.03, "n1", g.Started(G, 1, (0,)))
    c.on_message(0.04, "n2", g.Gone(G, 1, "no hold for this round"))
    assert c.phase is Phase.WAITING and "could not start" in c.why
    assert c.lapse_until > 0.04  # n1 started a member: its lease must lapse or be aborted


# ------------------------------------------------------------------ the wire


@pytest.mark.parametrize(
    "msg",
    [
        g.Prepare(G, 2, (0, 3), 5.0),
        g.Commit(G, 2, {0: 0, 3: 3}, 4, "n2", 29500, 15.0),
        g.Renew(G, 2, 7, 15.0),
        g.Abort(G, 2, "x"),
        g.Granted(G, 2, 29500, 4),
        g.Queued(G, 2, 3, "room for 0 of 2; first in line"),
        g.Prepare(G, 2, (1,), 5.0, 7),
        g.Refused(G, 2, "busy"),
        g.Started(G, 2, (0, 3)),
        g.Alive(G, 2, (0,), {3: -9}),
        g.Gone(G, 2, "no"),
        g.Aborted(G, 2),
    ],
)
def test_every_message_round_trips(msg: g.Message) -> None:
    assert gangwire.from_wire(gangwire.to_wire(msg)) == msg


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"t": "prepare", "gang": G, "round": 1, "slots": [], "ttl": 1.0}, "'slots'"),
        ({"t": "prepare", "gang": G, "round": 1, "slots": [0, 0], "ttl": 1.0}, "'slots'"),
        ({"t": "prepare", "gang": "../x", "round": 1, "slots": [0], "ttl": 1.0}, "'gang'"),
        (
            {
                "t": "commit",
                "gang": G,
                "round": 1,
                "ranks": [[0, 5]],
                "world": 2,
                "master": "n",
                "port": 1,
                "ttl": 1.0,
            },
            "'ranks'",
        ),
        ({"t": "renew", "gang": G, "round": -1, "seq": 1, "ttl": 1.0}, "'round'"),
        ({"t": "granted", "gang": G, "round": 1, "port": 70000}, "'port'"),
        ({"t": "nope", "gang": G, "round": 1}, "'t'"),
        ({"t": "aborted", "gang": G, "round": 1, "extra": 1}, "extra"),
    ],
)
def test_a_bad_message_is_refused_naming_the_field(obj: dict, field: str) -> None:
    with pytest.raises(wire.WireError, match=field):
        gangwire.from_wire(obj)
