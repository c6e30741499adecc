"""What the membership core hands to its adapter: packets to send (`Outgoing`) and
events (`MemberEvent`, `LoadUpdated`, `AppMessage`, `AppState`), plus the load view's
entries (`LoadEntry`).

Plain values with no behaviour, in a module of their own so that the adapter
(runtime/peers.py), the driver and the simulator depend on the outputs only.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from swarm import model as m

Addr = tuple[str, int]
NodeId = m.NodeId


@attrs.frozen
class Outgoing:
    dest: Addr
    payload: bytes
    reliable: bool = False


class EventKind(enum.Enum):
    JOINED = "joined"  # first seen alive, or back after dead/left
    ALIVE = "alive"  # a suspicion was refuted
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"
    UPDATED = "updated"  # address or port changed


@attrs.frozen
class MemberEvent:
    kind: EventKind
    member: m.Member
    at: float


@attrs.frozen
class LoadUpdated:
    report: m.LoadReport
    at: float


@attrs.frozen
class AppMessage:
    origin: NodeId
    key: str
    payload: Mapping[str, Any] = attrs.field(hash=False)  # shared: treat as read-only
    at: float = 0.0


@attrs.frozen
class AppState:
    node: NodeId
    state: Mapping[str, Any] = attrs.field(hash=False)  # shared: treat as read-only
    at: float = 0.0


Event = MemberEvent | LoadUpdated | AppMessage | AppState


@attrs.frozen
class LoadEntry:
    report: m.LoadReport
    received_at: float  # local time of receipt (for ourselves: of set_local_load)

    def age(self, now: float) -> float:
        return now - self.received_at
