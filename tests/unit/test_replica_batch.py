"""Replica messages batched per peer (runtime/replicabatch.py, issue 23): concurrent
messages to one peer share an RPC, each keeps its own answer, a lost batch is a lost
answer for each, and the receiver journals a batch in one commit."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from swarm import model as m
from swarm import wire
from swarm.node import events as ev
from swarm.node.replicas import ReplicaMsg, replica_msg_to_wire
from swarm.runtime import replicabatch as rb
from swarm.runtime.net import TransportError

SPEC = m.TaskSpec(id="t0123456789abcdef", argv=("true",), home="n1")


def _hold(tid: str) -> ReplicaMsg:
    return ReplicaMsg("hold", tid, "n1", "", ("n2",), m.TaskSpec(id=tid, argv=("x",), home="n1"))


class FakeCluster:
    def __init__(self, answer: Any = None, fail: Exception | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.answer = answer
        self.fail = fail

    async def request(self, dest: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.calls.append(msg)
        await trio.sleep(0.01)  # a round trip: what queues meanwhile goes in the next
        if self.fail is not None:
            raise self.fail
        if self.answer is not None:
            return self.answer(msg)
        return {"answers": [{"ok": not x["id"].endswith("no")} for x in msg["msgs"]]}


class FakeDriver:
    def __init__(self, cluster: FakeCluster, nursery: trio.Nursery) -> None:
        self.cluster = cluster
        self.io_counters: dict[str, int] = {}
        self.logged: list[str] = []
        self.log = self
        self.nursery = nursery
        self.state: Any = None
        self.executed: list[list[ev.Instruction]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.logged.append(event)

    debug = info

    def _spawn(self, fn: Any, *args: Any) -> None:
        self.nursery.start_soon(fn, *args)

    async def execute_batch(self, instrs: list[ev.Instruction]) -> None:
        self.executed.append(instrs)


async def _send_all(cluster: FakeCluster, tids: list[str]) -> tuple[dict[str, bool], FakeDriver]:
    got: dict[str, bool] = {}
    async with trio.open_nursery() as n:
        d = FakeDriver(cluster, n)
        box = rb.ReplicaOutbox(d)

        async def one(tid: str) -> None:
            got[tid] = await box.send("n2", _hold(tid))

        for tid in tids:
            n.start_soon(one, tid)
    return got, d


async def test_concurrent_messages_to_one_peer_share_rpcs_and_keep_their_own_answers() -> None:
    cluster = FakeCluster()
    tids = [f"t{i:03d}" for i in range(40)] + ["t-no"]
    got, d = await _send_all(cluster, tids)
    assert got == {t: not t.endswith("no") for t in tids}
    assert len(cluster.calls) <= 2  # the first alone, the rest while it was out
    assert sum(len(c["msgs"]) for c in cluster.calls) == len(tids)
    assert d.io_counters["replica_msgs"] == len(tids)
    assert "replica.refused" in d.logged


async def test_runner_and_release_news_linger_to_travel_together_and_holds_do_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """News posted one at a time (a draining queue: tasks start and end apart) waits
    NEWS_LINGER for company and goes in one RPC; a hold sent meanwhile (a submission's
    answer waits for it) leaves at once, in its own."""
    cluster = FakeCluster()
    answered: list[tuple[str, bool]] = []
    hold_at: list[float] = []
    async with trio.open_nursery() as n:
        d = FakeDriver(cluster, n)
        box = rb.ReplicaOutbox(d)
        t0 = trio.current_time()
        step = rb.NEWS_LINGER / 10
        for i in range(5):
            tid = f"t{i:03d}"
            msg = ReplicaMsg("runner" if i % 2 else "release", tid, "n1", "n3", ("n2",))
            box.post("n2", msg, lambda ok, tid=tid: answered.append((tid, ok)))
            await trio.sleep(step)
        assert await box.send("n2", _hold("thold"))
        hold_at.append(trio.current_time() - t0)
    kinds = [[x["kind"] for x in c["msgs"]] for c in cluster.calls]
    assert kinds == [["hold"], ["release", "runner", "release", "runner", "release"]], kinds
    assert hold_at[0] < rb.NEWS_LINGER  # the hold did not wait for the news
    assert sorted(answered) == [(f"t{i:03d}", True) for i in range(5)]


async def test_a_lost_batch_is_no_answer_for_each_message() -> None:
    got, d = await _send_all(FakeCluster(fail=TransportError("timed out")), ["ta", "tb", "tc"])
    assert got == {"ta": False, "tb": False, "tc": False}
    assert d.io_counters["replica_rpc_failures"] >= 1


async def test_answers_that_do_not_match_the_messages_count_as_none() -> None:
    got, _ = await _send_all(FakeCluster(answer=lambda msg: {"answers": [{"ok": True}]}), ["ta"])
    assert got == {"ta": True}
    short = FakeCluster(answer=lambda msg: {"answers": []})
    got, _ = await _send_all(short, ["ta", "tb"])
    assert got == {"ta": False, "tb": False}


async def test_a_batch_too_big_for_one_frame_is_halved() -> None:
    def answer(msg: dict[str, Any]) -> dict[str, Any]:
        if len(msg["msgs"]) > 2:
            raise TransportError("frame of 5000000 bytes exceeds the limit")
        return {"answers": [{"ok": True} for _ in msg["msgs"]]}

    cluster = FakeCluster(answer=answer)
    got, _ = await _send_all(cluster, [f"t{i}" for i in range(7)])
    assert all(got.values()) and len(got) == 7


class FakeState:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_replica(self, sender: str, msg: ReplicaMsg) -> tuple[str | None, list[ev.Instruction]]:
        self.seen.append((sender, msg.task_id))
        if msg.task_id.endswith("no"):
            return "not from its home", []
        return None, [ev.Persist((ev.Put("replica:" + msg.task_id, {}),), durable=True)]


async def test_the_receiver_answers_each_in_order_and_journals_the_lot_once() -> None:
    async with trio.open_nursery() as n:
        d = FakeDriver(FakeCluster(), n)
        d.state = FakeState()
        msgs = [replica_msg_to_wire(_hold(t)) for t in ("ta", "t-no", "tb")]
        out = await rb.serve_batch(d, {"op": "replica_batch", "msgs": msgs}, "n1")
    assert [a["ok"] for a in out["answers"]] == [True, False, True]
    assert out["answers"][1]["reason"] == "not from its home"
    assert d.state.seen == [("n1", "ta"), ("n1", "t-no"), ("n1", "tb")]
    assert len(d.executed) == 1 and len(d.executed[0]) == 2  # one commit for both copies


@pytest.mark.parametrize(
    "msgs, field",
    [
        (None, "msgs"),
        ([], "msgs"),
        ([replica_msg_to_wire(_hold("ta"))] * (rb.ACCEPT_BATCH + 1), "msgs"),
        ([replica_msg_to_wire(_hold("ta")), {"kind": "hold"}], "replica"),
    ],
)
def test_a_malformed_batch_is_refused_whole_naming_the_field(msgs: Any, field: str) -> None:
    with pytest.raises(wire.WireError, match=field):
        rb.batch_from_wire(msgs)
