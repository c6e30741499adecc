"""Every peer RPC this node answers, in one table: op name -> handler.

The agent installs the table on its ClusterNode once, after the parts that answer
have started (a request that comes earlier gets "unknown op", and the sender retries).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .peers import RpcHandler

if TYPE_CHECKING:
    from .driver import Driver
    from .localops import LocalOps
    from .moving import Migrator


def peer_routes(coord: Driver, migrator: Migrator, ops: LocalOps) -> dict[str, RpcHandler]:
    return {
        # task handoff between a home and its executors (runtime/driver.py)
        "handoff": coord.rpc_handoff,
        "handoff_batch": coord.rpc_handoff_batch,  # many at once (runtime/handoffbatch.py)
        "succession": coord.rpc_succession,  # adoption notices (node/failover.py)
        "replica": coord.rpc_replica,  # copies of another home's tasks (node/replicas.py)
        "replica_batch": coord.rpc_replica_batch,  # many at once (runtime/replicabatch.py)
        "lease": coord.rpc_lease,  # a runner's lease for an --at-most-once task (fencing.py)
        "gang": coord.rpc_gang,  # the gang protocol's messages (node/gangs.py)
        "task": coord.reads.rpc_task,  # a task's record, from its home
        "logs": coord.reads.rpc_logs,  # a task's log, streamed from where it runs
        # transfer: load probes, and a receiver taking a queued task
        "probe": coord.transfers.rpc_probe,
        "steal": coord.transfers.rpc_steal,
        # late binding: reservations, cancels and pulls (runtime/latebindio.py)
        "late": coord.late_io.rpc,
        # migration: decisions, state streams, records (runtime/moving.py)
        "migrate": migrator.rpc,
        # a client's request forwarded to the task's home (runtime/localops.py)
        "cancel": ops.rpc_cancel,
        "explain": ops.rpc_explain,
    }
