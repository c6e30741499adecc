"""Arrays in the pure NodeState (node/arrays.py): one record, elements created lazily
up to the cap, the record following them (RUNNING, then the worst exit), cancel, and a
restarted home going on from its journaled progress without creating any twice."""

from __future__ import annotations

from typing import Any

import pytest

from swarm import model as m
from swarm import wire
from swarm.node import events as ev
from swarm.node.arrays import ARRAY, CHUNK, TICK, WINDOW, element_id, restore_array_progress
from swarm.node.state import Settings
from swarm.request_checks import submit_spec

from .node_harness import FakeNode

S = m.TaskState


class ArrayNode(FakeNode):
    def __init__(self) -> None:
        super().__init__("A", settings=Settings(slots=100))
        self.run(self.state.start_timers(0.0))
        self.clock = 0.0

    def submit_array(self, text: str, tid: str = "job~alice") -> m.TaskSpec:
        spec = self.submit(
            m.TaskSpec(
                id=tid, argv=("echo", "{index}", "{{index}}"), uid=1000, user="alice", array=text
            )
        )
        self.run(self.state.handle(ev.ArraySubmitted(0.0, 1000.0, "s", spec.id)))
        return spec

    def elements(self) -> list[m.Task]:
        return [t for t in self.state.records.active.values() if t.spec.element is not None]

    def end(self, tid: str, code: int = 0, now: float | None = None) -> None:
        """The element's record ends by a way that does not tell its array (the look
        every TICK seconds finds it)."""
        self.clock += TICK
        now = self.clock if now is None else now
        dst = S.SUCCEEDED if code == 0 else S.FAILED
        t = self.state.records.active[tid]
        if t.state is S.QUEUED:
            t = self.state.records.apply(tid, S.RUNNING, 1000.0 + now, "started", node="A")
        done = self.state.records.apply(tid, dst, 1000.0 + now, f"exit {code}", exit_code=code)
        self.run([ev.Record(done, durable=True)])
        self.run(self.state.handle(ev.Wake(now + TICK, 1000.0 + now + TICK, "w")))


def test_elements_come_up_to_the_cap_and_one_more_as_each_ends() -> None:
    n = ArrayNode()
    spec = n.submit_array("0-9%3")
    els = sorted(n.elements(), key=lambda t: t.spec.element.index if t.spec.element else 0)
    assert [t.id for t in els] == ["job_0~alice", "job_1~alice", "job_2~alice"]
    assert els[1].spec.argv == ("echo", "1", "{index}")
    assert (
        els[1].spec.env["SWARM_ARRAY_ID"] == spec.id and els[1].spec.env["SWARM_ARRAY_INDEX"] == "1"
    )
    assert n.placements == [t.id for t in els]  # placed as any task
    assert n.state.records.active[spec.id].state is S.RUNNING
    n.end("job_0~alice")
    assert sorted(t.id for t in n.elements()) == ["job_1~alice", "job_2~alice", "job_3~alice"]
    counts = n.state.array_counts(spec.id)
    assert counts == {"succeeded": 1, "queued": 3, "pending": 6}
    assert n.kv[ARRAY + spec.id]["next"] == 4
    while n.elements():
        for t in n.elements():
            n.end(t.id, 3 if t.spec.element and t.spec.element.index == 7 else 0)
    done = n.state.records.get_cached(spec.id)
    assert done is not None and done.state is S.FAILED and done.exit_code == 3
    assert "1 failed, 9 succeeded" in done.reason
    assert ARRAY + spec.id not in n.kv


