"""Opt-in Prometheus endpoint (`--metrics ADDR:PORT`), read from the node's stats
snapshot (runtime/stats.py, the one `swarm info` answers) at scrape time.

The agent already counts everything (coordinator, transport, membership, API,
journal); this module only renders those counters in the Prometheus text format
through prometheus-client's exposition code, when a scraper asks. Nothing is updated
on the hot paths, and no second copy of any counter exists.

Names are `swarm_`-prefixed and in base units (seconds, bytes); labels take values
from small fixed sets (task state, peer state, direction, message kind, drop reason),
never task ids or peer names, so the series count does not grow with the cluster.

The HTTP side is a few lines of trio rather than prometheus-client's threaded server:
collecting in the event loop's own thread means the agent's dicts are never read
while they change.

prometheus-client is the `metrics` extra; without it the agent runs as before, and
only `--metrics` is refused, with the command that installs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import trio

from ..config import ConfigError
from ..logs import NULL_LOG, EventLog

# the node's stats snapshot (runtime/stats.py, `Stats.snapshot(detail=True)`): the
# same dict `swarm info` answers, plus a few figures only rendered here
Snapshot = Callable[[], dict[str, Any]]

MAX_REQUEST = 8192
CLIENT_TIMEOUT = 10.0


def parse_listen(value: str) -> tuple[str, int]:
    """`ADDR:PORT`, `[v6]:PORT` or `:PORT` (all addresses) into (host, port)."""
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError("metrics", f"expected ADDR:PORT, got {value!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ConfigError("metrics", f"port out of range in {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", port


def require_client() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ConfigError(
            "metrics",
            "needs prometheus-client: pip install 'swarm[metrics]' (or leave --metrics unset)",
        ) from None


class AgentCollector:
    """A prometheus-client collector reading one agent's stats snapshot."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def describe(self) -> list[Any]:
        return []  # unchecked collector: families come from collect()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        a = self.snapshot()

        def gauge(name: str, doc: str, value: float | None = None, labels: Any = ()) -> Any:
            g = GaugeMetricFamily(name, doc, labels=list(labels))
            if value is not None:
                g.add_metric([], value)
            return g

        def counter(name: str, doc: str, value: float | None = None, labels: Any = ()) -> Any:
            c = CounterMetricFamily(name, doc, labels=list(labels))
            if value is not None:
                c.add_metric([], value)
            return c

        info = gauge("swarm_build_info", "swarm version (always 1)", labels=["version"])
        from .. import __version__

        info.add_metric([__version__], 1)
        yield info
        yield gauge("swarm_start_time_seconds", "agent start, unix time", a["started_at"])
        iso = gauge("swarm_isolation_info", "task isolation in use (always 1)", labels=["kind"])
        iso.add_metric([a["isolation"]], 1)
        yield iso

        # ---------------------------------------------------------- tasks
        yield gauge("swarm_slots", "tasks this node runs at once", a["slots"])
        yield gauge("swarm_shares", "this node's shares (0 = draining)", a["shares"])
        yield gauge("swarm_running_tasks", "task processes running here", a["running"])
        yield gauge("swarm_run_queue_length", "tasks queued to run here", a["queued"])
        tasks = gauge("swarm_tasks", "unfinished tasks known here, by state", labels=["state"])
        for state, n in sorted(a["tasks_by_state"].items()):
            tasks.add_metric([state], n)
        yield tasks
        moves = counter(
            "swarm_task_transitions", "task state changes, by new state", labels=["state"]
        )
        for state, n in a["transitions"].items():
            moves.add_metric([state], n)
        yield moves
        yield counter("swarm_task_oom_kills", "tasks killed at their memory limit", a["oom_kills"])

        # ---------------------------------------------------- coordinator
        c = a["coordinator"]
        yield counter(
            "swarm_placement_attempts", "placement decisions taken", c.get("placements", 0)
        )
        placed = counter("swarm_placements", "tasks placed, by where", labels=["where"])
        placed.add_metric(["local"], c.get("placed_local", 0))
        placed.add_metric(["remote"], c.get("placed_remote", 0))
        yield placed
        failed = counter(
            "swarm_handoff_offers_failed", "task offers that did not land", labels=["reason"]
        )
        failed.add_metric(["refused"], c.get("offers_refused", 0))
        failed.add_metric(["unreachable"], c.get("offers_failed", 0))
        yield failed
        yield counter(
            "swarm_handoff_rpcs", "handoff messages (batches) sent", c.get("handoff_rpcs", 0)
        )
        yield counter(
            "swarm_handoff_requests",
            "handoff requests sent, in those batches",
            c.get("handoff_batched", 0),
        )
        yield counter(
            "swarm_handoff_rpc_failures",
            "handoff messages without an answer (each request in them is retried)",
            c.get("handoff_rpc_failures", 0),
        )
        yield counter(
            "swarm_replica_rpcs", "replica messages (batches) sent", c.get("replica_rpcs", 0)
        )
        yield counter(
            "swarm_replica_msgs",
            "replica messages (hold, runner, release) sent, in those batches",
            c.get("replica_msgs", 0),
        )
        yield counter(
            "swarm_replica_rpc_failures",
            "replica batches without an answer (each message in them counts as unanswered)",
            c.get("replica_rpc_failures", 0),
        )
        transfers = counter("swarm_transfers", "queued tasks moved, by kind", labels=["kind"])
        transfers.add_metric(["push"], c.get("transfers_pushed", 0))
        transfers.add_metric(["steal"], c.get("transfers_stolen", 0))
        yield transfers
        yield counter(
            "swarm_tasks_requeued_node_dead",
            "tasks re-queued because their node died",
            c.get("requeued_dead", 0),
        )
        yield counter("swarm_tasks_lost", "no-retry tasks lost with their node", c.get("lost", 0))

        # ----------------------------------------------------- migration
        mc = a["migration"]
        outcomes = counter(
            "swarm_migrations",
            "migrations started here (as the source), by outcome",
            labels=["outcome"],
        )
        for outcome in ("moved", "refused", "not-stopped", "failed", "cancelled", "undecided"):
            outcomes.add_metric([outcome], mc.get("outcome:" + outcome, 0))
        yield outcomes
        decisions = counter(
            "swarm_migration_decisions", "migration decisions taken, by code", labels=["code"]
        )
        for key, n in sorted(mc.items()):
            if key.startswith("decision:"):
                decisions.add_metric([key[9:]], n)
        yield decisions
        state = counter(
            "swarm_migration_state_bytes", "task state streamed, by direction", labels=["direction"]
        )
        state.add_metric(["out"], mc.get("bytes_sent", 0))
        state.add_metric(["in"], mc.get("bytes_received", 0))
        yield state
        yield gauge(
            "swarm_migrations_in_flight",
            "migrations in flight at this node (in and out)",
            mc["in_flight_out"] + mc["in_flight_in"],
        )
        yield gauge("swarm_criu_available", "a working CRIU is usable here (0/1)", int(mc["criu"]))

        # ----------------------------------------------------- membership
        peers = gauge("swarm_peers", "cluster members known here, by state", labels=["state"])
        for state, n in a["peers_by_state"].items():
            peers.add_metric([state], n)
        yield peers
        yield from _gossip(a["membership"])
        yield _probe_rtt(a["probe_rtt"], a["probe_rtt_sum"])

        # ------------------------------------------------------ transport
        yield from _transport(a["transport"])

        # ------------------------------------------------------- api, journal
        api = a["api"]
        yield counter(
            "swarm_api_connections", "submit-socket connections", api.get("connections", 0)
        )
        yield counter("swarm_api_requests", "submit-socket requests", api.get("requests", 0))
        bad = counter("swarm_api_bad_requests", "rejected requests, by kind", labels=["kind"])
        bad.add_metric(["request"], api.get("bad_requests", 0))
        bad.add_metric(["frame"], api.get("bad_frames", 0))
        yield bad
        yield counter("swarm_journal_commits", "journal commits (fsyncs)", a["journal_commits"])
        yield counter(
            "swarm_journal_inline_commits",
            "journal commits written on the idle event loop rather than a thread",
            a["journal_inline_commits"],
        )
        yield counter("swarm_journal_ops", "journal records written", a["journal_ops"])


