"""Charges a home keeps on its view of a peer until a report made after the peer took
the task arrives (policy/charges.py; issue 23's burst balance)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.cluster import handoff as h
from swarm.model import LoadReport
from swarm.policy.charges import MAX_AGE, Charges


def _report(version: int, queued: int = 0) -> LoadReport:
    return LoadReport("p", version, queued=queued, weight_sum=float(queued), slots=8)


def test_a_report_made_before_the_peer_took_the_task_keeps_its_charge() -> None:
    c = Charges()
    assert c.add("p", "t1", 1.0, now=0.0)
    c.answered("p", "t1", stamp=5_000)  # the peer took it at its 5,000 ms
    seen = c.on_report(_report(4_990, queued=3), now=0.1)  # made 10 ms before
    assert (seen.queued, seen.weight_sum) == (4, 4.0)  # its 3 and ours
    seen = c.on_report(_report(5_001, queued=4), now=0.2)  # made after: it counts it
    assert (seen.queued, seen.weight_sum) == (4, 4.0)  # never twice
    assert c.pending("p") == 0


def test_an_offer_not_answered_yet_stays_charged_and_a_failed_one_goes() -> None:
    c = Charges()
    c.add("p", "t1", 2.0, now=0.0)
    c.add("p", "t2", 1.0, now=0.0)
    assert c.on_report(_report(9_999_999), now=1.0).queued == 2  # in flight: both stay
    c.drop("p", "t1")  # refused
    seen = c.on_report(_report(9_999_999), now=1.0)
    assert (seen.queued, seen.weight_sum) == (1, 1.0)


def test_a_peer_that_gives_no_stamp_has_its_charge_wiped_by_its_next_report() -> None:
    """An answer without `at` (0): as before issue 23's second round."""
    c = Charges()
    c.add("p", "t1", 1.0, now=0.0)
    c.answered("p", "t1", stamp=0)
    assert c.on_report(_report(1), now=0.1).queued == 0
    assert c.pending("p") == 0


def test_a_charge_is_charged_once_and_lives_at_most_max_age() -> None:
    c = Charges()
    assert c.add("p", "t1", 1.0, now=0.0)
    assert not c.add("p", "t1", 1.0, now=0.5)  # its commit: already charged at the offer
    c.answered("p", "t1", stamp=10**12)  # a clock far ahead: never passed by a report
    assert c.on_report(_report(1), now=MAX_AGE).queued == 1
    assert c.on_report(_report(2), now=MAX_AGE + 0.01).queued == 0
    c.add("q", "t2", 1.0, now=0.0)
    c.forget("q")  # dead
    assert c.pending("q") == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "answer", "drop", "report"]), st.integers(0, 5)),
        max_size=60,
    )
)
def test_the_view_is_the_report_plus_exactly_the_charges_it_lacks(
    steps: list[tuple[str, int]],
) -> None:
    """Against a model: a charge counts while unanswered, or while the report's version
    is not past its stamp; the report's own figures are never changed otherwise."""
    c = Charges()
    model: dict[str, int | None] = {}  # task -> stamp (None: unanswered)
    clock = 100
    for kind, k in steps:
        tid = f"t{k}"
        clock += 1
        if kind == "add":
            if c.add("p", tid, 1.0, now=0.0):
                model[tid] = None
        elif kind == "answer" and tid in model:
            c.answered("p", tid, stamp=clock)
            model[tid] = clock
        elif kind == "drop":
            c.drop("p", tid)
            model.pop(tid, None)
        elif kind == "report":
            version = clock - k  # made up to 5 ms ago
            seen = c.on_report(_report(version, queued=7), now=0.0)
            model = {t: s for t, s in model.items() if s is None or version <= s}
            assert seen.queued == 7 + len(model)
            assert seen.weight_sum == 7.0 + len(model)
            assert seen.version == version


def test_the_stamp_travels_on_the_reply_and_an_old_reply_reads_as_none() -> None:
    r = h.Reply("t1", 3, True, at=1_700_000_000_123)
    assert h.reply_from_wire(h.reply_to_wire(r)) == r
    old = h.reply_to_wire(h.Reply("t1", 3, True))
    assert "at" not in old and h.reply_from_wire(old).at == 0
    for bad in (-1, "soon", 2**63):
        try:
            h.reply_from_wire({**old, "at": bad})
        except Exception as e:
            assert "at" in str(e)
        else:
            raise AssertionError(f"at={bad!r} accepted")
