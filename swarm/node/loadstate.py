"""What this node says about its load, and what it may take: the local load report,
Flex admission with fresh usage, the view of peers' reports and the run queue as
transfer sees it (pure; the runtime's sampler feeds measurements in).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import limits as lim
from .. import model as m
from ..cluster import handoff as h
from ..policy import gpu as gpupol
from ..policy import load as loadpol
from ..policy import placement as pl
from ..policy import shares as sh
from ..policy import transfer as tr
from ..policy.view import LoadView
from . import decide
from .moves import keeps_state, never_moves
from .records import TaskRecords

S = m.TaskState
REFRESH_MIN = 0.25  # seconds the report's share and work figures are kept, at least
REFRESH_TASKS = 1000  # ... for up to this many tasks read, then longer in proportion
REFRESH_MAX = 2.0  # ... but never longer than this
QUEUE_VIEWS_SLACK = 1024  # stale queue_view entries tolerated before a rebuild


class LoadState:
    """The load side of NodeState (state.py), which holds the fields below."""

    node: m.NodeId
    records: TaskRecords
    ledger: sh.ShareLedger
    gpus: gpupol.GpuAllocator
    view: LoadView
    queued: Any
    arrived: dict[m.TaskId, float]
    slots: int
    isolation: str
    criu: bool
    sample: loadpol.HostSample
    flex_cfg: loadpol.FlexConfig
    flex: loadpol.FlexState
    peak: loadpol.PeakEstimator
    version: int
    queue_views: dict[m.TaskId, tuple[m.Task, tr.QueuedTask]]  # queue_view's, per task
    state_here: set[m.TaskId]
    admission_hook: Callable[[m.TaskSpec], str | None] | None
    share_cache: tuple[float, dict[str, Any]] | None
    work_cache: tuple[float, dict[str, float | int]] | None
    running: Any
    labels: tuple[tuple[str, str], ...]
    label_map: dict[str, str]
    data_digest: bytes
    breaks: frozenset[str]

    if TYPE_CHECKING:  # provided by the other parts of NodeState

        def share_fields(self, wall: float) -> dict[str, Any]:
            raise NotImplementedError

        def gang_held(self) -> int:
            raise NotImplementedError

        @property
        def guest(self) -> h.GuestSide:
            raise NotImplementedError

    def state_held(self, t: m.Task) -> bool:
        """Is a queued task's checkpoint (or CRIU image) here? Then it restarts here:
        placement and transfer move tasks, not their state. The runtime tells the state
        when that changes (note_state); no decision reads the disk."""
        return keeps_state(t.spec) and t.id in self.state_here

    def note_state(self, tid: m.TaskId, present: bool) -> None:
        """The runtime looked: a task's state directory is here (or is gone)."""
        if present:
            self.state_here.add(tid)
        else:
            self.state_here.discard(tid)

    def local_report(self, wall: float) -> m.LoadReport:
        snap = self.ledger.snapshot()
        s = self.sample
        self.version = max(self.version + 1, int(wall * 1000))
        return m.LoadReport(
            node=self.node,
            version=self.version,
            shares=snap.shares,
            reserved_shares=snap.reserved_shares,
            weight_sum=snap.weight_sum + self.gang_held(),
            queued=snap.queued,
            running=snap.running + self.gang_held(),  # held for a gang: taken
            slots=self.slots,
            cpu_util=s.cpu_util,
            load_per_core=s.load_per_core,
            mem_available=s.mem_available,
            mem_total=s.mem_total,
            psi_cpu=s.psi_cpu,
            psi_mem=s.psi_mem,
            cpus=s.cpus,
            isolation=self.isolation,
            criu=self.criu,
            gpus=self.gpus.summary(),
            labels=self.labels,
            data=self.data_digest,
            **self.shared_fields(wall),
        )

    def shared_fields(self, wall: float) -> dict[str, Any]:
        """The report's bands, groups and usage (runqueue.py) and its work figures
        (work_fields), refreshed at most every quarter second (placement builds a local
        report per task, and these read the whole queue or every running task), and at
        once after a start or an end here (`share_cache = None`: a capped group's
        running count must not wait). The work figures keep their quarter second even
        then: nothing waits on them, and they read every record (during an array
        burst of 10,000 elements, recounting them at each start and end took ~4 % of
        the home's loop; issue 23). With thousands of tasks the quarter second grows
        in proportion (refresh_period): the figures move slowly against their size,
        and a home holding an array's 10,000 records spent ~12 % of its loop here."""
        c = self.share_cache
        if c is None or not 0 <= wall - c[0] < refresh_period(len(self.queued) + len(self.running)):
            c = self.share_cache = (wall, self.share_fields(wall))
        w = self.work_cache
        if w is None or not 0 <= wall - w[0] < refresh_period(len(self.records.active)):
            w = self.work_cache = (wall, self.work_fields(wall))
        return {**c[1], **w[1]}

    def work_fields(self, wall: float) -> dict[str, float | int]:
        """The report's task_seconds and unmovable_seconds (issue 25): how long each
        task RUNNING here has run so far, summed, and the longest of those that cannot
        migrate off this node (moves.never_moves). A record's start is the wall clock
        (no monotonic start is kept in the state), so a clock stepped back counts 0,
        never a negative run."""
        total = unmovable = 0.0
        for tid in self.running:
            t = self.records.active.get(tid)
            if t is None or t.state is not S.RUNNING:
                continue
            ran = max(0.0, wall - (t.started_at if t.started_at is not None else wall))
            total += ran
            if ran > unmovable and never_moves(t.spec, self.criu):
                unmovable = ran
        cap = lim.MAX_REPORT_SECONDS
        # unfinished tasks homed here (global tasks have no home to lose)
        homing = sum(
            1
            for t in self.records.active.values()
            if t.spec.home in ("", self.node) and not t.spec.is_global and not t.state.terminal
        )
        return {
            "task_seconds": min(total, cap),
            "unmovable_seconds": min(unmovable, cap),
            "homing": homing,
        }

    def on_sample(self, sample: loadpol.HostSample, now: float) -> None:
        """A fresh host measurement: peak usage and Flex's over-commit factor follow."""
        self.sample = sample
        self.peak = self.peak.update(
            now, loadpol.Usage(cpu=sample.cpu_used_cores, mem=sample.mem_used)
        )
        ok = loadpol.qos_holds(sample.psi_cpu, sample.psi_mem, self.flex_cfg)
        self.flex = loadpol.flex_update(self.flex, self.flex_cfg, ok)

    def usage(self) -> tuple[loadpol.Usage, loadpol.Capacity]:
        s = self.sample
        return self.peak.estimate, loadpol.Capacity(cpu=s.cpus, mem=s.mem_total)

    @property
    def admission_labels(self) -> dict[str, str] | None:
        """The labels admission tests hard constraints on (None: not tested, only under
        the chaos self-test's switch)."""
        return None if "ignore-constraints" in self.breaks else self.label_map

    def admit_here(self, spec: m.TaskSpec) -> pl.Admission:
        """Admission with this node's fresh state (placement used gossip-age data),
        after the runtime's own check (the user exists here, the working directory
        too)."""
        if self.admission_hook is not None and spec.id not in self.ledger:
            why = self.admission_hook(spec)
            if why:
                return pl.Admission(False, why)
        usage, cap = self.usage()
        return pl.admit(
            spec,
            self.ledger,
            self.flex,
            usage,
            cap,
            gpus=self.gpus.summary(),
            labels=self.admission_labels,
        )

    def admission_refusal(self, spec: m.TaskSpec) -> str | None:
        """Why this node would not take an offered task now (None: it would)."""
        own = self.records.get_cached(spec.id)
        if (
            own is not None
            and not own.state.terminal
            and own.spec.home == self.node != spec.home
            and not spec.is_global
        ):
            # we are an old home of it, back before the adopter's notice made us yield
            # (chaos home-loss, seed 1018: its run here and the guest entry shared one
            # record, and the result never reached the new home)
            return f"an older claim of {spec.id} is still here (its home before {spec.home})"
        usage, cap = self.usage()
        return decide.admission_refusal(
            spec,
            self.ledger,
            self.flex,
            usage,
            cap,
            gpus=self.gpus.summary(),
            hook=self.admission_hook,
            labels=self.admission_labels,
        )

    def queue_view(self, now: float) -> list[tr.QueuedTask]:
        """Queued (not started) tasks in the local run queue, as transfer sees them.

        Transfer rounds, peers' probes and load reports each read the whole queue, so
        with thousands queued this ran several times a second at ~2.5 us a task (a
        runner with 4,000 queued spent ~25 ms/s here, idle; issue 23). A task's entry
        is kept (`queue_views`) and reused while its record is the same object and
        its arrival, pin and fair-share rank are unchanged: every input is still read
        per task, only the entry's construction is saved."""
        out: list[tr.QueuedTask] = []
        users: dict[tuple[int, str | None, int | None], int] = {}  # in order of first place
        active = self.records.active
        arrived_at = self.arrived
        may_run = self.guest.may_run
        cache = self.queue_views
        node = self.node
        for tid in self.queued:
            t = active.get(tid)
            if t is None or t.state is not S.QUEUED:
                continue
            spec = t.spec
            # the queue is in start order (class, fair share, arrival: runqueue.py), so
            # the order in which users first appear in a class is their fair-share rank
            user = users.setdefault((spec.priority, spec.user, spec.uid), len(users))
            # pinned: global, not (or no longer) ours to give, or its checkpoint is
            # here, not there
            pinned = (
                spec.is_global or (spec.home != node and not may_run(tid)) or self.state_held(t)
            )
            arrived = arrived_at.get(tid, now)
            c = cache.get(tid)
            if c is not None and c[0] is t:
                q = c[1]
                if q.arrived_at == arrived and q.pinned is pinned and q.rank[1] == user:
                    out.append(q)
                    continue
            q = tr.QueuedTask(
                tid, pl.Needs.of(spec), spec.submitted_at, arrived, pinned, (-spec.priority, user)
            )
            cache[tid] = (t, q)
            out.append(q)
        if len(cache) > 2 * len(out) + QUEUE_VIEWS_SLACK:  # entries of tasks gone
            self.queue_views = {q.id: cache[q.id] for q in out}
        return out


