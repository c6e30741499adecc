"""Moving running tasks between nodes: the decision loop, the mechanisms, both ends.

Every few seconds the loop builds what policy.migration needs from the real node
(each running task's age, state size and measured pauses; candidates from the same
two-choice sample placement uses; bandwidth measured on earlier transfers; suspects
from membership) and starts the moves the policy allows. Decisions go to `swarm
explain`, outcomes to the task's migration records (`swarm status`) and counters.

One migration, in this order (the order is what makes every failure harmless):

1. *prepare*: the target re-checks with its fresh load and may refuse. Nothing has
   happened to the task yet.
2. *stop*: checkpoint (signal; the task writes $SWARM_STATE_DIR and exits with the
   checkpoint code), restart (terminate) or CRIU dump. The runner records RUNNING ->
   MIGRATING. If the task does not stop in time it simply runs on here.
3. *transfer*: the state directory is streamed to the target (chunked, sha256 per
   chunk and for the whole, over the encrypted transport). The target stages it
   and installs it under its state_dir_of(task) only once everything verified. The
   source keeps its own copy: if anything breaks, the task restarts here from it.
4. *move*: the task's location moves through the handoff protocol (the home offers
   it to the target; a guest asks its home with a MoveRequest). The home commits at
   the target before the target may run it, and revokes this node; a refused or
   failed offer puts the task back in this node's queue (it restarts here, from its
   checkpoint). The source keeps its copy of the state until the target says the
   task started there (or a while passed): if the target dies before that, and the
   task comes back here, it restarts from that copy.

The process was stopped before step 3 and never restarts here unless the move did
not happen, and the target runs it only after the home committed it there: there is
never a copy running twice, and until the commit there is always a complete copy of
the state where the task will run.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal as _signal
import stat
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import attrs
import psutil
import trio

from .. import model as m
from .. import wire
from ..cluster import handoff as h
from ..cluster import migrate as mx
from ..logs import NULL_LOG, EventLog
from ..node.config import profile_settings
from ..policy import migration as pol
from ..policy.view import PeerInfo, sample_peers
from . import criu as criu_rt
from .clock import Clock
from .executor import ProcessPlan
from .journal import DelKV, PutKV
from .journal import Event as JEvent
from .net import FramedStream, TransportError, collapse_single_group
from .peers import RemoteError
from .tasks import UnknownTask

if TYPE_CHECKING:
    from ..config import Config
    from .driver import Driver

S = m.TaskState
MM = m.MigrateMode
ARRIVAL_KEY = "marr:"
INCOMING_DIR = ".incoming"
STREAM_TIMEOUT = 15.0  # seconds one state frame may take to go out or come in
DISK_RESERVE = 256 << 20  # bytes a target keeps free when accepting state
MIN_BW_SAMPLE = 256 << 10  # smaller transfers measure latency, not bandwidth
RECORD_CACHE = 10_000


class MigrationError(Exception):
    """A step of a migration failed; the task stays (or restarts) at the source."""


# ------------------------------------------------------------------ settings


@attrs.frozen
class MigratorSettings:
    mode: str = "on"  # on | off | dry-run
    policy: pol.MigrationConfig = attrs.field(factory=pol.MigrationConfig)
    period: float = 5.0  # seconds between decision rounds
    checkpoint_signal: int = int(_signal.SIGUSR1)
    checkpoint_timeout: float = 30.0
    default_pause: float = 2.0  # seconds, until pauses were measured here
    rpc_timeout: float = 5.0
    move_timeout: float = 120.0  # how long the source waits for the home's verdict
    staged_ttl: float = 300.0  # staged state whose task never came is deleted after


def parse_signal(name: str) -> int:
    """SIGUSR1, USR1 or a number; ValueError for anything else."""
    text = name.strip().upper()
    if text.isdigit():
        num = int(text)
        if not 0 < num < _signal.NSIG:
            raise ValueError(f"no signal number {num}")
        return num
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(_signal.Signals[text])
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


def settings_for(config: Config) -> MigratorSettings:
    """From the agent's options; the profile's timings (local: tests, loopback demos,
    fast)."""
    t = profile_settings(config.profile).migration
    policy = pol.MigrationConfig(
        default_bandwidth=config.bandwidth,
        dry_run=config.migration == "dry-run",
        cooldown=t.cooldown,
        rate=t.rate,
        burst=2.0,
        max_report_age=t.max_report_age,
    )
    return MigratorSettings(
        mode=config.migration,
        policy=policy,
        period=t.period,
        checkpoint_signal=parse_signal(config.checkpoint_signal),
        checkpoint_timeout=config.checkpoint_timeout,
        default_pause=t.default_pause,
        rpc_timeout=t.rpc_timeout,
        move_timeout=t.move_timeout,
        staged_ttl=t.staged_ttl,
    )


# ------------------------------------------------------------------ bookkeeping


@attrs.define
class Outgoing:
    """A migration this node is driving (it is the source)."""

    mid: str
    target: m.NodeId
    mode: m.MigrateMode
    since: float
    step: str = "prepare"
    cancel: str | None = None


@attrs.define
class Incoming:
    """A migration this node prepared for (it is the target)."""

    mid: str
    source: m.NodeId
    spec: m.TaskSpec
    since: float
    staged: bool = False


@attrs.frozen
class Arrival:
    """A task that arrived here by migration: journaled, so that its moves count, its
    age and its pending resume survive an agent restart."""

    mid: str
    source: m.NodeId
    mode: m.MigrateMode
    moves: int
    age: float  # seconds it had run before it came
    stopped_at: float  # wall clock at the source
    arrived_at: float  # wall clock here
    files: dict[str, str] = attrs.field(factory=dict)
    resumed: bool = False
    restore_used: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "mode": self.mode.value}

    @classmethod
    def from_wire(cls, obj: Any) -> Arrival:
        f = wire.Fields(obj, "arrival")
        a = cls(
            mid=f.str("mid", required=True, max_len=300),
            source=f.str("source", required=True, max_len=256),
            mode=f.enum("mode", MM, required=True),
            moves=f.int("moves", 0, lo=0),
            age=f.float("age", 0.0, lo=0.0),
            stopped_at=f.float("stopped_at", 0.0),
            arrived_at=f.float("arrived_at", 0.0),
            files=f.str_map("files", max_items=16),
            resumed=f.bool("resumed", False),
            restore_used=f.bool("restore_used", False),
        )
        f.done()
        return a


# ------------------------------------------------------------------ files


def dir_size(root: Path) -> int:
    """Bytes of regular files under `root` (symlinks not followed); 0 if absent."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def has_state(root: Path) -> bool:
    try:
        with os.scandir(root) as it:
            return any(True for _ in it)
    except OSError:
        return False


