"""Observability of a real agent: the Prometheus endpoint, scraped and parsed with
prometheus-client's own text parser, and the structured event log on stderr."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory

TASK_ID = re.compile(r"^t[0-9a-f]{16}$")


def _metrics_addr(a: LocalAgent) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = re.search(r"event=metrics.listening .*addr=(\S+)", a.log_text())
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError(f"no metrics.listening line:\n{a.log_tail()}")


def _scrape(addr: str, path: str = "/metrics") -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", e.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_endpoint_is_scraped_and_parsed(make_agent: AgentFactory) -> None:
    a = make_agent("m1", "--metrics", "127.0.0.1:0", "--slots", "3")
    addr = _metrics_addr(a)
    ids = [a.cli("submit", "--wait", "--", "true").stdout.strip() for _ in range(2)]
    fail = a.cli("submit", "--wait", "--", "sh", "-c", "exit 4")
    assert fail.returncode == 4
    status, ctype, text = _scrape(addr)
    assert status == 200 and ctype.startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families and all(name.startswith("swarm_") for name in families), sorted(families)
    expected = {
        "swarm_build_info",
        "swarm_start_time_seconds",
        "swarm_isolation_info",
        "swarm_slots",
        "swarm_tasks",
        "swarm_task_transitions",
        "swarm_task_oom_kills",
        "swarm_peers",
        "swarm_placements",
        "swarm_handoff_offers_failed",
        "swarm_handoff_rpc_failures",
        "swarm_handoff_requests",
        "swarm_replica_rpcs",
        "swarm_replica_msgs",
        "swarm_replica_rpc_failures",
        "swarm_transfers",
        "swarm_gossip_messages",
        "swarm_gossip_bytes",
        "swarm_gossip_dropped_messages",
        "swarm_probes",
        "swarm_transport_bytes",
        "swarm_dropped_packets",
        "swarm_api_requests",
        "swarm_journal_commits",
        "swarm_probe_rtt_seconds",
    }
    assert expected <= set(families), expected - set(families)
    assert families["swarm_task_transitions"].type == "counter"
    assert families["swarm_tasks"].type == "gauge"
    assert families["swarm_probe_rtt_seconds"].type == "histogram"
    # no high-cardinality labels: never a task id or a peer name as a label value
    values = _samples(text)
    for (_, labels), _v in values.items():
        for k, v in labels:
            assert not TASK_ID.match(v) and v != "m1", (k, v)
    s = values
    assert s[("swarm_slots", ())] == 3
    assert s[("swarm_peers", (("state", "alive"),))] == 1
    assert s[("swarm_task_transitions_total", (("state", "succeeded"),))] >= len(ids)
    assert s[("swarm_task_transitions_total", (("state", "failed"),))] >= 1
    assert s[("swarm_placements_total", (("where", "local"),))] >= 3
    assert s[("swarm_api_requests_total", ())] >= 3
    kinds = [dict(lbl)["kind"] for (n, lbl), v in s.items() if n == "swarm_isolation_info"]
    assert kinds and kinds[0] in ("cgroup2", "cgroup1", "none")
    assert s[("swarm_start_time_seconds", ())] <= time.time()


def test_metrics_server_answers_junk_and_keeps_serving(make_agent: AgentFactory) -> None:
    a = make_agent("m2", "--metrics", "127.0.0.1:0")
    addr = _metrics_addr(a)
    assert _scrape(addr, "/nope")[0] == 404
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"\x00\xffgarbage\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 405")
    with socket.create_connection((host, int(port)), timeout=10):
        pass  # a client that says nothing and leaves
    assert _scrape(addr)[0] == 200
    assert a.alive()


def test_a_bad_metrics_address_stops_the_agent_with_one_line(make_agent: AgentFactory) -> None:
    a = make_agent("m3", "--metrics", "localhost", start=False)
    a.start(wait=False)
    assert a.proc is not None and a.proc.wait(30) == 2
    assert "config error: metrics: expected ADDR:PORT, got 'localhost'" in a.log_text()


def _check_task_events(events: list[dict[str, str]], ids: set[str]) -> None:
    changes = [e for e in events if e.get("event") == "task.state"]
    seen = {e["task"] for e in changes}
    assert ids <= seen
    for e in changes:
        assert e["task"] and e["cause"] and e["dst"], e
        assert "src" in e, e
    # every terminal state change says why; a failure carries its code
    for e in changes:
        if e["dst"] == "failed":
            assert "exit" in e or "signal" in e or e["cause"], e


def _logfmt(line: str) -> dict[str, str]:
    return {k: v.strip('"') for k, v in re.findall(r'(\w[\w.]*)=("(?:[^"\\]|\\.)*"|\S*)', line)}


def test_every_task_state_change_is_one_line_with_id_and_cause(make_agent: AgentFactory) -> None:
    a = make_agent("l1", "--slots", "1")
    ok = a.cli("submit", "--wait", "--", "true").stdout.strip()
    bad = a.cli("submit", "--wait", "--", "sh", "-c", "exit 2").stdout.strip()
    blocker = a.cli("submit", "--", "sleep", "30").stdout.strip()
    queued = a.cli("submit", "--", "true").stdout.strip()
    assert a.cli("cancel", queued).returncode == 0
    assert a.cli("cancel", blocker).returncode == 0
    lines = [ln for ln in a.log_text().splitlines() if ln.strip()]
    events = [_logfmt(ln) for ln in lines]
    assert all("event" in e and "level" in e for e in events), lines
    _check_task_events(events, {ok, bad, blocker, queued})
    cancel = [e for e in events if e.get("task") == queued and e.get("dst") == "cancelled"]
    assert cancel and cancel[0]["cause"].startswith("cancelled by uid")


def test_json_log_lines(make_agent: AgentFactory) -> None:
    a = make_agent("l2", "--log-format", "json")
    tid = a.cli("submit", "--wait", "--", "true").stdout.strip()
    events = [json.loads(ln) for ln in a.log_text().splitlines() if ln.strip()]
    assert all({"ts", "level", "event", "node"} <= set(e) for e in events)
    _check_task_events(events, {tid})


def test_probe_rtt_histogram_fills_once_there_is_a_peer(make_agent: AgentFactory) -> None:
    a = make_agent("r1", "--bind", "127.0.0.1", "--metrics", "127.0.0.1:0")
    make_agent("r2", "--bind", "127.0.0.1", "--seeds", f"127.0.0.1:{a.port}")
    addr = _metrics_addr(a)
    deadline = time.monotonic() + 30
    count = 0.0
    while time.monotonic() < deadline:
        s = _samples(_scrape(addr)[2])
        count = s.get(("swarm_probe_rtt_seconds_count", ()), 0.0)
        if count >= 3 and s[("swarm_peers", (("state", "alive"),))] == 2:
            break
        time.sleep(0.2)
    assert count >= 3
    inf = s[("swarm_probe_rtt_seconds_bucket", (("le", "+Inf"),))]
    assert inf == count and 0 < s[("swarm_probe_rtt_seconds_sum", ())] < count * 5.0
    gossip_out = s[("swarm_gossip_bytes_total", (("direction", "out"),))]
    assert (
        gossip_out > 0
        and s[("swarm_gossip_messages_total", (("direction", "in"), ("kind", "ping")))] > 0
    )
