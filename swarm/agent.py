"""The agent: wires the journal, the runner, the submit socket, the cluster layer and
the coordinator into one trio nursery. Nothing clever lives here; decisions are in
policy/ and cluster/, I/O in runtime/.
"""

from __future__ import annotations

import functools
import os
import pwd
import random
import signal
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from . import __version__, codec, request_checks, testbreak, wire
from . import model as m
from .config import Config, ConfigError
from .crypto import Keyring, KeyringError
from .logs import EventLog
from .policy import feasible
from .policy import gpu as gpupol
from .policy import shares as sh
from .policy import transfer as tr
from .runtime import criu as criu_rt
from .runtime import exechelper
from .runtime import gpu as gpu_runtime
from .runtime.api import ApiServer, Ops, PeerCred, RequestError
from .runtime.coordinator import Coordinator
from .runtime.executor import Executor, ProcessPlan, kill_orphan
from .runtime.isolation import Identities, IsolationError, TaskIsolation
from .runtime.isolation import detect as detect_cgroups
from .runtime.journal import DelKV, DelProc, Event, Journal, JournalError, PutKV
from .runtime.logread import read_log
from .runtime.metrics import MetricsServer
from .runtime.migrator import Migrator, settings_for
from .runtime.net import TransportError
from .runtime.notify import Notifier
from .runtime.peers import ClusterNode, RemoteError
from .runtime.retention import Retention
from .runtime.runner import LocalRunner, PlanRefused
from .runtime.tasks import TaskTable, UnknownTask, wall_now

SHARES_KEY = "shares"
UNDRAIN_KEY = "undrain_shares"


def load_keyring(config: Config) -> Keyring | None:
    """The cluster keyring, or None in --insecure mode; refuses to guess."""
    if config.keyring is None:
        if config.insecure:
            return None
        raise ConfigError(
            "keyring",
            "no cluster key: give --keyring FILE (create one with `swarm keygen -o FILE`), "
            "or run with --insecure to send cluster traffic unencrypted",
        )
    try:
        return Keyring.load(config.keyring)
    except KeyringError as e:
        raise ConfigError("keyring", str(e)) from None
    except OSError as e:
        raise ConfigError("keyring", f"cannot read {config.keyring}: {e.strerror}") from None


AGENT_UMASK = 0o077  # the agent's files are private; tasks get TASK_UMASK (0022)


def state_dir_mode(euid: int) -> int:
    """The state dir's mode: a root agent's task users must traverse it to reach their
    own task-state dir below it (0711: not listable); otherwise only the agent's user."""
    return 0o711 if euid == 0 else 0o700


def private_state_dir(state_dir: Path, log_dir: Path) -> list[tuple[str, str, int]]:
    """Create the state dir (state_dir_mode) and its task-log dir (0700), and tighten
    either when it exists with looser modes (an older agent made them 0755, its journal
    and logs 0644, readable by every local user). Returns (old mode, path, new mode)
    of what it tightened, for the log. The journal's own files are its business."""
    changed: list[tuple[str, str, int]] = []
    for path, mode in ((state_dir, state_dir_mode(os.geteuid())), (log_dir, 0o700)):
        try:
            path.mkdir(parents=True, mode=mode)
            created = True
        except FileExistsError:
            created = False
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            old = os.fstat(fd).st_mode & 0o7777
            if created and old != mode:  # mkdir's mode went through the umask
                os.fchmod(fd, mode)
            elif old & ~mode:  # looser than it should be (stricter is left alone)
                os.fchmod(fd, old & mode)
                changed.append((f"{old:04o}", str(path), old & mode))
        finally:
            os.close(fd)
    return changed


def transfer_config(profile: str) -> tr.TransferConfig:
    """Transfer timers per profile: loopback clusters and tests move faster."""
    if profile == "local":
        return tr.TransferConfig(
            round_interval=0.5, probe_timeout=0.3, task_cooldown=1.0, switch_cooldown=2.0
        )
    return tr.TransferConfig(task_cooldown=10.0)