def scan_state(root: Path) -> list[mx.Dir | mx.File | mx.Link]:
    """The entries to send, parents first; other file types (fifos...) are skipped."""
    out: list[mx.Dir | mx.File | mx.Link] = []
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel + "/"
        keep = []
        for d in sorted(dirnames):
            p = os.path.join(dirpath, d)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out.append(mx.Link(prefix + d, os.readlink(p)))
            elif stat.S_ISDIR(st.st_mode):
                out.append(mx.Dir(prefix + d, st.st_mode & 0o7777))
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out.append(mx.Link(prefix + name, os.readlink(p)))
            elif stat.S_ISREG(st.st_mode):
                out.append(mx.File(prefix + name, st.st_mode & 0o7777, st.st_size))
    return out


def _read_chunk(fh: IO[bytes], n: int) -> tuple[bytes, bytes]:
    data = fh.read(n)
    return data, hashlib.sha256(data).digest()


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, _files in os.walk(root):
        fd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give a staged state tree to its task's user. Bottom-up, the root last: while a
    path is changed, every directory above it is still the agent's, so the user cannot
    swap a directory on the way for a symlink; lchown never follows the last one."""
    for dirpath, dirs, files in os.walk(root, topdown=False):
        for name in dirs + files:
            os.lchown(os.path.join(dirpath, name), uid, gid)
    os.lchown(root, uid, gid)


def install_state(staging: Path, final: Path, owner: tuple[int, int] | None) -> None:
    """Put a verified staging directory in place of `final`, durably."""
    _fsync_tree(staging)
    if owner is not None:
        _chown_tree(staging, *owner)
    final.parent.mkdir(parents=True, exist_ok=True)
    old: Path | None = None
    if os.path.lexists(final):
        old = final.with_name(f"{final.name}.old-{secrets.token_hex(4)}")
        os.rename(final, old)
    os.rename(staging, final)
    fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_tree(path: Path) -> None:
    if os.path.islink(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


class _Writer:
    """Applies a StateReceiver's actions inside one staging directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fh: IO[bytes] | None = None

    async def apply(self, a: mx.Action) -> None:
        if isinstance(a, mx.MakeDir):
            await trio.to_thread.run_sync(os.mkdir, self.root / a.path, a.mode)
        elif isinstance(a, mx.OpenFile):
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = await trio.to_thread.run_sync(os.open, self.root / a.path, flags, a.mode)
            self.fh = os.fdopen(fd, "wb")
        elif isinstance(a, mx.Write):
            assert self.fh is not None
            await trio.to_thread.run_sync(self.fh.write, a.data)
        elif isinstance(a, mx.CloseFile):
            fh, self.fh = self.fh, None
            if fh is not None:
                await trio.to_thread.run_sync(_close_synced, fh)
        elif isinstance(a, mx.MakeLink):
            await trio.to_thread.run_sync(os.symlink, a.target, self.root / a.path)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


def _close_synced(fh: IO[bytes]) -> None:
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()


# ------------------------------------------------------------------ the migrator