def refresh_period(tasks: int) -> float:
    """How long the report's share and work figures are kept, read over `tasks`
    tasks: a quarter second up to REFRESH_TASKS of them, then in proportion (each
    refresh costs ~1 us a task), up to REFRESH_MAX."""
    return min(REFRESH_MAX, REFRESH_MIN * max(1.0, tasks / REFRESH_TASKS))


def changed_meaningfully(old: m.LoadReport, new: m.LoadReport) -> bool:
    """Worth a new gossip version now? Task counts, shares and GPU room always are;
    measured usage only when it moved noticeably (sampling noise is not news, and at
    rest every agent would otherwise gossip a new report every second). The work
    figures (task_seconds, unmovable_seconds) never are by themselves: they grow every
    second while tasks run, and a reader ages them from the report's version; a start
    or an end here, which changes them otherwise, changes `running` too."""
    if (
        old.shares != new.shares
        or old.reserved_shares != new.reserved_shares
        or old.weight_sum != new.weight_sum
        or old.queued != new.queued
        or old.running != new.running
        or old.slots != new.slots
        or old.gpus != new.gpus
        or old.isolation != new.isolation
        or old.criu != new.criu
        or old.bands != new.bands
        or old.groups != new.groups
        or old.homing != new.homing
    ):
        return True
    if usage_moved(old.usage, new.usage):
        return True
    if abs(old.cpu_util - new.cpu_util) > 0.1 or abs(old.load_per_core - new.load_per_core) > 0.1:
        return True
    if abs(old.psi_cpu - new.psi_cpu) > 5.0 or abs(old.psi_mem - new.psi_mem) > 5.0:
        return True
    total = max(new.mem_total, 1)
    return abs(old.mem_available - new.mem_available) / total > 0.05


def usage_moved(
    old: tuple[tuple[str, float, float, float, float], ...],
    new: tuple[tuple[str, float, float, float, float], ...],
) -> bool:
    """Fair-share usage worth gossiping: a principal came or went, or one's
    slot-seconds moved by more than 10 % (usage grows while tasks run: every change
    would be a new report a second)."""
    if len(old) != len(new):
        return True
    for a, b in zip(old, new, strict=True):
        if a[0] != b[0] or abs(a[1] - b[1]) > 0.1 * max(a[1], b[1], 1.0):
            return True
    return False


def unmeasured() -> loadpol.HostSample:
    """The sample of a node not measured yet (tests, the simulator): idle, no PSI."""
    return loadpol.HostSample(
        cpu_util=0.0,
        load_per_core=0.0,
        cpus=1.0,
        mem_available=1 << 30,
        mem_total=1 << 30,
        psi_cpu=0.0,
        psi_mem=0.0,
        cpu_used_cores=0.0,
        mem_used=0,
    )
