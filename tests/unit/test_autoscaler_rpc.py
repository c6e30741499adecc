"""Bad input to the elastic pools' peer requests (runtime/autoscaler.py): a malformed
`scale-drain` or `scale-work` gets one clear error naming the field, a pool this node
does not carry is refused, and neither ever changes the node's shares."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from swarm import model as m
from swarm.logs import NULL_LOG
from swarm.policy.scalepool import parse_pool
from swarm.runtime.autoscaler import Autoscaler
from swarm.runtime.clock import Clock
from swarm.runtime.peers import RemoteError

POOL = parse_pool("gpu", {"scale-out-command": "add.sh", "scale-in-command": "rm.sh"})


class FakeShares:
    def __init__(self) -> None:
        self.calls: list[tuple[bool, str]] = []
        self.coord = SimpleNamespace(state=SimpleNamespace(records=SimpleNamespace(active={})))

    async def set_drain(self, on: bool, why: str) -> dict[str, Any]:
        self.calls.append((on, why))
        return {"shares": 0 if on else 1024}


def _scaler() -> tuple[Autoscaler, FakeShares]:
    shares = FakeShares()
    cluster = SimpleNamespace(node="n1")
    report = m.LoadReport(node="n1", version=1, shares=0, homing=2)
    a = Autoscaler(
        (POOL,),
        cluster,
        None,
        shares,
        lambda: report,
        Clock.fixed(),
        NULL_LOG,  # type: ignore[arg-type]
    )
    return a, shares


BASE = {"op": "scale-drain", "v": 1, "from": "n2", "pool": "gpu", "drain": True}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"pool": None}, "pool"),
        ({"pool": 7}, "pool"),
        ({"pool": "x" * 65}, "pool"),
        ({"drain": "yes"}, "drain"),
        ({"drain": None}, "drain"),
        ({"why": ["a"]}, "why"),
        ({"surprise": 1}, "surprise"),
    ],
)
async def test_a_malformed_drain_names_the_field(change: dict[str, Any], field: str) -> None:
    a, shares = _scaler()
    req = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(RemoteError) as e:
        await a.rpc_drain(req, "n2", None)
    assert e.value.code == "bad_request" and field in e.value.message
    assert shares.calls == []


async def test_a_drain_for_a_pool_not_carried_here_is_refused() -> None:
    a, shares = _scaler()
    with pytest.raises(RemoteError) as e:
        await a.rpc_drain({**BASE, "pool": "web"}, "n2", None)
    assert e.value.code == "not_found" and "'web'" in e.value.message
    assert shares.calls == []


async def test_a_good_drain_is_journaled_with_who_asked() -> None:
    a, shares = _scaler()
    assert await a.rpc_drain({**BASE, "why": "scale-in of pool gpu"}, "n2", None) == {"shares": 0}
    assert shares.calls == [(True, "scale-in of pool gpu (asked by n2)")]


async def test_scale_work_checks_its_input_and_answers_what_the_node_holds() -> None:
    a, _ = _scaler()
    ask = {"op": "scale-work", "v": 1, "from": "n2", "pool": "gpu"}
    assert await a.rpc_work(ask, "n2", None) == {"work": 0, "draining": True, "homing": 2}
    for bad, field in (({"pool": 3}, "pool"), ({"extra": 1}, "extra")):
        with pytest.raises(RemoteError) as e:
            await a.rpc_work({**ask, **bad}, "n2", None)
        assert e.value.code == "bad_request" and field in e.value.message
    with pytest.raises(RemoteError) as e:
        await a.rpc_work({**ask, "pool": "web"}, "n2", None)
    assert e.value.code == "not_found"
