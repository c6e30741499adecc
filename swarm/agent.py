"""The agent: wiring only. It builds the parts with their collaborators passed in,
starts them in one trio nursery, and handles signals. Decisions live in policy/,
cluster/ and node/; I/O, the API operations and the restart rules in runtime/.
"""

from __future__ import annotations

import random
from functools import partial

import attrs
import trio

from . import __version__
from . import model as m
from .config import Config
from .logs import EventLog
from .node.config import profile_settings
from .policy.shares import ShareLedger
from .runtime import criu as criu_rt
from .runtime import recovery, startup, stopmode
from .runtime.api import ApiServer, new_stats
from .runtime.clock import Clock
from .runtime.executor import Executor, ProcessPlan
from .runtime.journal import Journal
from .runtime.localops import LocalOps
from .runtime.metrics import MetricsServer
from .runtime.moving import Migrator
from .runtime.notify import Notifier
from .runtime.routes import peer_routes
from .runtime.runner import LocalRunner
from .runtime.signals import Signals
from .runtime.stats import Stats
from .runtime.tasks import TaskTable


class Agent:
    def __init__(
        self, config: Config, log: EventLog | None = None, clock: Clock | None = None
    ) -> None:
        self.config = config
        # the one source of time of every part below (tests pass Clock.fixed() and run
        # the agent under trio's MockClock); a system clock built here, outside
        # trio.run, takes its offset when run() starts
        self.clock = clock = clock or Clock.system()
        self.node = node = config.node_id
        self.log = log = log or EventLog(fmt=config.log_format, level=config.log_level, node=node)
        keyring = startup.prepare(config, log)
        profile = profile_settings(config.profile)
        self.journal = Journal(config.journal_path, log, node=node, clock=clock)
        self.table = TaskTable(self.journal, node, log, clock=clock)
        self.executor = Executor(
            config.kill_grace, log, startup.exec_helper(log), clock, startup.task_shim(config, log)
        )
        self.ledger = ShareLedger(config.shares)
        gpus = startup.gpu_inventory(config, log)
        self.rng = rng = random.Random()
        self.cluster = startup.cluster_node(config, keyring, profile, rng, clock=clock, log=log)
        self.isolation = startup.task_isolation(config, clock, log)
        # The runner and the driver call each other: the runner's hooks reach the
        # driver (built next, with the runner) through these forwarders.
        self.runner = LocalRunner(
            self.table,
            self.executor,
            node=node,
            slots=config.slots,
            log_dir=config.log_dir,
            state_dir=config.state_dir,
            log=log,
            plan_hook=self._plan_hook,
            can_start=lambda task: self.coord.can_start(task),
            on_started=lambda task: self.coord.on_started(task),
            on_finished=lambda task: self.coord.on_finished(task),
            exit_hook=self.isolation.finished,
            checkpoint_exit_code=config.checkpoint_exit_code,
            checkpoint_timeout=config.checkpoint_timeout,
            checkpoint_signal=startup.migration_settings(config).checkpoint_signal,
            order=lambda: self.ops.queue_ops.run_order(),
            on_full=lambda tid: self.ops.queue_ops.on_full(tid),
        )
        made: list[Migrator] = []  # the driver builds its migration side (they call each other)
        moves = startup.migrator_factory(config, clock, self.isolation.owner_of, log, made)
        self.coord = startup.driver(
            config,
            profile,
            gpus,
            table=self.table,
            journal=self.journal,
            runner=self.runner,
            cluster=self.cluster,
            ledger=self.ledger,
            rng=rng,
            clock=clock,
            log=log,
            admission_hook=self.isolation.admission_refusal,
            moves=moves,
        )
        self.migrator = made[0]
        self.retention = startup.retention(
            config, self.journal, self.table, self.runner, self.coord, self.migrator, clock, log
        )
        self.notifier = Notifier(clock=clock)
        api_stats = new_stats()
        self.stats = Stats(
            node=node,
            migration_mode=config.migration,
            table=self.table,
            journal=self.journal,
            runner=self.runner,
            ledger=self.ledger,
            cluster=self.cluster,
            coord=self.coord,
            migrator=self.migrator,
            retention=self.retention,
            isolation=self.isolation,
            api_stats=api_stats,
            clock=clock,
        )
        self.ops = LocalOps(
            node=node,
            table=self.table,
            journal=self.journal,
            runner=self.runner,
            ledger=self.ledger,
            cluster=self.cluster,
            coord=self.coord,
            migrator=self.migrator,
            identities=self.isolation.identities,
            snapshot=self.stats.snapshot,
            clock=clock,
            log=log,
        )
        self.scaler = startup.autoscaler(
            config, self.cluster, self.journal, self.ops, self.coord, clock, log
        )
        snapshot = partial(self.stats.snapshot, detail=True)
        self.metrics = MetricsServer(config.metrics, snapshot, log) if config.metrics else None
        self.api = ApiServer(
            config.socket,
            self.ops.ops(extra={"scale": self.scaler.op_scale}),
            group=config.socket_group,
            log=log,
            clock=clock,
            stats=api_stats,
        )
        reload = partial(startup.reload_keyring, config, self.cluster.reload_keyring, log)
        self.signals = Signals(stop=self.request_stop, reload=reload, log=log)
        self._stop = trio.Event()

    def _plan_hook(self, task: m.Task, plan: ProcessPlan) -> ProcessPlan:
        """A task's process plan: its GPU slice, this agent's socket (SWARM_SOCKET: a
        task's own swarm calls reach the agent that runs it), its user and cgroup, then
        a CRIU restore's changes (it runs as root)."""
        plan = self.coord.gang_plan(task, self.coord.fence_plan(task, plan))
        env = {**self.coord.gpu_env(task), "SWARM_SOCKET": str(self.config.socket)}
        plan = attrs.evolve(plan, env={**plan.env, **env})
        return self.migrator.plan_hook(task, self.isolation.plan(task, plan))

    @property
    def started_at(self) -> float:
        return self.stats.started_at

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.signals.catch_outside()
        self.clock.resync()  # a system clock built before trio.run takes its offset here
        self.stats.started()
        recovery.recover(
            node=self.node,
            journal=self.journal,
            table=self.table,
            ledger=self.ledger,
            runner=self.runner,
            coord=self.coord,
            migrator=self.migrator,
            ops=self.ops,
            scaler=self.scaler,
            log=self.log,
        )
        await self.isolation.start(keep=frozenset(self.runner.adopting))
        self.migrator.set_criu(await criu_rt.detect())
        self.coord.host_facts(isolation=self.isolation.kind, criu=self.migrator.criu.ok)
        self.log.info("criu.detect", ok=self.migrator.criu.ok, reason=self.migrator.criu.reason)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.journal.run)
                await nursery.start(self.cluster.run)
                await nursery.start(self.runner.run)
                await nursery.start(self.coord.run)
                await nursery.start(self.migrator.run)
                # what recovery wrote (ends too) is on disk before a wait is answered
                await self.journal.commit([], must_land=True)
                # the peer RPC routes, once the parts that answer have started
                self.cluster.rpc.update(peer_routes(self.coord, self.migrator, self.ops))
                await nursery.start(self.retention.run)
                await nursery.start(self.scaler.run)
                nursery.start_soon(self.signals.run)
                api_scope = trio.CancelScope()

                async def serve_api(*, task_status: trio.TaskStatus[None]) -> None:
                    with api_scope:
                        await self.api.serve(task_status=task_status)

                await nursery.start(serve_api)
                if self.metrics is not None:
                    await nursery.start(self.metrics.serve)
                self.ops.start_accepting()
                self.log.info(
                    "agent.ready",
                    version=__version__,
                    socket=str(self.config.socket),
                    port=self.cluster.addr[1],
                    slots=self.config.slots,
                    shares=self.ledger.shares,
                    queued=len(self.runner.queue),
                    isolation=self.isolation.kind,
                )
                alone = not self.config.seeds and not self.config.mdns  # READY at once
                nursery.start_soon(
                    partial(
                        self.notifier.run,
                        joined=lambda: alone or self.cluster.joined_event.is_set(),
                        join_wait=self.config.join_wait,
                        status=self.stats.status_line,
                    )
                )
                task_status.started()
                await self._stop.wait()
                self.log.info("agent.stopping", running=len(self.runner.running))
                self.notifier.stopping(
                    f"stopping: terminating {len(self.runner.running)} tasks (they re-queue)"
                )
                self.ops.stop_accepting()
                api_scope.cancel()
                keep = stopmode.keep_tasks(self.config.keep_tasks)
                await self.runner.shutdown(keep=keep)
                with trio.move_on_after(3):  # a restart does not leave: its tasks stay
                    await (trio.sleep(0) if keep else self.cluster.leave())
                with trio.move_on_after(30):
                    await self.journal.commit([], must_land=True)
                nursery.cancel_scope.cancel()
        finally:
            self.journal.close()
            self.isolation.stop()
            self.notifier.close()
            self.log.info("agent.stopped")
            self.signals.quiet()  # before trio's teardown closes its signal wakeup fd