def test_an_array_without_a_cap_keeps_a_window_of_elements() -> None:
    """Elements come CHUNK per turn of the loop (a wake at once for the next), up to
    the window, and no further while none has ended."""
    n = ArrayNode()
    n.submit_array("0-999999")
    assert len(n.elements()) == CHUNK
    turns = 0
    while len(n.elements()) < WINDOW:
        turns += 1
        n.run(n.state.handle(ev.Wake(50.0, 1050.0, f"w{turns}")))
        assert turns <= WINDOW // CHUNK
    n.run(n.state.handle(ev.Wake(51.0, 1051.0, "again")))
    assert len(n.elements()) == WINDOW
    assert turns == -(-WINDOW // CHUNK) - 1


def test_many_ends_at_once_make_one_chunk_per_turn() -> None:
    """Issue 23: ends arriving together (a batch of runners' reports) count at once,
    but the elements they make room for still come CHUNK per turn of the loop: making
    them at each end created thousands in one step and halved the placed rate."""
    n = ArrayNode()
    spec = n.submit_array("0-99999%600")
    while len(n.elements()) < 600:
        n.run(n.state.handle(ev.Wake(1.0, 1001.0, "fill")))
    out: list[ev.Instruction] = []
    for t in n.elements()[:400]:
        t = n.state.records.apply(t.id, S.RUNNING, 1002.0, "started", node="A")
        done = n.state.records.apply(t.id, S.SUCCEEDED, 1002.0, "exit 0", exit_code=0)
        n.run([ev.Record(done, durable=True)])
        out += n.state.array_element_ended(done, 2.0, 1002.0)
    assert n.state.array_counts(spec.id) == {"succeeded": 400, "queued": 200, "pending": 99400}
    assert len(n.elements()) == 200 and out == [ev.WakeAt(2.0)]  # one turn owed
    n.run(n.state.handle(ev.Wake(2.0, 1002.0, "turn")))
    assert len(n.elements()) == 200 + CHUNK
    assert n.kv[ARRAY + spec.id]["done"] == {"succeeded": 400}  # journaled with them


def test_a_chunk_of_elements_is_placed_by_one_instruction() -> None:
    """Issue 23: the chunk's elements are recorded, then placed together (`PlaceMany`:
    the driver carries their offers out in one task with one journal commit), not one
    `Place` each."""
    n = ArrayNode()
    spec = n.submit_array("0-999")
    out = n.state.handle(ev.Wake(50.0, 1050.0, "turn"))
    many = [i for i in out if isinstance(i, ev.PlaceMany)]
    assert not any(isinstance(i, ev.Place) for i in out)
    assert len(many) == 1 and len(many[0].task_ids) == CHUNK
    recorded = [i.task.id for i in out if isinstance(i, ev.Record) and i.task.id != spec.id]
    assert list(many[0].task_ids) == recorded  # recorded first, in index order
    assert out.index(many[0]) > max(
        k for k, i in enumerate(out) if isinstance(i, ev.Record) and i.task.id != spec.id
    )


def test_all_succeeded_is_success_and_cancel_stops_creating() -> None:
    n = ArrayNode()
    spec = n.submit_array("1,5,7-9")
    assert sorted(t.spec.element.index for t in n.elements() if t.spec.element) == [1, 5, 7, 8, 9]
    for t in n.elements():
        n.end(t.id)
    assert n.state.records.get_cached(spec.id).state is S.SUCCEEDED  # type: ignore[union-attr]
    n2 = ArrayNode()
    spec2 = n2.submit_array("0-99%2", tid="big")
    ids, out = n2.state.array_cancel(spec2.id, "cancelled by uid 0", 1001.0)
    n2.run(out)
    assert sorted(ids) == ["big_0", "big_1"]
    for tid in ids:  # the runtime cancels each
        t = n2.state.records.apply(tid, S.CANCELLED, 1002.0, "cancelled by uid 0")
        n2.run([ev.Record(t)])
    n2.run(n2.state.handle(ev.Wake(50.0, 1050.0, "w")))
    assert n2.elements() == []
    rec = n2.state.records.get_cached("big")
    assert rec is not None and rec.state is S.CANCELLED


def test_a_restarted_home_goes_on_without_creating_an_element_twice() -> None:
    n = ArrayNode()
    spec = n.submit_array("0-9%3")
    n.end("job_0~alice")
    saved = dict(n.kv)
    # the restart: the same records, the journaled progress, a new state machine
    n2 = ArrayNode()
    for t in [*n.state.records.active.values(), *n.state.records.finished.values()]:
        n2.state.records.store(t)
    n2.state.array_progress = restore_array_progress(saved)
    n2.run(n2.state.handle(ev.ArraySubmitted(2.0, 1002.0, "s", spec.id)))
    assert sorted(t.id for t in n2.elements()) == ["job_1~alice", "job_2~alice", "job_3~alice"]
    assert n2.state.array_counts(spec.id) == {"succeeded": 1, "queued": 3, "pending": 6}


def test_element_ids_keep_the_owner_part() -> None:
    assert element_id("job~alice", 12) == "job_12~alice"
    assert element_id("t0123456789abcdef", 0) == "t0123456789abcdef_0"


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"array": "5-1"}, "ends before it starts"),
        ({"array": "0-9%0"}, "%0 would run nothing"),
        ({"array": "0-2000000"}, "more than the most allowed"),
        ({"array": "0-9", "is_global": True}, "does not combine with --global"),
        ({"array": "1,1"}, "given twice"),
    ],
)
def test_bad_arrays_name_the_field(fields: dict[str, Any], why: str) -> None:
    f = wire.Fields({"argv": ["x"], **fields}, "submit")
    with pytest.raises(wire.WireError, match=why):
        submit_spec(f, uid=0, user="root", home="A", now=0.0)


def test_explain_says_where_an_array_stands() -> None:
    n = ArrayNode()
    spec = n.submit_array("0-9%3")
    why = n.state.array_explain(spec.id)
    assert why is not None and why.startswith("array of 10 elements (at most 3 at once): ")
    assert "3 queued" in why and "7 pending" in why
    assert "the next is created when one of the 3 unfinished ends" in why
    n.state.array_cancel(spec.id, "cancelled by uid 0", 1001.0)
    assert "no more are created" in (n.state.array_explain(spec.id) or "")
    assert n.state.array_explain("nope") is None


def test_an_element_that_ends_at_another_node_lets_the_next_come_at_once() -> None:
    """Issue 23: the runner's report of an element's end counts it in its array at
    once (node/location.py): with a cap of 1, the next element is made at the loop's
    next turn after the report lands, not at the array's next look (TICK seconds
    later)."""
    from .node_harness import FakeNet

    h = ArrayNode()
    b = FakeNode("B")
    net = FakeNet(h, b)
    spec = h.submit_array("0-2%1")
    [first] = h.elements()
    why, instrs = h.state.offer(first.id, "B", 0.0, 0.0)
    assert why is None
    h.run(instrs)
    net.settle()
    assert b.try_start(first.id) is None
    b.finish(first.id, 0)
    net.settle()  # the report reaches the home
    assert h.state.records.get_cached(first.id).state is S.SUCCEEDED
    assert h.state.array_counts(spec.id) == {"succeeded": 1, "pending": 2}
    turn = h.state.due["array_fill"]  # the next turn of the loop, not the look
    assert turn < h.state.due["arrays"]
    h.run(h.state.handle(ev.Wake(turn, 1000.0 + turn, "w")))
    assert [t.id for t in h.elements()] == [element_id(spec.id, 1)]
    assert h.state.array_counts(spec.id) == {"succeeded": 1, "queued": 1, "pending": 1}