class Migrator:
    def __init__(
        self,
        coord: Driver,
        settings: MigratorSettings,
        *,
        clock: Clock,
        criu: criu_rt.CriuStatus | None = None,
        owner_of: Callable[[m.TaskSpec], tuple[int, int] | None] | None = None,
        log: EventLog = NULL_LOG,
    ) -> None:
        self.coord = coord
        self.clock = clock
        self.s = settings
        self.criu = criu or criu_rt.CriuStatus(False, "not detected yet")
        self.log = log
        # the task's user on this node (uid, gid) for received state
        self.owner_of: Callable[[m.TaskSpec], tuple[int, int] | None] = owner_of or (
            lambda spec: None
        )
        self.bandwidth = pol.BandwidthEstimator()
        self.pauses = pol.DurationEstimator()
        self.bucket = settings.policy.new_bucket()
        self.outgoing: dict[m.TaskId, Outgoing] = {}
        self.incoming: dict[m.TaskId, Incoming] = {}
        self.arrivals: dict[m.TaskId, Arrival] = {}
        self.started: dict[m.TaskId, float] = {}  # trio time the current run began here
        self.last: dict[m.TaskId, tuple[str, str | None]] = {}
        # record parts written by this process, until the journal surely has them
        self.recent: OrderedDict[m.TaskId, list[dict[str, Any]]] = OrderedDict()
        # moved away, state kept until the target started it: task -> (mid, since)
        self.retained: dict[m.TaskId, tuple[str, float]] = {}
        self.counters: Counter[str] = Counter()
        self._seq = 0
        self._token = secrets.token_hex(3)
        self._nursery: trio.Nursery | None = None

    @property
    def node(self) -> m.NodeId:
        return self.coord.node

    def restore(self, kv: dict[str, Any]) -> None:
        for key, value in kv.items():
            if not key.startswith(ARRIVAL_KEY):
                continue
            try:
                self.arrivals[key[len(ARRIVAL_KEY) :]] = Arrival.from_wire(value)
            except wire.WireError as e:
                self.log.error("migration.bad_state", key=key, error=str(e))

    def _journal_arrival(self, tid: m.TaskId) -> None:
        a = self.arrivals.get(tid)
        if a is None:
            self.coord.journal.enqueue([DelKV(ARRIVAL_KEY + tid)])
        else:
            self.coord.journal.enqueue([PutKV(ARRIVAL_KEY + tid, a.to_wire())])

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    # ------------------------------------------------------------- the loop

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # its peer route (`migrate`) is in runtime/routes.py, installed by the agent
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await trio.sleep(self.s.period)
                self._expire(self.clock.now())
                if self.s.mode == "off" or self.coord.cluster is None:
                    continue
                try:
                    await self.round()
                except Exception as e:  # a bug here must not stop the agent
                    self.log.exception("migration.round_failed", e)

    async def round(self) -> list[pol.MigrationDecision]:
        """One decision round; returns the decisions (for tests and dry runs)."""
        now = self.clock.now()
        pairs = await self._running(now)
        if not pairs:
            return []
        local = self.coord.local_report()
        cands = self._candidates(now)
        ms = self.coord.cluster.membership if self.coord.cluster is not None else None
        suspects = frozenset(
            mb.node for mb in (ms.members() if ms else []) if mb.state is m.MemberState.SUSPECT
        )
        here = len(self.outgoing) + len(self.incoming)
        plan = pol.plan_migrations(
            [rt for _, rt in pairs],
            local,
            cands,
            now=now,
            bucket=self.bucket,
            config=self.s.policy,
            bandwidth=self.bandwidth,
            in_flight=pol.InFlight(
                here=here, cluster=here, by_node=Counter(o.target for o in self.outgoing.values())
            ),
            suspect=suspects,
        )
        self.bucket = plan.bucket
        by_id = {t.id: (t, rt) for t, rt in pairs}
        for d in plan.decisions:
            self.counters["decision:" + d.code] += 1
            self._note(by_id[d.task_id][0], d)
        for d in plan.start:
            t, rt = by_id[d.task_id]
            assert d.target is not None
            self.outgoing[t.id] = Outgoing(self._new_mid(), d.target, rt.mode, now)
            self._spawn(self._migrate, t, rt, d, local)
        return list(plan.decisions)

    def _new_mid(self) -> str:
        self._seq += 1
        return f"{self.node}:{self._token}:{self._seq}"

    async def _running(self, now: float) -> list[tuple[m.Task, pol.RunningTask]]:
        out = []
        for tid in list(self.coord.runner.running):
            t = self.coord.table.active.get(tid)
            if t is None or t.state is not S.RUNNING or t.spec.is_global:
                continue
            if t.spec.migrate is MM.NEVER or tid in self.outgoing:
                continue
            if t.spec.home not in ("", self.node) and not self.coord.guest.may_run(tid):
                continue
            out.append((t, await self._running_task(t, now)))
        return out

    async def _running_task(self, t: m.Task, now: float) -> pol.RunningTask:
        mode = t.spec.migrate
        arr = self.arrivals.get(t.id)
        here = max(0.0, now - self.started.get(t.id, now))
        age = here if mode is MM.RESTART else here + (arr.age if arr else 0.0)
        size = 0
        if mode in (MM.CHECKPOINT, MM.CRIU):
            size = await trio.to_thread.run_sync(dir_size, self.coord.runner.state_dir_of(t.id))
        if mode is MM.CRIU:
            size += self._memory_of(t.id)  # the image is about the size of its memory
        last = None if arr is None else now - max(0.0, self.clock.wall() - arr.arrived_at)
        return pol.RunningTask(
            task_id=t.id,
            mode=mode,
            age=age,
            expected_runtime=t.spec.expected_runtime,
            state_bytes=size,
            pause=self.pauses.estimate(mode.value, self.s.default_pause),
            warmup=0.0,
            moves=arr.moves if arr else 0,
            last_move_at=last,
            home=t.spec.home or self.node,
            gpu=t.spec.gpu,
        )

    def _memory_of(self, tid: m.TaskId) -> int:
        handle = self.coord.runner.executor.running.get(tid)
        if handle is None:
            return 0
        try:
            p = psutil.Process(handle.pid)
            return int(sum(x.memory_info().rss for x in [p, *p.children(recursive=True)]))
        except (psutil.Error, OSError):
            return 0

    def _candidates(self, now: float) -> list[pol.Candidate]:
        view = self.coord.view

        def verdict(node: m.NodeId, entry: PeerInfo) -> str | None:
            r = entry.report
            return None if r.shares - r.reserved_shares > 0 else "draining"

        sample = sample_peers(view, max(2, self.coord.d), self.coord.rng, verdict, skip=self.node)
        return [
            pol.Candidate(n, view[n].report, max(0.0, now - view[n].received_at))
            for n in sample.chosen
        ]

    def _note(self, t: m.Task, d: pol.MigrationDecision) -> None:
        """A decision for `swarm explain`, when it differs from the task's last one."""
        key = (d.code, d.target)
        if self.last.get(t.id) == key:
            return
        self.last[t.id] = key
        rec: dict[str, Any] = {
            "kind": "migration",
            "outcome": f"migration {d.code}: {d.reason}",
            "code": d.code,
            "from": self.node,
            "target": d.target,
            "gain": round(d.gain, 3),
            "cost": round(d.cost, 3),
            "margin": d.margin,
        }
        if d.figures is not None:
            rec["figures"] = {k: round(float(v), 4) for k, v in attrs.asdict(d.figures).items()}
        self.coord.record_explain(t.id, rec)
        if d.would_migrate:
            self.log.info("migration.decision", task=t.id, code=d.code, to=d.target, why=d.reason)

    # ------------------------------------------------------------- one move

    async def _migrate(
        self, t: m.Task, rt: pol.RunningTask, d: pol.MigrationDecision, local: m.LoadReport
    ) -> None:
        out = self.outgoing[t.id]
        rec: dict[str, Any] = {
            "from": self.node,
            "to": out.target,
            "mode": out.mode.value,
            "reason": d.reason,
            "gain": round(d.gain, 3),
            "cost": round(d.cost, 3),
            "state_bytes": rt.state_bytes,
            "started_at": self.clock.wall(),
        }
        self.counters["started"] += 1
        self.log.info("migration.start", task=t.id, to=out.target, mode=out.mode.value, mid=out.mid)
        try:
            outcome, detail = await self._drive(t, rt, local, out, rec)
        except Exception as e:  # a bug must never lose the task: it restarts here
            self.log.exception("migration.internal_error", e, task=t.id)
            outcome, detail = "failed", f"internal error: {type(e).__name__}: {e}"
            self._put_back(t.id, "migration failed (internal error): runs here again")
        finally:
            self.outgoing.pop(t.id, None)
        rec.update(outcome=outcome, detail=detail, ended_at=self.clock.wall())
        self.counters["outcome:" + outcome] += 1
        log = self.log.info if outcome == "moved" else self.log.warning
        log("migration." + outcome, task=t.id, to=out.target, detail=detail, mid=out.mid)
        self._record(t.spec, out.mid, rec)

    async def _drive(
        self,
        t: m.Task,
        rt: pol.RunningTask,
        local: m.LoadReport,
        out: Outgoing,
        rec: dict[str, Any],
    ) -> tuple[str, str]:
        tid, target, cluster = t.id, out.target, self.coord.cluster
        assert cluster is not None
        # 1. the target re-checks with its fresh load before anything happens to the task
        bw = self.bandwidth.estimate(target, self.s.policy.default_bandwidth)
        prep = mx.Prepare(out.mid, t.spec, rt, local, bw)
        try:
            r = await cluster.request(
                target,
                {"op": "migrate", "kind": "prepare", "prep": mx.prepare_to_wire(prep)},
                self.s.rpc_timeout,
            )
        except (TransportError, RemoteError) as e:
            return "refused", f"{target} did not answer: {e}"
        if not r.get("ok"):
            return "refused", f"{target} refused: {r.get('reason')}"
        # 2. stop it; if it does not stop, it runs on here and nothing else happens
        out.step = "stop"
        t_stop, stopped_at = self.clock.now(), self.clock.wall()
        why = await self._stop(t, out.mode)
        if why is not None:
            self._spawn(self._abort_at, target, tid, out.mid)
            return "not-stopped", why
        rec["stop_s"] = round(self.clock.now() - t_stop, 4)
        if out.cancel is not None:
            self._spawn(self._abort_at, target, tid, out.mid)
            await self._cancelled(tid, out.cancel)
            return "cancelled", out.cancel
        # 3. the state first: until the target holds all of it, the task restarts here
        out.step = "transfer"
        try:
            nbytes, secs = await self._send_state(t, rt, out, stopped_at)
        except MigrationError as e:
            self._spawn(self._abort_at, target, tid, out.mid)
            self._put_back(tid, f"migration to {target} failed ({e}): restarts here")
            return "failed", f"transfer: {e}"
        rec.update(bytes=nbytes, transfer_s=round(secs, 4))
        if secs > 0:
            rec["bytes_per_s"] = round(nbytes / secs, 1)
        if nbytes >= MIN_BW_SAMPLE:
            self.bandwidth = self.bandwidth.observe(target, nbytes, secs)
        self.counters["bytes_sent"] += nbytes
        if out.cancel is not None:
            self._spawn(self._abort_at, target, tid, out.mid)
            await self._cancelled(tid, out.cancel)
            return "cancelled", out.cancel
        # 4. move its location; a refusal or failure puts it back in this node's queue
        out.step = "move"
        ok, why = await self._move(t, target)
        if not ok:
            if why.startswith("undecided"):
                return "undecided", why
            self._spawn(self._abort_at, target, tid, out.mid)
            return "failed", f"move: {why}"
        handover = self.clock.now() - t_stop
        rec["handover_s"] = round(handover, 4)
        self.pauses = self.pauses.observe(out.mode.value, handover)
        self._forget(tid)
        self.retained[tid] = (out.mid, self.clock.now())  # until the target started it
        return "moved", f"to {target}"

    async def _stop(self, t: m.Task, mode: m.MigrateMode) -> str | None:
        """Stop the task for its move: None once it is MIGRATING, else why not."""
        tid, runner = t.id, self.coord.runner
        if tid not in runner.running:
            return "it is no longer running"
        runner.migrating[tid] = mode
        if mode is MM.CHECKPOINT:
            if not runner.executor.signal(tid, self.s.checkpoint_signal):
                runner.migrating.pop(tid, None)
                return "its process is gone"
            limit = self.s.checkpoint_timeout
        elif mode is MM.RESTART:
            self._spawn(runner.executor.terminate, tid, "migration (restart)")
            limit = runner.executor.kill_grace + 10.0
        else:
            failed = await self._dump(t)
            if failed is not None:
                runner.migrating.pop(tid, None)
                return failed
            limit = 10.0
        with trio.move_on_after(limit):
            while (cur := self.coord.table.active.get(tid)) is not None and cur.state is S.RUNNING:
                await self.coord.table.wait_change(tid)
        cur = self.coord.table.get_cached(tid)
        if cur is not None and cur.state is S.RUNNING:
            runner.migrating.pop(tid, None)
            return f"it did not stop within {limit:g}s; it runs on here"
        if cur is None or cur.state is not S.MIGRATING:
            return f"it ended by itself ({'gone' if cur is None else cur.state.value})"
        return None

    async def _dump(self, t: m.Task) -> str | None:
        if not self.criu.ok:
            return f"no CRIU here: {self.criu.reason}"
        handle = self.coord.runner.executor.running.get(t.id)
        if handle is None:
            return "its process is gone"
        images = self.coord.runner.state_dir_of(t.id) / criu_rt.CRIU_DIR

        def reset() -> None:
            remove_tree(images)
            images.mkdir(parents=True)

        await trio.to_thread.run_sync(reset)
        argv = criu_rt.dump_argv(self.criu.path, handle.pid, images)
        try:
            with trio.fail_after(self.s.checkpoint_timeout):
                res = await trio.run_process(
                    argv, capture_stdout=True, capture_stderr=True, check=False
                )
        except trio.TooSlowError:
            return f"CRIU dump took over {self.s.checkpoint_timeout:g}s; it runs on here"
        except OSError as e:
            return f"cannot run CRIU: {e}"
        if res.returncode != 0:
            return f"CRIU dump failed (exit {res.returncode}, see {images}/dump.log)"
        return None

    async def _send_state(
        self, t: m.Task, rt: pol.RunningTask, out: Outgoing, stopped_at: float
    ) -> tuple[int, float]:
        cluster = self.coord.cluster
        assert cluster is not None
        sdir = self.coord.runner.state_dir_of(t.id)
        entries: list[mx.Dir | mx.File | mx.Link] = []
        if out.mode is not MM.RESTART:  # a restart starts afresh: no state goes along
            try:
                entries = await trio.to_thread.run_sync(scan_state, sdir)
            except OSError as e:
                raise MigrationError(f"cannot read the state dir: {e}") from None
        total = sum(e.size for e in entries if isinstance(e, mx.File))
        files: dict[str, str] = {}
        if out.mode is MM.CRIU:
            so, se = self.coord.runner.log_paths(t.id)
            files = {"1": str(so), "2": str(se)}
        begin = mx.Begin(
            t.id, out.mid, out.mode, len(entries), total, self.node, stopped_at, rt.age,
            rt.moves + 1, files,
        )  # fmt: skip
        t0 = self.clock.now()
        self.log.info("migration.streaming", task=t.id, to=out.target, bytes=total)
        try:
            stream = await cluster.open_stream(
                out.target,
                {"op": "migrate", "kind": "state", "begin": mx.begin_to_wire(begin)},
                timeout=self.s.rpc_timeout,
            )
        except TransportError as e:
            raise MigrationError(f"cannot reach {out.target}: {e}") from None
        async with stream:
            try:
                reply = await self._stream_entries(stream, sdir, entries, total)
            except TransportError as e:
                raise MigrationError(f"the stream to {out.target} broke: {e}") from None
            except OSError as e:
                raise MigrationError(f"cannot read the state: {e}") from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            why = reply.get("reason") if isinstance(reply, dict) else "a malformed reply"
            raise MigrationError(f"{out.target} rejected the state: {why}")
        return total, self.clock.now() - t0

    async def _stream_entries(
        self,
        stream: FramedStream,
        sdir: Path,
        entries: list[mx.Dir | mx.File | mx.Link],
        total: int,
    ) -> Any:
        """Send the entries and their data; reading the next chunk (in a thread) overlaps
        sending the current one. Returns the target's answer."""
        send_ch, recv_ch = trio.open_memory_channel[mx.Frame](4)

        async def produce() -> None:
            whole = hashlib.sha256()  # over the chunk digests, in order
            seq = 0
            async with send_ch:
                for e in entries:
                    await send_ch.send(e)
                    if not isinstance(e, mx.File) or e.size == 0:
                        continue
                    fh = await trio.to_thread.run_sync(open, sdir / e.path, "rb")
                    try:
                        left = e.size
                        while left > 0:
                            n = min(mx.CHUNK, left)
                            data, sha = await trio.to_thread.run_sync(_read_chunk, fh, n)
                            if not data:
                                raise MigrationError(f"{e.path} shrank while it was sent")
                            whole.update(sha)
                            await send_ch.send(mx.Chunk(seq, data, sha))
                            seq += 1
                            left -= len(data)
                    finally:
                        fh.close()
                await send_ch.send(mx.End(len(entries), total, whole.digest()))

        async with collapse_single_group(), trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            async with recv_ch:
                async for fr in recv_ch:
                    await stream.send(mx.frame_to_wire(fr), timeout=STREAM_TIMEOUT)
        # the target fsyncs and installs before it answers
        return await stream.receive(timeout=60.0 + total / 20e6)

    async def _move(self, t: m.Task, target: m.NodeId) -> tuple[bool, str]:
        coord = self.coord
        if t.spec.home in ("", self.node):
            # the home is here: offer it; _on_offer_failed re-queues it here on failure
            return await coord.offer_home_task(t.id, target)
        outs = coord.guest.request_move(t.id, target, self.clock.now())
        if not outs:
            self._put_back(t.id, "the handoff was not settled: runs here again")
            return False, "the handoff was not settled here"
        await coord.apply(outs, t.id)
        with trio.move_on_after(self.s.move_timeout):
            while True:
                e = coord.guest.entries.get(t.id)
                if e is None:
                    return True, ""  # revoked after the commit at the target
                if e.phase is h.GuestPhase.READY:
                    return False, "the home did not carry out the move (it runs here again)"
                await trio.sleep(0.05)
        return False, "undecided: the home has not answered yet (it decides; nothing runs twice)"

    def _put_back(self, tid: m.TaskId, cause: str) -> None:
        """A stopped task whose move did not happen: back in this node's run queue, where
        it restarts from the state it kept here."""
        t = self.coord.table.active.get(tid)
        if t is None or t.state is not S.MIGRATING:
            return
        self.coord.table.change(tid, S.QUEUED, cause, node=self.node)
        if tid not in self.coord.ledger:
            self.coord.ledger.add(t.spec)
        if tid not in self.coord.runner.queue:
            self.coord.runner.queue.appendleft(tid)
        self.coord.runner.kick()
        self.coord.load_changed()

    async def _cancelled(self, tid: m.TaskId, cause: str) -> None:
        t = self.coord.table.active.get(tid)
        if t is None or t.state is not S.MIGRATING:
            return
        after = await self.coord.table.change_durably(tid, S.CANCELLED, cause)
        self.coord.on_finished(after)

    async def cancel(self, tid: m.TaskId, cause: str) -> None:
        """Cancel a task stopped for a migration (MIGRATING here)."""
        out = self.outgoing.get(tid)
        if out is not None and out.step in ("prepare", "stop", "transfer"):
            out.cancel = cause  # the driver cancels it at its next step
            return
        e = self.coord.home.entries.get(tid)
        if e is not None and e.phase is h.HomePhase.OFFERING:
            self.coord.pending_cancel.add(tid)  # settled when the offer is
            return
        if out is None:
            await self._cancelled(tid, cause)

    async def _abort_at(self, target: m.NodeId, tid: m.TaskId, mid: str) -> None:
        """Tell the target to drop what it staged (best effort: it expires anyway)."""
        if self.coord.cluster is None:
            return
        try:
            await self.coord.cluster.request(
                target, {"op": "migrate", "kind": "abort", "id": tid, "mid": mid}, 3.0
            )
        except (TransportError, RemoteError):
            pass

    # ------------------------------------------------------------- runner events

    def on_started(self, task: m.Task) -> None:
        tid = task.id
        self.started[tid] = self.clock.now()
        self.incoming.pop(tid, None)
        arr = self.arrivals.get(tid)
        if arr is None or arr.resumed:
            return
        pause = max(0.0, self.clock.wall() - arr.stopped_at)
        self.arrivals[tid] = attrs.evolve(arr, resumed=True)
        self._journal_arrival(tid)
        self.counters["resumed"] += 1
        self.log.info("migration.resumed", task=tid, source=arr.source, pause=round(pause, 3))
        self._spawn(self._tell_source, arr.source, tid, arr.mid)
        self._record(
            task.spec,
            arr.mid,
            {"resumed_on": self.node, "resumed_at": self.clock.wall(), "pause_s": round(pause, 4)},
        )

    def on_stopped(self, task: m.Task) -> None:
        """The runner recorded RUNNING -> MIGRATING. Without a migration in flight (the
        task checkpointed on its own, or a timeout passed) it restarts here."""
        if task.id in self.outgoing:
            return
        self._put_back(task.id, "checkpointed with no move in flight: restarts here")

    def on_ended(self, task: m.Task) -> None:
        self._forget(task.id)

    def on_left(self, tid: m.TaskId) -> None:
        """The task no longer lives here (moved, revoked, dropped): its state goes too,
        except while a migration of it from here is in flight or kept (retained)."""
        self._forget(tid)
        if self._task_here(tid) or tid in self.outgoing or tid in self.retained:
            return
        self._remove_state(tid)

    def _release(self, tid: m.TaskId) -> None:
        """The kept copy of a moved task's state is no longer needed."""
        self.retained.pop(tid, None)
        if not self._task_here(tid) and tid not in self.outgoing:
            self._remove_state(tid)

    async def _tell_source(self, source: m.NodeId, tid: m.TaskId, mid: str) -> None:
        """The task started here: the source may delete the copy it kept."""
        if self.coord.cluster is None or source == self.node:
            return
        try:
            await self.coord.cluster.request(
                source, {"op": "migrate", "kind": "started", "id": tid, "mid": mid}, 5.0
            )
        except (TransportError, RemoteError):
            pass  # it deletes the copy after a while anyway

    def _forget(self, tid: m.TaskId) -> None:
        self.started.pop(tid, None)
        self.last.pop(tid, None)
        if self.arrivals.pop(tid, None) is not None:
            self._journal_arrival(tid)

    def _task_here(self, tid: m.TaskId) -> bool:
        c = self.coord
        if tid in c.runner.running or tid in c.runner.queue or tid in c.guest.entries:
            return True
        if tid in self.incoming:
            return True  # its state is being received or staged here
        t = c.table.active.get(tid)
        return t is not None and t.node == self.node

    def set_criu(self, status: criu_rt.CriuStatus) -> None:
        """CRIU's start-up check came back (it runs after construction: it is async)."""
        self.criu = status

    def holds_state(self, t: m.Task) -> bool:
        """A queued task whose checkpoint is here must restart here, not be placed or
        transferred without it (placement and transfer move tasks, not their state)."""
        if t.spec.migrate not in (MM.CHECKPOINT, MM.CRIU):
            return False
        return has_state(self.coord.runner.state_dir_of(t.id))

    def plan_hook(self, task: m.Task, plan: ProcessPlan) -> ProcessPlan:
        """A task that arrived with a CRIU image starts by restoring it (once)."""
        arr = self.arrivals.get(task.id)
        if arr is None or arr.mode is not MM.CRIU or arr.restore_used:
            return plan
        self.arrivals[task.id] = attrs.evolve(arr, restore_used=True)
        self._journal_arrival(task.id)
        images = self.coord.runner.state_dir_of(task.id) / criu_rt.CRIU_DIR
        if not self.criu.ok or not images.is_dir():
            return plan  # the task starts afresh from its command
        argv = criu_rt.restore_argv(
            self.criu.path, images, arr.files, plan.argv, uid=plan.uid, gid=plan.gid, cwd=plan.cwd
        )
        return attrs.evolve(plan, argv=tuple(argv), uid=None, gid=None, groups=None)

    def _expire(self, now: float) -> None:
        """Prepared or staged migrations whose task never came: forget, delete the state.
        Copies kept for moved tasks: deleted after the same time."""
        for tid, (_mid, since) in list(self.retained.items()):
            if now - since > self.s.staged_ttl:
                self._release(tid)
        for tid, inc in list(self.incoming.items()):
            ttl = self.s.staged_ttl if inc.staged else self.s.checkpoint_timeout + 60.0
            if now - inc.since <= ttl:
                continue
            del self.incoming[tid]
            if not self._task_here(tid):
                self._drop_staged(tid)

    def _drop_staged(self, tid: m.TaskId) -> None:
        if self.arrivals.pop(tid, None) is not None:
            self._journal_arrival(tid)
        self._remove_state(tid)

    def _remove_state(self, tid: m.TaskId) -> None:
        """Delete a task's state dir in a worker thread (a tree can be big). Most tasks
        never made one: one lstat here saves them the thread round trip."""
        path = self.coord.runner.state_dir_of(tid)
        if os.path.lexists(path):
            self._spawn(trio.to_thread.run_sync, remove_tree, path)

    # ------------------------------------------------------------- records

    def _record(self, spec: m.TaskSpec, mid: str, fields: dict[str, Any]) -> None:
        """Part of a migration's record: stored at the task's home (merged by mid)."""
        rec = {"mid": mid, **fields}
        if spec.home in ("", self.node):
            self._store_record(spec.id, rec)
        else:
            self._spawn(self._send_record, spec.home, spec.id, rec)

    def _store_record(self, tid: m.TaskId, rec: dict[str, Any]) -> None:
        self.recent.setdefault(tid, []).append(rec)
        self.recent.move_to_end(tid)
        while len(self.recent) > RECORD_CACHE:
            self.recent.popitem(last=False)
        self.coord.journal.enqueue([JEvent(self.clock.wall(), "migration", tid, self.node, rec)])

    async def _send_record(self, home: m.NodeId, tid: m.TaskId, rec: dict[str, Any]) -> None:
        assert self.coord.cluster is not None
        for attempt in range(4):
            try:
                await self.coord.cluster.request(
                    home, {"op": "migrate", "kind": "record", "id": tid, "rec": rec}, 5.0
                )
                return
            except (TransportError, RemoteError) as e:
                if attempt == 3:
                    self.log.warning("migration.record_lost", task=tid, home=home, error=str(e))
                await trio.sleep(1.0 + 2.0 * attempt)

    async def records_of(self, tid: m.TaskId) -> list[dict[str, Any]]:
        """The task's migrations as its home knows them (oldest first): the journal's
        parts and those written since (a write may not have landed yet). The source's
        and the target's parts set different fields, so the merge order is free."""
        parts = await self.coord.journal.events_for(tid, "migration")
        return mx.merge_records([*parts, *self.recent.get(tid, [])])

    # ------------------------------------------------------------- RPC (all roles)

    async def rpc(
        self, req: dict[str, Any], sender: m.NodeId, stream: FramedStream
    ) -> dict[str, Any] | None:
        kind = req.get("kind")
        if kind == "prepare":
            f = wire.Fields(req, "migrate prepare", ignore=("v", "op", "from", "kind"))
            prep = wire.decode_with(mx.prepare_from_wire, f.map("prep", required=True))
            f.done()
            return self._on_prepare(prep, sender)
        if kind == "state":
            await self._on_state(req, sender, stream)
            return None
        f = wire.Fields(req, "migrate", ignore=("v", "op", "from", "kind"))
        tid = f.task_id("id", required=True)
        if kind == "abort":
            mid = f.str("mid", required=True, max_len=300)
            f.done()
            inc = self.incoming.get(tid)
            if inc is not None and inc.mid == mid and inc.source == sender:
                del self.incoming[tid]
                if not self._task_here(tid):
                    self._drop_staged(tid)
            return {"ok": True}
        if kind == "record":
            rec = mx.check_record(f.map("rec", required=True))
            f.done()
            if not isinstance(rec.get("mid"), str):
                raise wire.SchemaError("migrate record: missing mid")
            try:
                t = await self.coord.table.get(tid)
            except UnknownTask:
                return {"ok": False, "reason": "unknown task"}
            if t.spec.home not in ("", self.node):
                return {"ok": False, "reason": "not this task's home"}
            self._store_record(tid, rec)
            return {"ok": True}
        if kind == "records":
            f.done()
            return {"records": await self.records_of(tid)}
        if kind == "started":
            mid = f.str("mid", required=True, max_len=300)
            f.done()
            kept = self.retained.get(tid)
            if kept is not None and kept[0] == mid:
                self._release(tid)
            return {"ok": True}
        raise wire.SchemaError(f"migrate: unknown kind {kind!r}")

    def _on_prepare(self, p: mx.Prepare, sender: m.NodeId) -> dict[str, Any]:
        tid = p.spec.id

        def refuse(why: str) -> dict[str, Any]:
            self.counters["prepare_refused"] += 1
            self.log.info("migration.refused", task=tid, source=sender, reason=why)
            return {"ok": False, "reason": why}

        if self.s.mode == "off":
            return refuse(f"migration is off on {self.node}")
        inc = self.incoming.get(tid)
        if inc is not None:
            if inc.mid == p.mid and inc.source == sender:
                return {"ok": True}  # a retry of the same question
            return refuse("another migration of this task is in flight here")
        if tid in self.outgoing or self._task_here(tid):
            return refuse("the task is already here")
        why = self.coord.admission_refusal(p.spec)
        if why is not None:
            return refuse(why)
        task = attrs.evolve(p.task, gpu=p.spec.gpu)
        why = pol.recheck_at_target(
            task,
            p.source,
            self.coord.local_report(),
            config=self.s.policy,
            bandwidth=p.bandwidth,
            incoming=len(self.incoming) + len(self.outgoing),
        )
        if why is not None:
            return refuse(why)
        self.incoming[tid] = Incoming(p.mid, sender, p.spec, self.clock.now())
        self.log.info("migration.prepared", task=tid, source=sender, mid=p.mid)
        return {"ok": True}

    async def _on_state(self, req: dict[str, Any], sender: m.NodeId, stream: FramedStream) -> None:
        f = wire.Fields(req, "migrate state", ignore=("v", "op", "from", "kind"))
        begin = wire.decode_with(mx.begin_from_wire, f.map("begin", required=True))
        f.done()
        tid = begin.task_id
        inc = self.incoming.get(tid)
        if inc is None or inc.mid != begin.mid or inc.source != sender:
            await stream.send({"ok": False, "reason": "no prepared migration of this task here"})
            return
        root = self.coord.runner.task_state_root
        staging = root / INCOMING_DIR / f"{tid}.{secrets.token_hex(4)}"
        t0 = self.clock.now()
        self.log.info("migration.receiving", task=tid, source=sender, bytes=begin.total)
        writer = _Writer(staging)
        send_ch, recv_ch = trio.open_memory_channel[mx.Action](8)

        async def write_all() -> None:  # writing overlaps receiving the next frames
            async with recv_ch:
                async for a in recv_ch:
                    await writer.apply(a)

        try:
            await trio.to_thread.run_sync(lambda: staging.mkdir(parents=True))
            free = (await trio.to_thread.run_sync(shutil.disk_usage, root)).free
            rx = mx.StateReceiver(begin, max_bytes=max(0, free - DISK_RESERVE))
            async with collapse_single_group(), trio.open_nursery() as nursery:
                nursery.start_soon(write_all)
                async with send_ch:
                    while not rx.done:
                        obj = await stream.receive(timeout=STREAM_TIMEOUT)
                        for a in rx.feed(wire.decode_with(mx.frame_from_wire, obj)):
                            await send_ch.send(a)
            writer.close()
            t_install = self.clock.now()
            final = self.coord.runner.state_dir_of(tid)
            owner = self.owner_of(inc.spec)
            await trio.to_thread.run_sync(install_state, staging, final, owner)
        except BaseException as e:
            writer.close()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(remove_tree, staging)
            if not isinstance(e, (wire.WireError, TransportError, OSError)):
                raise
            self.counters["streams_failed"] += 1
            self.log.warning("migration.receive_failed", task=tid, source=sender, error=str(e))
            if not isinstance(e, TransportError):
                try:
                    await stream.send({"ok": False, "reason": str(e)[:500]}, timeout=5.0)
                except TransportError:
                    pass
            return
        inc.staged = True
        inc.since = self.clock.now()
        secs = self.clock.now() - t0
        self.arrivals[tid] = Arrival(
            mid=begin.mid,
            source=sender,
            mode=begin.mode,
            moves=begin.moves,
            age=begin.age,
            stopped_at=begin.stopped_at,
            arrived_at=self.clock.wall(),
            files=dict(begin.files),
        )
        self._journal_arrival(tid)
        self.counters["bytes_received"] += rx.bytes
        self.log.info(
            "migration.received",
            task=tid,
            source=sender,
            bytes=rx.bytes,
            secs=round(secs, 4),
            install_s=round(self.clock.now() - t_install, 4),
        )
        await stream.send({"ok": True, "bytes": rx.bytes, "seconds": secs}, timeout=10.0)