def _gossip(st: Any) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily

    from ..cluster.messages import MESSAGE_KIND

    msgs = CounterMetricFamily(
        "swarm_gossip_messages",
        "membership messages, by direction and kind",
        labels=["direction", "kind"],
    )
    size = CounterMetricFamily(
        "swarm_gossip_bytes", "membership message bytes, by direction", labels=["direction"]
    )
    for d in ("in", "out"):
        for kind in sorted(MESSAGE_KIND.values()):
            msgs.add_metric([d, kind], st.get(f"{d}.{kind}", 0))
    size.add_metric(["in"], st.get("in.bytes", 0))
    size.add_metric(["out"], st.get("out.bytes", 0) + st.get("out.reliable.bytes", 0))
    yield msgs
    yield size
    drops = CounterMetricFamily(
        "swarm_gossip_dropped_messages", "membership input dropped, by reason", labels=["reason"]
    )
    for key in sorted(k for k in st if k.startswith("drop.")):
        drops.add_metric([key[5:]], st[key])
    yield drops
    probes = CounterMetricFamily(
        "swarm_probes", "failure-detector probes, by outcome", labels=["outcome"]
    )
    for outcome, key in (
        ("sent", "probe.sent"),
        ("indirect", "probe.indirect"),
        ("failed", "probe.failed"),
    ):
        probes.add_metric([outcome], st.get(key, 0))
    yield probes


