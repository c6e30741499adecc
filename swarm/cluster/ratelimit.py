"""Pure admission policies for unauthenticated network input (issue 17, items 7 and 10).

Nothing here does I/O or reads a clock: every decision takes `now` (seconds from any
fixed origin). The agent's transport asks before it spends work on bytes it has not
authenticated yet:

* `SourceLimiter`: per-source token buckets plus one shared bucket, for the costly
  step of opening a packet from a sender instance not seen before (an HKDF key
  derivation). A flood from one address drains its own bucket; the shared bucket caps
  what all strangers together may cost.
* `ConnGate`: how many TCP connections may wait for their hello, per source address
  and in all. When full, the oldest unauthenticated connection (of the source that
  holds the most) is evicted, so idle connections can never crowd out a peer that
  is about to authenticate.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import attrs


def _positive(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
    if not value > 0:
        raise ValueError(f"{attr.name} must be > 0, got {value!r}")


@attrs.define
class TokenBucket:
    """`rate` tokens per second, at most `burst` saved; starts full."""

    rate: float = attrs.field(validator=_positive)
    burst: float = attrs.field(validator=_positive)
    tokens: float = attrs.field(default=-1.0)
    stamp: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def refill(self, now: float) -> None:
        if self.stamp is not None and now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        if self.stamp is None or now > self.stamp:
            self.stamp = now

    def available(self, now: float, n: float = 1.0) -> bool:
        self.refill(now)
        return self.tokens >= n

    def take(self, now: float, n: float = 1.0) -> bool:
        """Spend `n` tokens if there are that many; False (nothing spent) if not."""
        self.refill(now)
        if self.tokens < n:
            return False
        self.tokens -= n
        return True


@attrs.define
class SourceLimiter:
    """Per-source buckets (`rate`/`burst`) and one bucket shared by every source
    (`total_rate`/`total_burst`). At most `max_sources` per-source buckets are kept
    (least recently used dropped; a dropped source starts again with a full bucket,
    which the shared bucket still bounds)."""

    rate: float = attrs.field(default=20.0, validator=_positive)
    burst: float = attrs.field(default=50.0, validator=_positive)
    total_rate: float = attrs.field(default=200.0, validator=_positive)
    total_burst: float = attrs.field(default=400.0, validator=_positive)
    max_sources: int = attrs.field(default=4096, validator=_positive)
    _buckets: OrderedDict[str, TokenBucket] = attrs.field(init=False, factory=OrderedDict)
    _total: TokenBucket = attrs.field(init=False)
    denied: int = attrs.field(init=False, default=0)

    @_total.default
    def _make_total(self) -> TokenBucket:
        return TokenBucket(self.total_rate, self.total_burst)

    def allow(self, source: str, now: float) -> bool:
        """One unit of work for `source`: True if both its bucket and the shared one
        have a token (both are then charged), else False (neither is)."""
        b = self._buckets.get(source)
        if b is None:
            b = TokenBucket(self.rate, self.burst)
            self._buckets[source] = b
            if len(self._buckets) > self.max_sources:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(source)
        if not b.available(now) or not self._total.available(now):
            self.denied += 1
            return False
        b.take(now)
        self._total.take(now)
        return True

    @property
    def sources(self) -> int:
        return len(self._buckets)


@attrs.frozen
class Admission:
    """What to do with a new connection: `admit` it or not, and which connections to
    close first (`evict`, oldest first)."""

    admit: bool
    evict: tuple[int, ...] = ()
    reason: str = ""


@attrs.define
class ConnGate:
    """Inbound TCP connection slots. A connection is *pending* from accept until its
    hello authenticates (`authenticated`), then it counts only towards `max_total`.

    - at most `max_pending_per_source` pending per source: a new one evicts that
      source's oldest pending connection;
    - at most `max_pending` pending in all: a new one evicts the oldest pending
      connection of the source holding the most;
    - at most `max_total` connections in all: a new one evicts as above if anything is
      pending, else it is refused (every slot holds an authenticated peer).
    """

    max_total: int = attrs.field(default=256, validator=_positive)
    max_pending: int = attrs.field(default=128, validator=_positive)
    max_pending_per_source: int = attrs.field(default=32, validator=_positive)
    _pending: dict[str, OrderedDict[int, float]] = attrs.field(init=False, factory=dict)
    _source_of: dict[int, str] = attrs.field(init=False, factory=dict)
    _authed: set[int] = attrs.field(init=False, factory=set)

    @property
    def total(self) -> int:
        return len(self._source_of)

    @property
    def pending(self) -> int:
        return len(self._source_of) - len(self._authed)

    def pending_from(self, source: str) -> int:
        return len(self._pending.get(source, ()))

    def _evict_oldest_of(self, source: str) -> int:
        conns = self._pending[source]
        conn, _ = conns.popitem(last=False)
        if not conns:
            del self._pending[source]
        del self._source_of[conn]
        return conn

    def _largest_source(self) -> str:
        # ties: the source whose oldest pending connection is oldest
        return max(
            self._pending,
            key=lambda s: (len(self._pending[s]), -next(iter(self._pending[s].values()))),
        )

    def open(self, conn: int, source: str, now: float) -> Admission:
        if conn in self._source_of:
            raise ValueError(f"connection {conn} is already open")
        evict: list[int] = []
        reason = ""
        if self.pending_from(source) >= self.max_pending_per_source:
            evict.append(self._evict_oldest_of(source))
            reason = "source_pending_full"
        elif self.pending >= self.max_pending:
            evict.append(self._evict_oldest_of(self._largest_source()))
            reason = "pending_full"
        if self.total >= self.max_total:
            if not self._pending:
                return Admission(False, tuple(evict), "full")
            evict.append(self._evict_oldest_of(self._largest_source()))
            reason = reason or "full"
        self._pending.setdefault(source, OrderedDict())[conn] = now
        self._source_of[conn] = source
        return Admission(True, tuple(evict), reason)

    def authenticated(self, conn: int) -> None:
        """The connection's hello opened: it no longer counts as pending. Unknown (for
        example already evicted) connections are ignored."""
        source = self._source_of.get(conn)
        if source is None or conn in self._authed:
            return
        conns = self._pending[source]
        del conns[conn]
        if not conns:
            del self._pending[source]
        self._authed.add(conn)

    def is_open(self, conn: int) -> bool:
        return conn in self._source_of

    def close(self, conn: int) -> None:
        """The connection ended (or was evicted); unknown connections are ignored."""
        source = self._source_of.pop(conn, None)
        if source is None:
            return
        if conn in self._authed:
            self._authed.discard(conn)
            return
        conns = self._pending[source]
        del conns[conn]
        if not conns:
            del self._pending[source]
