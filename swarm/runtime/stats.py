"""One stats snapshot of the node, read from its parts' own counters.

`snapshot()` is what `swarm info` answers (and `swarm top` shows);
`snapshot(detail=True)` is the same dict plus the few figures only the Prometheus
endpoint (runtime/metrics.py) renders. Nothing is counted here: each part keeps its
counters, this reads them when asked, so there is no second copy of any counter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

from .. import __version__
from .. import model as m
from ..policy.shares import ShareLedger
from .clock import Clock
from .driver import Driver
from .isolation import TaskIsolation
from .journal import Journal
from .moving import Migrator
from .peers import ClusterNode
from .retention import Retention
from .runner import LocalRunner
from .tasks import TaskTable


class Stats:
    def __init__(
        self,
        *,
        node: m.NodeId,
        migration_mode: str,
        table: TaskTable,
        journal: Journal,
        runner: LocalRunner,
        ledger: ShareLedger,
        cluster: ClusterNode,
        coord: Driver,
        migrator: Migrator,
        retention: Retention,
        isolation: TaskIsolation,
        api_stats: Mapping[str, int],
        clock: Clock,
    ) -> None:
        self.node = node
        self.migration_mode = migration_mode
        self.table = table
        self.journal = journal
        self.runner = runner
        self.ledger = ledger
        self.cluster = cluster
        self.coord = coord
        self.migrator = migrator
        self.retention = retention
        self.isolation = isolation
        self.api_stats = api_stats
        self.clock = clock
        self.started_at = 0.0  # wall time; taken by started() (the clock needs trio)

    def started(self) -> None:
        """The agent is starting: uptime counts from now."""
        self.started_at = self.clock.wall()

    def snapshot(self, *, detail: bool = False) -> dict[str, Any]:
        ms = self.cluster.membership
        mig = self.migrator
        out: dict[str, Any] = {
            "node": self.node,
            "version": __version__,
            "pid": os.getpid(),
            "port": self.cluster.addr[1],
            "slots": self.runner.slots,
            "shares": self.ledger.shares,
            "running": len(self.runner.running),
            # the supervisors' status directories (statusdirs.py): starts that reused one
            "status_dirs": {
                "reused": self.runner.status_dirs.reused,
                "free": len(self.runner.status_dirs.free),
            },
            "queued": len(self.runner.queue),
            "tasks": len(self.table.active),
            "members": 0 if ms is None else ms.num_live,
            "journal_commits": self.journal.commits,
            "journal_inline_commits": self.journal.inline_commits,
            "journal_ops": self.journal.ops_written,
            # null while writes land; else why they fail, since when, how many failed
            "journal_wedged": _attrs_dict(w) if (w := self.journal.wedged) else None,
            "retention": {
                "keep_finished_s": self.retention.keep,
                "forgotten": self.retention.forgotten,
                "log_files_removed": self.retention.log_files_removed,
            },
            "uptime": self.clock.wall() - self.started_at,
            "api": dict(self.api_stats),
            "coordinator": dict(self.coord.counters),
            "migration": {
                "mode": self.migration_mode,
                "criu": mig.criu.ok,
                "criu_reason": mig.criu.reason,
                "in_flight_out": len(mig.outgoing),
                "in_flight_in": len(mig.incoming),
                **dict(mig.counters),
            },
            "transfer": _attrs_dict(self.coord.transfer.stats),
            "gangs": self.coord.state.gang_stats(),
            # copies of tasks (node/replicas.py): of ours kept elsewhere, of other
            # homes' kept here, and nodes that may keep a stray one still owed a release
            "copies": {
                "ours": len(self.coord.state.mine),
                "held": len(self.coord.state.held),
                "strays": sum(len(n) for n in self.coord.state.strays.values()),
            },
            "transport": dict(self.cluster.transport.counters) if self.cluster.transport else {},
            "membership": dict(ms.stats) if ms is not None else {},
        }
        if detail:
            out.update(self._detail())
        return out

    def _detail(self) -> dict[str, Any]:
        """What Prometheus renders beyond `swarm info`."""
        ms = self.cluster.membership
        by_state = {s.value: 0 for s in m.TaskState if not s.terminal}
        for t in self.table.active.values():
            by_state[t.state.value] = by_state.get(t.state.value, 0) + 1
        peers = {s.value: 0 for s in m.MemberState}
        if ms is not None:
            for mb in ms.members():
                peers[mb.state.value] += 1
        return {
            "started_at": self.started_at,
            "isolation": self.isolation.kind,
            "oom_kills": self.isolation.oom_kills,
            "tasks_by_state": by_state,
            "transitions": {s.value: self.table.counts.get(s.value, 0) for s in m.TaskState},
            "peers_by_state": peers,
            "probe_rtt": list(ms.probe_rtt) if ms is not None else [],
            "probe_rtt_sum": ms.probe_rtt_sum if ms is not None else 0.0,
        }

    def status_line(self) -> str:
        """systemd's STATUS= (shown by `systemctl status`)."""
        ms = self.cluster.membership
        peers = 0 if ms is None else ms.num_live - 1
        return (
            f"{peers} peers; {len(self.runner.running)} running, {len(self.runner.queue)} "
            f"queued; shares {self.ledger.shares}; isolation {self.isolation.kind}"
        )


def _attrs_dict(obj: Any) -> dict[str, Any]:
    return attrs.asdict(obj) if attrs.has(type(obj)) else {}