def _probe_rtt(counts: list[int], total: float) -> Any:
    """Membership's per-bucket probe round-trip counts as a Prometheus histogram."""
    from prometheus_client.core import HistogramMetricFamily

    from ..cluster.membership import PROBE_RTT_BUCKETS

    buckets: list[tuple[str, float]] = []
    running = 0
    for i, le in enumerate((*PROBE_RTT_BUCKETS, float("inf"))):
        running += counts[i] if i < len(counts) else 0
        buckets.append(("+Inf" if le == float("inf") else repr(le), running))
    return HistogramMetricFamily(
        "swarm_probe_rtt_seconds",
        "failure-detector probe round trips (direct or through helpers)",
        buckets=buckets,
        sum_value=total,
    )


def _transport(c: dict[str, int]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily

    from .net import DROP_REASONS

    msgs = CounterMetricFamily(
        "swarm_transport_messages",
        "UDP packets and TCP frames, by protocol and direction",
        labels=["proto", "direction"],
    )
    size = CounterMetricFamily(
        "swarm_transport_bytes",
        "transport bytes, by protocol and direction",
        labels=["proto", "direction"],
    )
    for proto, unit in (("udp", "packets"), ("tcp", "frames")):
        for d in ("in", "out"):
            msgs.add_metric([proto, d], c.get(f"{proto}_{d}_{unit}", 0))
            size.add_metric([proto, d], c.get(f"{proto}_{d}_bytes", 0))
    yield msgs
    yield size
    conns = CounterMetricFamily(
        "swarm_transport_connections", "TCP connections, by outcome", labels=["outcome"]
    )
    for outcome in ("in", "out", "rejected"):
        conns.add_metric([outcome], c.get(f"tcp_conns_{outcome}", 0))
    yield conns
    errors = CounterMetricFamily(
        "swarm_transport_errors", "transport errors, by kind", labels=["kind"]
    )
    for kind, key in (
        ("udp_send", "udp_send_errors"),
        ("tcp_conn", "tcp_conn_errors"),
        ("handler", "handler_errors"),
    ):
        errors.add_metric([kind], c.get(key, 0))
    yield errors
    drops = CounterMetricFamily(
        "swarm_dropped_packets", "packets dropped by the transport, by reason", labels=["reason"]
    )
    for reason in DROP_REASONS:
        drops.add_metric([reason], c.get(f"dropped_{reason}", 0))
    yield drops


class MetricsServer:
    """Serves GET /metrics on one TCP address from the trio loop."""

    def __init__(self, listen: str, snapshot: Snapshot, log: EventLog = NULL_LOG) -> None:
        require_client()
        from prometheus_client import CollectorRegistry

        self.host, self.port = parse_listen(listen)
        self.log = log
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AgentCollector(snapshot))  # type: ignore[arg-type]
        self.scrapes = 0
        self.bound: tuple[str, int] | None = None

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        sock = listeners[0].socket
        self.bound = sock.getsockname()[:2]
        self.log.info("metrics.listening", addr=f"{self.bound[0]}:{self.bound[1]}")
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                with trio.fail_after(CLIENT_TIMEOUT):
                    head = await _read_head(stream)
                    await stream.send_all(self._respond(head))
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return

    def _respond(self, head: bytes | None) -> bytes:
        if head is None:
            return _response(400, b"bad request\n")
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _response(400, b"bad request\n")
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response(405, b"only GET\n")
        if target not in ("/metrics", "/"):
            return _response(404, b"not found; try /metrics\n")
        from prometheus_client import CONTENT_TYPE_LATEST

        self.scrapes += 1
        body = self.render()
        resp = _response(200, body, CONTENT_TYPE_LATEST)
        return resp[: resp.index(b"\r\n\r\n") + 4] if method == "HEAD" else resp


async def _read_head(stream: trio.SocketStream) -> bytes | None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_REQUEST:
            return None
        data = await stream.receive_some(4096)
        if not data:
            return buf or None
        buf += data
    return buf


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


def _response(code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> bytes:
    head = (
        f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