class Agent:
    def __init__(self, config: Config, log: EventLog | None = None) -> None:
        self.config = config
        self.node = config.node_id
        self.log = log or EventLog(fmt=config.log_format, level=config.log_level, node=self.node)
        keyring = load_keyring(config)
        if keyring is not None:
            for w in keyring.warnings:
                self.log.warning("agent.keyring", warning=w)
        elif config.insecure:
            self.log.warning(
                "agent.insecure", detail="cluster traffic is not encrypted (--insecure)"
            )
        try:
            tightened = private_state_dir(config.state_dir, config.log_dir)
        except OSError as e:
            raise ConfigError("state-dir", f"{config.state_dir}: {e.strerror or e}") from None
        for what, path, mode in tightened:
            self.log.warning("agent.state_tightened", path=path, old=what, new=f"{mode:04o}")
        self.journal = Journal(config.journal_path, self.log, node=self.node)
        self.table = TaskTable(self.journal, self.node, self.log)
        self.executor = Executor(
            kill_grace=config.kill_grace, log=self.log, exec_helper=self._exec_helper()
        )
        self.ledger = sh.ShareLedger(config.shares)
        try:
            self.gpu_inventory = gpu_runtime.discover(config.gpus, config.node_id, nvml=config.nvml)
        except gpupol.GpuConfigError as e:
            raise ConfigError(f"gpus ({e.key})", str(e)) from None
        self.log.info(
            "gpu.inventory",
            source=self.gpu_inventory.source,
            devices=len(self.gpu_inventory.devices),
            **({"note": self.gpu_inventory.note} if self.gpu_inventory.note else {}),
        )
        self.rng = random.Random()
        self.cluster = ClusterNode(
            node=self.node,
            cluster=config.cluster,
            bind=config.bind,
            port=config.port,
            advertise=config.advertise,
            seeds=config.seeds,
            mdns=config.mdns,
            mdns_interfaces=config.mdns_interfaces,
            keyring=keyring,
            profile=config.profile,
            state_dir=config.state_dir,
            faults=config.faults or os.environ.get("SWARM_FAULTS"),
            log=self.log,
            rng=self.rng,
        )
        self.runner = LocalRunner(
            self.table,
            self.executor,
            node=self.node,
            slots=config.slots,
            log_dir=config.log_dir,
            state_dir=config.state_dir,
            log=self.log,
        )
        self.coord = Coordinator(
            node=self.node,
            table=self.table,
            journal=self.journal,
            runner=self.runner,
            cluster=self.cluster,
            ledger=self.ledger,
            log=self.log,
            placement_d=config.placement_d,
            psi_target=config.qos_psi_target,
            report_interval=config.report_interval,
            rpc_timeout=2.0 if config.profile == "local" else 5.0,
            transfer_config=transfer_config(config.profile),
            placement_rule=config.placement,
            transfer=config.transfer,
            gpu_devices=self.gpu_inventory.devices,
            gpu_policy=config.gpu_policy,
            mps=config.mps,
            rng=self.rng,
        )
        try:
            migration = settings_for(config)
        except ValueError as e:
            raise ConfigError("checkpoint-signal", str(e)) from None
        self.migrator = Migrator(self.coord, migration, log=self.log)
        self.coord.migrator = self.migrator
        self.runner.checkpoint_exit_code = config.checkpoint_exit_code
        self.runner.plan_hook = self._plan_hook
        self.plan_hooks: list[Callable[[m.Task, ProcessPlan], ProcessPlan]] = []
        self.runner.can_start = self.coord.can_start
        self.runner.on_started = self.coord.on_started
        self.runner.on_finished = self.coord.on_finished
        try:
            cgroups = detect_cgroups(config.state_dir, prefer=config.isolation, log=self.log)
        except IsolationError as e:
            raise ConfigError("isolation", str(e)) from None
        self.isolation = TaskIsolation(
            Identities(node=self.node, allow_root=config.allow_root_tasks), cgroups, log=self.log
        )
        self.plan_hooks.append(self.isolation.plan)
        self.plan_hooks.append(self.migrator.plan_hook)  # a CRIU restore runs as root
        self.migrator.owner_of = self._task_owner
        self.runner.exit_hook = self.isolation.finished
        self.coord.admission_hook = self.isolation.admission_refusal
        self.retention = Retention(
            config.keep_finished_s,
            self.journal,
            self.table,
            self.runner.log_paths,
            self._still_needed,
            log=self.log,
            on_forget=self._forget_task_state,
        )
        self.notifier = Notifier()
        self.metrics = MetricsServer(config.metrics, self, self.log) if config.metrics else None
        self.cluster.rpc.update(cancel=self.rpc_cancel, explain=self.rpc_explain)
        self.api = ApiServer(config.socket, self._ops(), group=config.socket_group, log=self.log)
        self.started_at = wall_now()
        self._kv_undrain = 0  # shares to restore on undrain
        self._shares_lock = trio.Lock()
        self._submitting: set[m.TaskId] = set()  # chosen ids between check and journal
        self.accepting = False
        self._stop = trio.Event()
        self._outside_signal: int | None = None

    def _task_owner(self, spec: m.TaskSpec) -> tuple[int, int] | None:
        """Whom a task's received state belongs to here (None: the agent's user)."""
        try:
            ident = self.isolation.identities.resolve(spec)
        except PlanRefused:
            return None
        return None if ident is None else (ident.uid, ident.gid)

    def _plan_hook(self, task: m.Task, plan: ProcessPlan) -> ProcessPlan:
        """Adjust a task's process plan: its GPU slice, then the other hooks."""
        gpu_env = self.coord.gpu_env(task)
        if gpu_env:
            plan = attrs.evolve(plan, env={**plan.env, **gpu_env})
        for hook in self.plan_hooks:
            plan = hook(task, plan)
        return plan

    # ---------------------------------------------------------------- life

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._catch_outside_signals()
        self._recover()
        await self.isolation.start()
        self.coord.isolation = self.isolation.kind
        self.migrator.criu = await criu_rt.detect()
        self.coord.criu = self.migrator.criu.ok
        self.log.info("criu.detect", ok=self.migrator.criu.ok, reason=self.migrator.criu.reason)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.journal.run)
                await nursery.start(self.cluster.run)
                await nursery.start(self.runner.run)
                await nursery.start(self.coord.run)
                await nursery.start(self.migrator.run)
                await nursery.start(self.retention.run)
                nursery.start_soon(self._signals)
                api_scope = trio.CancelScope()

                async def serve_api(*, task_status: trio.TaskStatus[None]) -> None:
                    with api_scope:
                        await self.api.serve(task_status=task_status)

                await nursery.start(serve_api)
                if self.metrics is not None:
                    await nursery.start(self.metrics.serve)
                self.accepting = True
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
                nursery.start_soon(
                    partial(
                        self.notifier.run,
                        joined=self._joined,
                        join_wait=self.config.join_wait,
                        status=self.status_line,
                    )
                )
                task_status.started()
                await self._stop.wait()
                self.log.info("agent.stopping", running=len(self.runner.running))
                self.notifier.stopping(
                    f"stopping: terminating {len(self.runner.running)} tasks (they re-queue)"
                )
                self.accepting = False
                api_scope.cancel()
                await self.runner.shutdown()
                with trio.move_on_after(3):
                    await self.cluster.leave()
                with trio.move_on_after(30):
                    await self.journal.commit([], must_land=True)
                nursery.cancel_scope.cancel()
        finally:
            self.journal.close()
            self.isolation.stop()
            self.notifier.close()
            self.log.info("agent.stopped")

    def _still_needed(self, tid: m.TaskId) -> bool:
        """May retention not forget this finished task yet? Its result is still owed to
        its home or awaited from a guest, it is moving, or it is a global task, which
        must stay known as done here or it would start again."""
        c, mig = self.coord, self.migrator
        return (
            not c.home.settled(tid)
            or tid in c.guest.entries
            or tid in c.globals.members
            or tid in self.runner.running
            or tid in mig.outgoing
            or tid in mig.incoming
            or tid in mig.retained
            or tid in mig.arrivals
        )

    def _forget_task_state(self, tid: m.TaskId) -> None:
        """Retention forgot a task: its settled handoff state (the home's entry stays
        after the final report, for late revokes) and its cached decisions go too."""
        self.coord.explains.pop(tid, None)
        if self.coord.home.forget(tid):
            self.journal.enqueue([DelKV("home:" + tid)])

    def _joined(self) -> bool:
        """For READY: joined a peer, or nothing to join (no seeds, no mDNS)."""
        if not self.config.seeds and not self.config.mdns:
            return True
        return self.cluster.joined_event.is_set()

    def status_line(self) -> str:
        """systemd's STATUS= (shown by `systemctl status`)."""
        ms = self.cluster.membership
        peers = 0 if ms is None else ms.num_live - 1
        return (
            f"{peers} peers; {len(self.runner.running)} running, {len(self.runner.queue)} "
            f"queued; shares {self.ledger.shares}; isolation {self.isolation.kind}"
        )

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            if self._outside_signal is not None:  # arrived during start-up
                self.log.info("agent.signal", signal=signal.Signals(self._outside_signal).name)
                self.request_stop()
            async for sig in sigs:
                self.log.info("agent.signal", signal=signal.Signals(sig).name)
                if sig == signal.SIGHUP:
                    self.reload_keyring()
                else:
                    self.request_stop()

    def reload_keyring(self) -> None:
        """SIGHUP: read the key file again (key rotation without downtime). A bad file
        keeps the old keys and says why."""
        if self.config.keyring is None:
            self.log.info("agent.keyring_reload", result="insecure mode: no keyring to reload")
            return
        try:
            keyring = Keyring.load(self.config.keyring)
        except (KeyringError, OSError) as e:
            self.log.error("agent.keyring_reload", result="kept the old keys", error=str(e))
            return
        self.cluster.reload_keyring(keyring)
        self.log.info(
            "agent.keyring_reload",
            result="ok",
            keys=len(keyring.keys),
            primary=keyring.fingerprints()[0],
        )

    def _catch_outside_signals(self) -> None:
        """SIGTERM/SIGINT while trio's receiver is not installed (start-up, and the
        end of shutdown, when trio restores the previous handler and re-raises the
        signals it had not handed out) must not kill the agent half-way: remember
        them instead. A stop requested during start-up happens once it listens."""

        def remember(signum: int, frame: object) -> None:
            self._outside_signal = signum

        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, remember)
        except ValueError:  # not the main thread (an agent inside a test): nothing to do
            pass

    def _recover(self) -> None:
        """Bring the journal's view back to a consistent, runnable state."""
        rec = self.journal.recover()
        for tid, (pid, ct) in rec.procs.items():
            if kill_orphan(pid, ct):
                self.log.warning("agent.orphan_killed", task=tid, pid=pid)
            self.journal.enqueue([DelProc(tid)])
        shares = rec.kv.get(SHARES_KEY)
        if isinstance(shares, int) and shares >= 0:
            self.ledger.set_shares(shares)
        undrain = rec.kv.get(UNDRAIN_KEY)
        if isinstance(undrain, int) and undrain > 0:
            self._kv_undrain = undrain
        self.table.load(rec.active)
        self.coord.restore(rec.kv)
        self.migrator.restore(rec.kv)
        requeued = 0
        S = m.TaskState
        for t in rec.active:
            guest = t.spec.home != self.node and not t.spec.is_global
            if guest and t.id not in self.coord.guest.entries:
                self.table.forget(t.id)  # it moved on while we were down
                continue
            if t.node != self.node:
                continue  # a home record of a task that lives elsewhere
            if t.state in (S.RUNNING, S.MIGRATING):
                if t.spec.no_retry and not guest:
                    self.table.change(
                        t.id, S.FAILED, "agent restarted while task was running (--no-retry)"
                    )
                    continue
                self.table.change(t.id, S.QUEUED, "agent restarted: will run again", node=self.node)
                requeued += 1
            t = self.table.active[t.id]
            if t.state is S.QUEUED and (guest or t.spec.is_global):
                self.ledger.add(t.spec)
                self.runner.enqueue(t.id)
        if rec.active:
            self.log.info("agent.recovered", tasks=len(rec.active), requeued=requeued)

    # ----------------------------------------------------------------- ops

    def _ops(self) -> Ops:
        return Ops(
            unary={
                "submit": self.op_submit,
                "status": self.op_status,
                "list": self.op_list,
                "cancel": self.op_cancel,
                "wait": self.op_wait,
                "info": self.op_info,
                "nodes": self.op_nodes,
                "explain": self.op_explain,
                "shares": self.op_shares,
            },
            stream={"logs": self.op_logs},
        )

    def _operator(self, cred: PeerCred) -> bool:
        """Root and the agent's own user see and control every task here."""
        return cred.uid == 0 or cred.uid == os.getuid()

    def _owns(self, task: m.Task, cred: PeerCred, name: str | None) -> bool:
        """Whether the caller submitted `task`: by uid at its home node, by user name
        elsewhere (uids may differ between hosts; names are what tasks run as)."""
        spec = task.spec
        if spec.uid is None:
            return True
        if spec.home in ("", self.node) or spec.user is None:
            return spec.uid == cred.uid
        return spec.user == name

    def _authorize(self, task: m.Task, cred: PeerCred) -> None:
        if self._operator(cred) or self._owns(task, cred, _user_name(cred.uid)):
            return
        raise RequestError("permission_denied", f"task {task.id} belongs to another user")

    async def _find(self, tid: m.TaskId) -> m.Task:
        """The authoritative record: the home's. Ask the home (or everyone) if not here."""
        local: m.Task | None
        try:
            local = await self.table.get(tid)
        except UnknownTask:
            local = None
        if local is not None and (local.spec.home in ("", self.node) or local.spec.is_global):
            return local
        homes = [local.spec.home] if local is not None else []
        if not homes and self.cluster.membership is not None:
            homes = [
                mb.node for mb in self.cluster.membership.alive_members() if mb.node != self.node
            ]
        found = await self._ask_records(homes, tid)
        if found is not None:
            return found
        if local is not None:
            return local
        raise RequestError("not_found", f"no task {tid}")

    async def _ask_records(self, nodes: list[m.NodeId], tid: m.TaskId) -> m.Task | None:
        results: list[m.Task] = []

        async def ask(node: m.NodeId) -> None:
            try:
                r = await self.cluster.request(node, {"op": "task", "id": tid}, timeout=2.0)
            except (TransportError, RemoteError):
                return
            if r.get("task") is not None:
                try:
                    t = codec.task_from_wire(r["task"])
                except wire.WireError:
                    return
                if t.spec.home == node or not results:
                    results.insert(0 if t.spec.home == node else len(results), t)

        async with trio.open_nursery() as n:
            for node in nodes[:256]:
                n.start_soon(ask, node)
        return results[0] if results else None

    def _exec_helper(self) -> Path | None:
        """swarm-exec for starts as another user (a root agent only): built once per
        version into a root-only cache shared by the host's agents."""
        if os.geteuid() != 0:
            return None
        try:
            helper = exechelper.build(exechelper.CACHE_DIR)
        except exechelper.HelperUnavailable as e:
            self.log.warning(
                "executor.no_helper", reason=str(e), fallback="each start as a user forks"
            )
            return None
        self.log.info("executor.helper", path=str(helper))
        return helper

    async def _task(self, f: wire.Fields, cred: PeerCred | None = None) -> m.Task:
        tid = request_checks.check_task_id(f.str("id", required=True, max_len=m.MAX_TASK_ID_LEN))
        if cred is not None and "~" not in tid and m.valid_client_task_id(tid):
            # the caller's own chosen id, named without its owner part ("job1"), at the
            # node it was submitted to; the journal is read only for an id that does not
            # look generated (`swarm wait tXXXX` must not pay a disk read for this)
            own = m.owned_task_id(tid, cred.uid, _user_name(cred.uid))
            cached = self.table.get_cached(own)
            if cached is not None:
                return cached
            if not m.GENERATED_TASK_ID.fullmatch(tid):
                try:
                    return await self.table.get(own)
                except UnknownTask:
                    pass
        return await self._find(tid)

    async def op_submit(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        if not self.accepting:
            raise RequestError("unavailable", "agent is shutting down; not accepting tasks")
        spec = request_checks.submit_spec(
            f, uid=cred.uid, user=_user_name(cred.uid), home=self.node, now=wall_now()
        )
        refusal = self.isolation.identities.submit_refusal(cred.uid, spec.user)
        if refusal is not None:
            raise RequestError("permission_denied", refusal)
        never = self._unsatisfiable(spec)
        if never is not None:
            raise RequestError("unsatisfiable", f"submit: {never}")
        chosen = "~" in spec.id  # a client's own id (a generated one is new by chance)
        if chosen:
            dup = await self._resubmitted(spec, cred)
            if dup is not None:
                return dup
            self._submitting.add(spec.id)
        try:
            return await self._accept(spec)
        finally:
            self._submitting.discard(spec.id)

    def _unsatisfiable(self, spec: m.TaskSpec) -> str | None:
        """Why no live member could ever run `spec` (policy.feasible, from the gossiped
        capacities and our own); None while one might, or while we have seeds but
        have not reached anyone yet (the members we do not know could fit it)."""
        if spec.is_global or (spec.cpu is None and spec.mem is None and spec.gpu is None):
            return None  # asks for nothing a node could lack (the common, fast case)
        ms = self.cluster.membership
        if ms is None or (self.cluster.seed_addrs and ms.num_live <= 1):
            return None
        s, view = self.coord.sample, self.coord.view
        own = feasible.NodeCapacity(self.node, s.cpus, s.mem_total, self.coord.gpus.summary())
        peers = (
            None if (e := view.get(mb.node)) is None else feasible.NodeCapacity.of(e.report)
            for mb in ms.alive_members()
            if mb.node != self.node
        )
        return feasible.unsatisfiable(spec, own, peers)

    async def _accept(self, spec: m.TaskSpec) -> dict[str, Any]:
        if testbreak.broken("drop-acked") and spec.id[-1] in "0123":  # TEST-ONLY: chaos self-test
            return {"id": spec.id}
        try:
            if spec.is_global:
                await self.coord.add_global(spec)
                return {"id": spec.id, "global": True}
            # placed (and started, when it runs here) as soon as its record is written,
            # during the journal's fsync; the answer waits for the fsync
            await self.table.add(
                m.new_task(spec, wall_now(), self.node),
                on_written=lambda t: self.coord.place_soon(t.id),
            )
        except JournalError as e:
            await self._unaccept(spec.id, f"journal write failed: {e}")
            raise RequestError("journal", f"task not accepted: journal write failed: {e}") from None
        return {"id": spec.id}

    async def _resubmitted(self, spec: m.TaskSpec, cred: PeerCred) -> dict[str, Any] | None:
        """A chosen id seen before (in memory or in the journal: a record is never
        overwritten by a new submission): the same submission again from its owner is
        a duplicate; anything else is refused without saying what the record holds."""
        try:
            existing = await self.table.get(spec.id)
        except UnknownTask:
            if spec.id in self._submitting:
                raise RequestError(
                    "conflict", f"task id {spec.id} is being submitted already"
                ) from None
            return None
        if existing.spec.uid != cred.uid:
            # never the owner's: ids are namespaced by user name, so only a uid that
            # lost its name (or a reused name) gets here; say nothing of the record
            raise RequestError("conflict", f"task id {spec.id} is taken")
        if not m.same_submission(existing.spec, spec):
            raise RequestError("conflict", f"task id {spec.id} already used for another task")
        return {"id": spec.id, "duplicate": True}

    async def _unaccept(self, tid: m.TaskId, why: str) -> None:
        """A submission whose record was written but not synced (the fsync failed) may
        be placed or running already: the submitter is told it was not accepted, so it
        must not run. It ends cancelled, which the journal retries until it lands."""
        t = self.table.get_cached(tid)
        if t is None or t.state.terminal:
            return
        self.log.warning("submit.unaccepted", task=tid, reason=why)
        with trio.move_on_after(30):
            await self.cancel_task(t, f"not accepted: {why}")

    async def op_status(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self._task(f, cred)
        f.done()
        self._authorize(t, cred)
        return {"task": codec.task_to_wire(t), "migrations": await self._migrations(t)}

    async def _migrations(self, t: m.Task) -> list[dict[str, Any]]:
        """The task's migrations, as its home recorded them."""
        if t.spec.home in ("", self.node) or t.spec.is_global:
            return await self.migrator.records_of(t.id)
        try:
            r = await self.cluster.request(
                t.spec.home, {"op": "migrate", "kind": "records", "id": t.id}, timeout=5.0
            )
        except (TransportError, RemoteError):
            return []
        recs = r.get("records")
        return [x for x in recs if isinstance(x, dict)] if isinstance(recs, list) else []

    async def op_list(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        show_all = f.bool("all", False)
        limit = f.int("limit", 1000, lo=1, hi=100_000)
        f.done()
        tasks = sorted(self.table.active.values(), key=lambda t: (t.created_at, t.id))
        if show_all:
            finished = list(self.table.finished.values())[-limit:]
            if len(finished) < limit:
                seen = {t.id for t in finished}
                older = await self.journal.recent_terminal(limit)
                finished = [t for t in older if t.id not in seen][
                    : limit - len(finished)
                ] + finished
            tasks = sorted(finished, key=lambda t: (t.created_at, t.id)) + tasks
        if not self._operator(cred):  # others' tasks (argv, env) are not yours to see
            name = _user_name(cred.uid)
            tasks = [t for t in tasks if self._owns(t, cred, name)]
        tasks = tasks[-limit:]
        return {"tasks": [codec.task_to_wire(t) for t in tasks]}

    async def op_cancel(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self._task(f, cred)
        f.done()
        self._authorize(t, cred)
        if t.state.terminal and not t.spec.is_global:
            raise RequestError("finished", f"task {t.id} already {t.state.value}")
        t = await self.cancel_task(t, f"cancelled by uid {cred.uid}")
        return {"task": codec.task_to_wire(t)}

    async def cancel_task(self, t: m.Task, cause: str) -> m.Task:
        S = m.TaskState
        if t.spec.is_global:
            await self.coord.remove_global(t.id)
            with trio.move_on_after(10):
                while True:
                    local = self.table.get_cached(t.id)
                    if local is None or local.state.terminal:
                        break
                    await self.table.wait_change(t.id)
            return self.table.get_cached(t.id) or t
        if t.spec.home != self.node:
            r = await self.cluster.request(t.spec.home, {"op": "cancel", "id": t.id}, timeout=35.0)
            return codec.task_from_wire(r["task"])
        if t.node == self.node and t.id in self.runner.running:
            await self.runner.cancel(t.id, cause)
            return await self.table.wait_terminal(t.id)
        if t.node == self.node and t.state is S.QUEUED:
            try:
                self.runner.queue.remove(t.id)
            except ValueError:
                pass
            self.ledger.remove(t.id)
            return await self.table.change_durably(t.id, S.CANCELLED, cause)
        if t.node == self.node and t.state is S.MIGRATING:
            await self.migrator.cancel(t.id, cause)
            with trio.move_on_after(30):
                return await self.table.wait_terminal(t.id)
            return await self.table.get(t.id)
        await self.coord.cancel_remote(t.id)
        with trio.move_on_after(30):
            return await self.table.wait_terminal(t.id)
        return await self.table.get(t.id)

    async def rpc_cancel(
        self, req: dict[str, Any], sender: m.NodeId, stream: Any
    ) -> dict[str, Any]:
        tid = request_checks.check_task_id(req.get("id"))
        try:
            t = await self.table.get(tid)
        except UnknownTask:
            raise RemoteError("not_found", f"no task {tid}") from None
        if not t.state.terminal:
            t = await self.cancel_task(t, f"cancelled via {sender}")
        return {"task": codec.task_to_wire(t)}

    async def op_wait(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self._task(f, cred)
        timeout = f.float("timeout", None, lo=0.0)
        f.done()
        self._authorize(t, cred)
        timed_out = True
        with trio.move_on_after(float("inf") if timeout is None else timeout):
            if t.spec.home in ("", self.node) or t.spec.is_global:
                t = await self.table.wait_terminal(t.id)
            else:
                while not t.state.terminal:
                    await trio.sleep(0.5)
                    t = await self._find(t.id)
            timed_out = False
        return {"task": codec.task_to_wire(t), "timed_out": timed_out}

    async def op_info(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        f.done()
        ms = self.cluster.membership
        return {
            "node": self.node,
            "version": __version__,
            "pid": os.getpid(),
            "port": self.cluster.addr[1],
            "slots": self.runner.slots,
            "shares": self.ledger.shares,
            "running": len(self.runner.running),
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
            "uptime": wall_now() - self.started_at,
            "api": dict(self.api.stats),
            "coordinator": dict(self.coord.counters),
            "migration": {
                "mode": self.config.migration,
                "criu": self.migrator.criu.ok,
                "criu_reason": self.migrator.criu.reason,
                "in_flight_out": len(self.migrator.outgoing),
                "in_flight_in": len(self.migrator.incoming),
                **dict(self.migrator.counters),
            },
            "transfer": _attrs_dict(self.coord.transfer.stats),
            "transport": dict(self.cluster.transport.counters) if self.cluster.transport else {},
            "membership": dict(ms.stats) if ms is not None else {},
        }

    async def op_nodes(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        f.done()
        ms = self.cluster.membership
        now = trio.current_time()
        out = []
        if ms is not None:
            loads = ms.load_view()
            for mb in sorted(ms.members(), key=lambda x: x.node):
                entry = loads.get(mb.node)
                out.append(
                    {
                        **codec.member_to_wire(mb),
                        "self": mb.node == self.node,
                        "load": None if entry is None else codec.load_report_to_wire(entry.report),
                        "load_age": None if entry is None else max(0.0, now - entry.received_at),
                    }
                )
        return {"nodes": out}

    async def op_explain(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self._task(f, cred)
        f.done()
        self._authorize(t, cred)
        if t.spec.home not in ("", self.node) and not t.spec.is_global:
            r = await self.cluster.request(t.spec.home, {"op": "explain", "id": t.id}, timeout=5.0)
            return {"task": codec.task_to_wire(t), "decisions": r.get("decisions", [])}
        return {"task": codec.task_to_wire(t), "decisions": await self._explain_all(t)}

    async def _explain_all(self, t: m.Task) -> list[dict[str, Any]]:
        """The home's decisions, plus why the executing node has not started it yet."""
        out = await self._explain(t.id)
        if t.node not in ("", self.node) and not t.state.terminal:
            try:
                r = await self.cluster.request(
                    t.node, {"op": "explain", "id": t.id, "local": True}, timeout=3.0
                )
                out += [{**d, "node": t.node} for d in r.get("decisions", [])]
            except (TransportError, RemoteError) as e:
                out.append({"at": wall_now(), "outcome": f"cannot ask {t.node}: {e}"})
        return out

    async def _explain(self, tid: m.TaskId) -> list[dict[str, Any]]:
        out = await self.coord.explain(tid)
        blocked = self.runner.blocked.get(tid)
        if blocked:
            out.append({"at": wall_now(), "outcome": "queued here, not started: " + blocked})
        return out

    async def rpc_explain(
        self, req: dict[str, Any], sender: m.NodeId, stream: Any
    ) -> dict[str, Any]:
        tid = request_checks.check_task_id(req.get("id"))
        if req.get("local"):
            return {"decisions": await self._explain(tid)}
        try:
            t = await self.table.get(tid)
        except UnknownTask:
            return {"decisions": await self._explain(tid)}
        return {"decisions": await self._explain_all(t)}

    async def op_shares(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        # One change at a time, so that the journal's order of changes is the ledger's
        # (a drain whose write is slow must not land after the undrain that followed it).
        async with self._shares_lock:
            return await self._change_shares(f, cred)

    async def _change_shares(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        value = f.int("shares", None, lo=0, hi=1 << 31)
        drain = f.bool("drain", False)
        undrain = f.bool("undrain", False)
        f.done()
        if drain and (undrain or value is not None):
            raise wire.SchemaError("shares: drain takes no other field")
        old = self.ledger.shares
        extra: list[Any] = []
        if drain:
            value = 0
            if old > 0:
                extra.append(PutKV(UNDRAIN_KEY, old))
        elif undrain and value is None:
            saved = self._kv_undrain if self._kv_undrain else self.config.shares
            value = saved if saved > 0 else 1024
        if value is not None:
            if cred.uid != 0 and cred.uid != os.getuid():
                raise RequestError(
                    "permission_denied", "only root or the agent's user may change shares"
                )
            if value < old:
                # A cut (a drain) takes effect before it is journaled: no task may start
                # while the write is in flight, after the time the journal gives it.
                self.ledger.set_shares(value)
            try:
                await self.journal.commit(
                    [
                        PutKV(SHARES_KEY, value),
                        *extra,
                        Event(wall_now(), "shares", None, self.node, {"old": old, "new": value}),
                    ]
                )
            except JournalError as e:
                self.ledger.set_shares(old)
                raise RequestError(
                    "journal", f"shares not changed: journal write failed: {e}"
                ) from None
            if drain and old > 0:
                self._kv_undrain = old
            self.ledger.set_shares(value)
            self.log.info("agent.shares", old=old, new=value, draining=value == 0)
            self.coord.shares_changed()
            self.runner.kick()
        return {"shares": self.ledger.shares, "draining": self.ledger.draining}

    async def op_logs(self, f: wire.Fields, cred: PeerCred) -> AsyncIterator[dict[str, Any]]:
        t = await self._task(f, cred)
        which = f.str("stream", "stdout")
        if which not in ("stdout", "stderr"):
            raise wire.SchemaError("logs: stream must be stdout or stderr")
        follow = f.bool("follow", False)
        offset = f.int("offset", 0, lo=0)
        f.done()
        self._authorize(t, cred)
        where = t.node or self.node
        if where == self.node or t.spec.is_global:
            out, err = self.runner.log_paths(t.id)
            path = out if which == "stdout" else err

            async def current() -> m.Task | None:
                try:
                    return await self.table.get(t.id)
                except UnknownTask:
                    return None

            async for part in read_log(path, offset, follow, current, self.table):
                yield part
            return
        async for part in self._remote_logs(t, where, which, follow, offset):
            yield part

    async def _remote_logs(
        self, t: m.Task, where: m.NodeId, which: str, follow: bool, offset: int
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            stream = await self.cluster.open_stream(
                where,
                {"op": "logs", "id": t.id, "stream": which, "follow": follow, "offset": offset},
            )
        except TransportError as e:
            raise RequestError(
                "unavailable", f"cannot reach {where} for the logs of {t.id}: {e}"
            ) from None
        async with stream:
            stream.timeout = float("inf")
            while True:
                try:
                    part = await stream.receive(timeout=float("inf") if follow else 30.0)
                except TransportError as e:
                    raise RequestError(
                        "unavailable", f"log stream from {where} broke: {e}"
                    ) from None
                if not isinstance(part, dict):
                    return
                yield part
                if not part.get("more"):
                    return


def _attrs_dict(obj: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(obj) if attrs.has(type(obj)) else {}


@functools.lru_cache(maxsize=4096)
def _user_name(uid: int) -> str | None:
    """Cached: a passwd lookup can cost a millisecond (NSS), once per submit adds up."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None
