"""One chaos run: start the cluster, run the workload while the nemesis injects and heals
faults, heal everything, wait for the work to settle, stop the agents and check the
invariants against their journals, logs and CLI answers.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from swarm.client import ClientError
from swarm.cluster.gang import Timers
from swarm.cluster.succession import REPLICA_WAIT
from swarm.node.failover import UNHEARD_AFTER

from . import elastic as el
from . import faults as fl
from . import invariants as inv
from .cluster import ChaosCluster, label_args
from .journals import JournalData, JournalMissing, read_journal
from .schedule import (
    BACKUP_BUDGET,
    BACKUP_HISTORY,
    FaultPlan,
    Plan,
    Scenario,
    down_only,
    home_grace,
    make_plan,
    node_labels,
    restarts_only,
)
from .workload import Workload, read_executions, read_marks, read_spans

TMPFS_MB = 24
ANY = "*"  # settle: a task whose home is lost for good may end at any node (its adopter)
SUSPECT_EVENTS = ("member.suspect", "member.dead")
DISK_ERRORS = ("journal.write_failed", "journal.sync_failed", "globals.journal_failed")


@attrs.define
class FaultRecord:
    fault: str
    kind: str
    start: float  # seconds from the run's start
    hold: float
    detect_s: float | None = None
    converge_s: float | None = None
    note: str = ""


@attrs.define
class ScenarioResult:
    name: str
    seed: int
    mode: str
    nodes: int
    description: str = ""
    wall_s: float = 0.0
    attempted: int = 0
    acked: int = 0
    acked_by_kind: dict[str, int] = attrs.field(factory=dict)
    refused: dict[str, int] = attrs.field(factory=dict)
    states: dict[str, int] = attrs.field(factory=dict)
    completed: int = 0
    lost: int = 0
    lost_ids: list[str] = attrs.field(factory=list)
    dup_exec: int = 0
    dup_starts: int = 0
    faults: list[FaultRecord] = attrs.field(factory=list)
    final_converge_s: float | None = None
    settle_s: float | None = None
    handoffs: int = 0
    transfers: int = 0
    preemptions: int = 0  # `preempted by` transitions in the executors' journals
    drains: int = 0
    violations: list[str] = attrs.field(factory=list)
    violated: list[str] = attrs.field(factory=list)
    notes: list[str] = attrs.field(factory=list)
    error: str = ""
    # the elastic scenario's figures: hook calls, removals, peaks per sides in force
    scale: dict[str, Any] = attrs.field(factory=dict)

    @property
    def passed(self) -> bool:
        return not self.violations and not self.error

    def to_json(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["passed"] = self.passed
        return d

    @property
    def detect_summary(self) -> str:
        return _summary([f.detect_s for f in self.faults if f.detect_s is not None])

    @property
    def converge_summary(self) -> str:
        return _summary([f.converge_s for f in self.faults if f.converge_s is not None])


def _summary(xs: Sequence[float]) -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.1f}"
    return f"{statistics.median(xs):.1f} / {max(xs):.1f}"


def write_cluster_key(path: Path) -> Path:
    """A new cluster key file, created 0600 by the harness (root in namespace mode:
    owned by root, as a root agent demands) and never readable by anyone else."""
    from swarm.crypto import keygen_file_text

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(keygen_file_text())
    os.chmod(path, 0o600)  # whatever the umask
    return path


def _fault_of(fp: FaultPlan) -> fl.Fault:
    cls = fl.KINDS[fp.kind]
    return cls(targets=fp.targets)


class Runner:
    """Executes one scenario; `run()` never raises for a failing cluster, it reports."""

    def __init__(
        self,
        sc: Scenario,
        seed: int,
        root: Path,
        *,
        run_id: str,
        mode: str,
        env: Mapping[str, str] | None = None,
        code: Path | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.sc = sc
        self.code = code
        self.seed = seed
        self.root = root
        self.run_id = run_id
        self.mode = mode
        self.env = dict(env) if env is not None else None
        self.log = log
        available = [
            k
            for k, c in fl.KINDS.items()
            if (mode == "netns" or not c.needs_netns) and (mode == "netns" or not c.needs_tmpfs)
        ]
        self.plan: Plan = make_plan(sc, seed, available)
        self.elastic = el.ElasticSpec() if sc.elastic else None
        self.scale_files: el.ElasticFiles | None = None
        skipped = sorted({*sc.faults, *sc.faults2} - set(available))
        self.result = ScenarioResult(sc.name, seed, mode, sc.nodes, sc.description)
        if skipped:
            self.result.notes.append(
                f"loopback mode: fault kinds {', '.join(skipped)} need the namespace LAN "
                "(root) and were left out"
            )

    # ------------------------------------------------------------------ run

    def run(self) -> ScenarioResult:
        t_start = time.monotonic()
        sc = self.sc
        tmpfs = {1: TMPFS_MB} if sc.tmpfs_node and self.mode == "netns" else None
        keyring = write_cluster_key(self.root / "cluster.key") if sc.encrypted else None
        if keyring is not None:
            self.result.notes.append(
                "encrypted: every agent uses one generated cluster key (mode 0600, "
                f"owner uid {os.getuid()}), no --insecure"
            )
        args = ["--slots", str(sc.slots), "--shares", "1024"]
        if sc.home_grace is not None:
            args += ["--home-grace", str(sc.home_grace)]
        if sc.keep_tasks is not None:
            args += ["--keep-tasks", sc.keep_tasks]
        if sc.late_binding:
            args += ["--late-binding", str(sc.late_binding)]
        if sc.backups:
            args += ["--backup-history", str(BACKUP_HISTORY), "--backup-budget", str(BACKUP_BUDGET)]
        if sc.profile is not None:  # after the base flags: it overrides `local`
            args += ["--profile", sc.profile]
        if self.elastic is not None:
            self.scale_files = el.write_files(self.root, self.elastic)
            args += ["--config", str(self.scale_files.config)]
        cl = ChaosCluster(
            sc.nodes,
            self.root,
            run_id=self.run_id,
            mode=self.mode,
            # 1024 shares a node, as when the scenarios were tuned (the default is now
            # 1024 a slot): reservations of 200-600 shares then contend for a node
            args=args,
            per_node_args=label_args(node_labels(sc)),
            env=self.env,
            shim=sc.shim,
            tmpfs_nodes=tmpfs,
            code=self.code,
            keyring=keyring,
            log=self.log,
        )
        try:
            with cl:
                first = cl.wait_agree(60)
                if first is None:
                    self.result.notes.append("membership did not agree before the workload")
                self._exercise(cl)
                self._collect(cl)
        except Exception as e:
            self.result.error = f"{type(e).__name__}: {e}"
            self.log(f"{sc.name}: harness error: {self.result.error}")
        self.result.wall_s = round(time.monotonic() - t_start, 1)
        return self.result

    def _exercise(self, cl: ChaosCluster) -> None:
        sc, plan = self.sc, self.plan
        self.t0 = time.time()
        self.wl = Workload(cl, self.root / "marks", self.t0, log=self.log)
        threads = [
            threading.Thread(target=self.wl.submit_all, args=(list(plan.submits),), daemon=True),
            threading.Thread(target=self.wl.drain_all, args=(list(plan.drains),), daemon=True),
        ]
        for t in threads:
            t.start()
        self.records: list[tuple[fl.Fault, FaultRecord]] = []
        self.last_heal = time.time()  # start of the last heal
        self.last_heal_converge: float | None = None  # measured right after it, if it was
        try:
            self._nemesis(cl)
        finally:
            if self._heal_everything(cl):
                self.last_heal, self.last_heal_converge = time.time(), None
            for t in threads:
                t.join(timeout=max(5.0, sc.duration + 30 - (time.time() - self.t0)))
            self.wl.stop()
        if self.elastic is None:
            self.wl.ensure_undrained()
        # (elastic: every drain is the pool's own, and a node its scale-in removed
        # stays drained, as it would stay gone: undraining it would hand the pool a
        # node to remove again)
        # the membership invariant: all views agree within the bound after the last heal
        # (from the heal's start; measured right after it when it was, else an upper
        # bound: the first agreement seen once the workload ended)
        waited = cl.wait_agree(max(1.0, sc.converge_bound - (time.time() - self.last_heal)))
        if waited is None:
            self.result.final_converge_s = None
        elif self.last_heal_converge is not None:
            self.result.final_converge_s = self.last_heal_converge
        else:
            self.result.final_converge_s = round(time.time() - self.last_heal, 2)
        self.log(f"{sc.name}: views agree {self.result.final_converge_s}s after the last heal")
        last_heal = time.monotonic()
        if self.wl.attempted and len(self.wl.acked) < self.wl.attempted / 2:
            # a run whose work was mostly refused proves nothing: fail it loudly
            raise RuntimeError(
                f"only {len(self.wl.acked)} of {self.wl.attempted} submissions acknowledged: "
                f"{dict(self.wl.refused)}"
            )
        self.result.settle_s = self._settle(cl)
        self.result.notes.append(f"settled {time.monotonic() - last_heal:.1f}s after last heal")

    def _nemesis(self, cl: ChaosCluster) -> None:
        events: list[tuple[float, int, str, fl.Fault, FaultPlan]] = []
        for k, fp in enumerate(self.plan.faults):
            f = _fault_of(fp)
            events.append((fp.start, k, "start", f, fp))
            events.append((fp.end, k, "heal", f, fp))
        events.sort(key=lambda e: (e[0], e[2] == "start"))
        active: set[int] = set()
        lag = 0.0  # how late the nemesis runs (slow restarts): later events shift with it
        for idx, (at, k, what, f, _fp) in enumerate(events):
            self._wait_until(at + lag)
            now = time.time()
            lag = max(lag, now - (self.t0 + at) - 0.5)
            if what == "start":
                try:
                    f.start(cl)
                    f.started_at = now
                    active.add(k)
                    rec = FaultRecord(f.describe(), f.kind, round(now - self.t0, 1), 0.0)
                    self.records.append((f, rec))
                    self.log(f"{self.sc.name}: +{now - self.t0:5.1f}s start {f.describe()}")
                except Exception as e:
                    f.error = f"start failed: {e}"
                    self.result.notes.append(f"{f.describe()}: {f.error}")
                    self.log(f"{self.sc.name}: {f.describe()}: {f.error}")
                continue
            if k not in active:
                continue
            heal_began = self.last_heal = time.time()
            self.last_heal_converge = None
            try:
                f.heal(cl)
            except Exception as e:
                f.error = f"heal failed: {e}"
                self.result.notes.append(f"{f.describe()}: {f.error}")
            f.healed_at = time.time()
            active.discard(k)
            self.log(f"{self.sc.name}: +{f.healed_at - self.t0:5.1f}s heal {f.describe()}")
            rec = next(r for ff, r in self.records if ff is f)
            assert f.started_at is not None
            rec.hold = round(f.healed_at - f.started_at, 1)
            if active:
                rec.note = "healed while another fault was active"
                continue
            nxt = next((e[0] for e in events[idx + 1 :] if e[2] == "start"), None)
            limit = 45.0 if nxt is None else max(0.0, self.t0 + nxt + lag - time.time())
            rec.converge_s = self._converge(cl, heal_began, limit)
            self.last_heal_converge = rec.converge_s
            if rec.converge_s is None:
                rec.note = f"views did not agree within {limit:.0f}s (next fault)"

    def _converge(self, cl: ChaosCluster, since: float, limit: float) -> float | None:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if cl.agree():
                return round(time.time() - since, 2)
            time.sleep(0.5)
        return None

    def _wait_until(self, offset: float) -> None:
        delay = self.t0 + offset - time.time()
        if delay > 0:
            time.sleep(delay)

    def _heal_everything(self, cl: ChaosCluster) -> bool:
        """Heal whatever is still broken (after an error, or a fault the plan left
        active); True if anything was."""
        healed = False
        for f, _ in reversed(self.records):
            if f.healed_at is None and f.started_at is not None:
                healed = True
                try:
                    f.heal(cl)
                except Exception as e:
                    self.result.notes.append(f"{f.describe()}: final heal failed: {e}")
                f.healed_at = time.time()
        if cl.lan is not None:
            cl.lan.heal_all()
        for a in cl.kept():
            if a.paused:
                healed = True
                a.resume()
            if not a.alive():
                healed = True
                a.start()
                a.wait_ready()
        return healed

    def _settle(self, cl: ChaosCluster) -> float | None:
        """Wait until every acknowledged task is terminal where the checks will look;
        the checks themselves read the journals afterwards."""
        t0 = time.monotonic()
        lost = {a.name for a in cl.agents if a.lost}
        # a task whose home is lost for good: terminal at any node (its adopter)
        pending = {
            (a.id, ANY if a.home in lost else a.home) for a in self.wl.acked if not a.is_global
        }
        pending |= {(a.id, n.name) for a in self.wl.acked if a.is_global for n in cl.kept()}
        globals_ = {a.id for a in self.wl.acked if a.is_global}  # each node's own run
        unknown: dict[tuple[str, str], int] = {}
        # A task of a lost home may be known to no agent for a while: its copy is a
        # replica (not a task record) until a node adopts it, and a replica holder that
        # was down when the home died hears of that death only UNHEARD_AFTER after it
        # rejoins, then waits REPLICA_WAIT graces (home-loss at seed 1018: adopted 0.5 s
        # after the harness gave up on it as lost)
        grace = home_grace(self.sc)
        adoption = int(UNHEARD_AFTER + REPLICA_WAIT * grace) + 5
        patience = {p: 10 + (adoption if p[1] == ANY else 0) for p in pending}
        while time.monotonic() - t0 < self.sc.settle:
            dead = [a.name for a in cl.agents if a.died()]
            if dead:
                self.log(f"{self.sc.name}: agents {dead} died on their own; not waiting")
                return None
            done: set[tuple[str, str]] = set()
            known: set[tuple[str, str]] = set()
            for a in cl.agents:
                try:
                    with a.client(timeout=10) as c:
                        tasks = c.list(all=True, limit=100_000)
                except (ClientError, OSError):
                    continue
                for t in tasks:
                    known |= {(t["spec"]["id"], a.name), (t["spec"]["id"], ANY)}
                    if t["state"] in inv.TERMINAL:
                        done |= {(t["spec"]["id"], a.name), (t["spec"]["id"], ANY)}
            pending -= done
            # a task its home let go (adopted while the home was down, node/doubt.py):
            # the home forgot it, and its adopter's record is the one that ends (chaos
            # home-back, seeds 1030 and 1034: waited on at the old home, taken for lost
            # after 10 polls while it ran at the adopter's runner)
            pending = {
                p for p in pending if p in known or p[0] in globals_ or (p[0], ANY) not in done
            }
            if not pending:
                return round(time.monotonic() - t0, 1)
            for p in pending - known:
                if p[0] in globals_ or (p[0], ANY) not in known:  # elsewhere: waited for
                    unknown[p] = unknown.get(p, 0) + 1
            # a task its node has never heard of after ~10 polls will not turn up: it is
            # lost (or, for a global task, never reached that node); the checks say which
            if all(unknown.get(p, 0) >= patience.get(p, 10) for p in pending):
                break
            time.sleep(1.0)
        self.log(f"{self.sc.name}: {len(pending)} tasks not terminal after {self.sc.settle}s")
        return None

    # -------------------------------------------------------------- evidence

    def _collect(self, cl: ChaosCluster) -> None:
        res = self.result
        # every agent runs again after the heal, but those lost for good
        expected = [a.name for a in cl.kept()]
        views = self._views(cl)
        for look in (2, 3):
            # a Lifeguard suspicion refuted within milliseconds (CPU load) can fall on
            # the one look (chaos shim, 5574498: n4 suspect for 41 ms at n2): look
            # again, twice, 1 s apart, as an operator would; a view that stays split
            # still fails
            if not inv.check_membership(views, expected, 0.0):
                break
            time.sleep(1.0)
            views = self._views(cl)
            res.notes.append(f"membership: the views were looked at {look} times at the end")
        infos = {a.name: cl.info(a) for a in cl.agents}
        shares_now = {n: int(i["shares"]) for n, i in infos.items() if i is not None}
        res.transfers = sum(
            int(i["coordinator"].get("transfers_pushed", 0))
            + int(i["coordinator"].get("transfers_stolen", 0))
            for i in infos.values()
            if i is not None
        )
        settled_wall = time.time() - 3.0  # ends before this had a tick to tell copies
        answers = self._status_everywhere(cl)
        lost = frozenset(a.name for a in cl.agents if a.lost)
        stop_codes: dict[str, int | None] = {}
        cl.stop_all(timeout=20)
        for a in cl.agents:
            stop_codes[a.name] = a.exits[-1].code if a.exits else None
        journals: dict[str, JournalData] = {}
        violations: list[inv.Violation] = []
        for a in cl.agents:
            try:
                journals[a.name] = read_journal(a.name, a.state_dir / "journal.db")
            except JournalMissing as e:
                violations.append(inv.Violation(inv.INTEGRITY, a.name, str(e)))
        marks = read_marks(self.root / "marks")
        acked = list(self.wl.acked)
        outcome = inv.check_acked(acked, journals, lost)
        violations += outcome.violations
        specs = inv.specs_of(journals)
        violations += inv.check_executed(acked, journals, marks)
        violations += inv.check_drain(journals, specs)
        violations += inv.check_reservations(journals, specs, shares_now)
        violations += inv.check_membership(views, expected, res.final_converge_s)
        violations += inv.check_integrity(journals)
        disk_nodes = {
            f"n{i}" for f, _ in self.records if isinstance(f, fl.DiskFull) for i in f.targets
        }
        for a in cl.agents:
            allowed = DISK_ERRORS if a.name in disk_nodes else ()
            violations += inv.check_log(a.name, a.log_text(), allowed)
            if self.sc.encrypted:
                info = infos.get(a.name)
                transport = info.get("transport") if info is not None else None
                violations += inv.check_encrypted(a.name, a.log_text(), transport)
            exits = [(x.at, x.code, x.expected) for x in a.exits]
            violations += inv.check_exits(a.name, exits)
            if stop_codes[a.name] not in (0, None) and not a.lost:
                violations.append(
                    inv.Violation(
                        inv.NO_CRASH, a.name, f"exit code {stop_codes[a.name]} on SIGTERM"
                    )
                )
        if self.sc.encrypted:
            drops = {
                k: sum(
                    int((i or {}).get("transport", {}).get(f"dropped_{k}", 0))
                    for i in infos.values()
                )
                for k in ("decrypt", "mode", "replay", "stale")
            }
            res.notes.append(
                "encrypted: frames dropped at the end (agents' transport counters, since "
                "their last start): " + ", ".join(f"{k} {n}" for k, n in drops.items())
            )
        if self.sc.priorities:
            violations += self._priority_checks(cl, journals, specs)
        violations += self._issue19_checks(cl, journals, acked, outcome.with_home)
        if self.sc.gangs:
            violations += self._gang_checks(journals, acked)
        if self.sc.groups:
            violations += self._group_checks(journals, acked)
        if self.sc.late_binding:
            violations += self._late_checks(cl, journals, specs)
        if self.sc.backups:
            violations += self._backup_checks(journals)
        # a task a lost home accepted with fewer copies than wanted (no replica
        # answered in time: `replica.short` in its log) may be known to no survivor
        short = {
            f.get("task", "")
            for a in cl.agents
            if a.lost
            for line in a.log_text().splitlines()
            if "event=replica.short" in line and (f := inv.logfmt(line))
        }
        violations += inv.check_visible(answers, [*outcome.with_home, *short])
        violations += inv.check_copies_released(journals, lost | disk_nodes, settled_wall)
        if self.sc.labels:
            labels = {f"n{i}": kv for i, kv in node_labels(self.sc).items()}
            co = inv.check_constraints(journals, labels, marks, acked)
            violations += co.violations
            res.notes.append(
                f"constraints: {co.tasks} tasks with constraints; their executions judged "
                f"against the labels each node was given: {co.starts} starts in the "
                f"executors' journals (and the homes' records), {co.marks} from their marks"
            )
        if self.elastic is not None:
            violations += self._elastic_checks(cl, journals)
        if self.sc.home_grace is not None:
            logs = [a.log_text() for a in cl.agents]
            adopted = sum(t.count("event=failover.adopted") for t in logs)
            yielded = sum(t.count("event=failover.yielded") for t in logs)
            res.notes.append(
                f"failover: {adopted} tasks adopted (a home dead for --home-grace "
                f"{self.sc.home_grace:g}s), {yielded} let go by a home that came back, "
                f"{outcome.states.get(inv.LOST_WITH_HOME, 0)} lost with a home lost for good "
                "(at that home, with no copy elsewhere)"
            )
        # figures
        res.attempted = self.wl.attempted
        res.acked = len(acked)
        res.acked_by_kind = dict(self.wl.kinds)
        res.refused = dict(self.wl.refused)
        res.states = dict(outcome.states)
        res.lost = len(outcome.lost)
        res.lost_ids = list(outcome.lost)[:20]
        res.completed = sum(v for k, v in outcome.states.items() if k in inv.TERMINAL)
        res.dup_exec = inv.duplicate_executions(acked, marks)
        starts = inv.starts_by_task(journals)
        res.dup_starts = sum(max(0, starts[a.id] - 1) for a in acked if not a.is_global)
        res.handoffs = sum(
            1
            for j in journals.values()
            for e in j.transitions
            if e.cause.startswith("handed off to")
        )
        res.drains = sum(len(j.shares) for j in journals.values())
        self._detection(cl)
        res.faults = [r for _, r in self.records]
        res.violations = [str(v) for v in violations[:200]]
        res.violated = sorted({v.invariant for v in violations})
        if len(violations) > 200:
            res.notes.append(f"{len(violations) - 200} more violations not listed")

    def _views(self, cl: ChaosCluster) -> dict[str, dict[str, str]]:
        """Each agent's `swarm nodes --json`: node -> member -> state."""
        views: dict[str, dict[str, str]] = {}
        for a in cl.agents:
            p = a.cli("nodes", "--json", timeout=30)
            if p.returncode == 0:
                try:
                    views[a.name] = {str(x["node"]): str(x["state"]) for x in json.loads(p.stdout)}
                except (ValueError, KeyError, TypeError):
                    pass
        return views

    def _status_everywhere(self, cl: ChaosCluster, sample: int = 30) -> dict[str, dict[str, str]]:
        """`swarm status` of a sample of the acknowledged tasks (every k-th) at every
        surviving node, before the agents stop: task id -> node -> state (or error)."""
        tasks = [a.id for a in self.wl.acked if not a.is_global]
        picked = tasks[:: max(1, len(tasks) // sample)]
        out: dict[str, dict[str, str]] = {}
        for tid in picked:
            for ag in cl.kept():
                for attempt in range(3):  # as a user would, after a lost reply
                    try:
                        with ag.client(timeout=10) as c:
                            state = str(c.call("status", id=tid)["task"]["state"])
                        break
                    except (ClientError, OSError, KeyError, TypeError) as e:
                        state = f"error: {type(e).__name__}: {e}"[:160]
                        time.sleep(0.5 * (attempt + 1))
                out.setdefault(tid, {})[ag.name] = state
        return out

    def _issue19_checks(
        self,
        cl: ChaosCluster,
        journals: Mapping[str, JournalData],
        acked: list[inv.Acked],
        with_home: Sequence[str],
    ) -> list[inv.Violation]:
        """Every scenario: --at-most-once tasks never overlap, every execution is in a
        journal, an obeyed cancel ends cancelled; restart scenarios: nothing ran twice."""
        res = self.result
        ids = {a.id for a in acked}
        execs = {t: rs for t, rs in read_executions(self.root / "marks").items() if t in ids}
        out, procs, again = inv.check_at_most_once(acked, read_spans(self.root / "marks"))
        amo = sum(1 for a in acked if a.at_most_once)
        windows = self._fault_windows(cl)
        if not self.sc.priorities:  # (its own checks did it)
            out += inv.check_recorded(execs, journals, windows, name=inv.UNRECORDED)
        cancels = dict(self.wl.cancels)
        out += inv.check_cancelled(cancels, acked, journals)
        if restarts_only(self.sc):
            out += inv.check_no_rerun(acked, execs)
        if down_only(self.sc):  # a node down, never cut off or frozen: node/doubt.py
            out += inv.check_old_home_waits(execs, journals, windows, home_grace(self.sc))
            copied, fc = inv.check_copies(acked, windows, [a.name for a in cl.agents])
            out += copied
            late, judged = inv.check_copied_late(
                acked, with_home, windows, [a.name for a in cl.agents]
            )
            out += late
            res.notes.append(
                f"copies: {fc['answers']} answers said how many copies, {fc['checked']} "
                f"while a peer of the home was surely up, {fc['copied']} of those copied; "
                f"{judged} lost with their home answered with none, judged by "
                f"`{inv.COPIED_LATE}`"
            )
        out += inv.check_reruns_recorded(acked, execs, journals)
        fenced = sum(
            1
            for j in journals.values()
            for e in j.transitions
            if e.dst == "lost" and e.cause.startswith("fenced")
        )
        moved = sum(1 for j in journals.values() for e in j.transitions if e.dst == "migrating")
        answered = Counter(cancels.values())
        res.notes.append(
            f"at-most-once: {amo} tasks, {procs} processes from their marks, {again} ran "
            f"again after a fence or loss (never at once: checked), {fenced} runs fenced; "
            f"{sum(len(r) for r in execs.values())} executions checked against the journals; "
            f"cancels answered: {dict(answered)}; {moved} moves to migrating"
        )
        return out

    def _gang_checks(
        self, journals: Mapping[str, JournalData], acked: list[inv.Acked]
    ) -> list[inv.Violation]:
        """Issue 22: no strict gang ran partly past its lease bound; a succeeded gang
        ran whole (its members' marks)."""
        bound = Timers().partial_bound()
        out, f = inv.check_gangs(acked, read_spans(self.root / "marks"), journals, bound)
        self.result.notes.append(
            f"gangs: {f['gangs']:.0f} gangs of 3 ({f['states']}); {f['starts']:.0f} starts, "
            f"{f['members']:.0f} members from their marks; members of one start began "
            f"within {f['spread_s']:.2f} s of each other at worst; the longest partial "
            f"run of a strict gang {f['worst_partial_s']:.1f} s (bound {bound:.2f} s + 1 s)"
        )
        return out

    def _group_checks(
        self, journals: Mapping[str, JournalData], acked: list[inv.Acked]
    ) -> list[inv.Violation]:
        """Issue 23: every array element once; no child before its parents."""
        out, fa = inv.check_arrays(acked, journals)
        more, fd = inv.check_dependencies(acked, journals)
        self.result.notes.append(
            f"arrays: {fa['arrays']} arrays, {fa['ended']} of {fa['elements']} elements "
            f"ended at their homes; dependencies: {fd['children']} tasks with --after, "
            f"{fd['started']} started (each after its parents, as asked), {fd['never']} "
            "never started (a condition that could not hold, or not yet)"
        )
        return out + more

    def _late_checks(
        self, cl: ChaosCluster, journals: Mapping[str, JournalData], specs: Mapping[str, Any]
    ) -> list[inv.Violation]:
        """Issue 24: a task held for late binding ran on one node, once."""
        acked = {a.id for a in self.wl.acked}
        execs = {t: rs for t, rs in read_executions(self.root / "marks").items() if t in acked}
        homes = {t: str(specs[t].home) for t in execs if t in specs}
        out, f = inv.check_late_binding(execs, journals, homes, self._fault_windows(cl))
        self.result.notes.append(
            f"late binding: {f['held']} tasks held at their homes; {f['pulled']} pulled by a "
            f"peer, {f['at_home']} ran at home, {f['never_ran']} never ran (cancelled or "
            f"lost); {f['reruns_explained']} re-runs, each after a kill or cut"
        )
        return out

    def _backup_checks(self, journals: Mapping[str, JournalData]) -> list[inv.Violation]:
        """Issue 24: backups only of --idempotent tasks, one each, each ended; a result
        taken from a backup is that backup's success."""
        out, f = inv.check_backups(journals)
        self.result.notes.append(
            f"backups: {self.wl.kinds['idempotent']} --idempotent tasks acknowledged;"
            f" {f['backups']} backups started, {f['won']} finished first (their original"
            f" stopped), {f['original_won']} stopped or failed as their original ended"
            f" first, {f['both_finished']} finished just after it"
        )
        return out

    def _fault_windows(self, cl: ChaosCluster) -> list[inv.FaultWindow]:
        names = frozenset(a.name for a in cl.agents)
        out = []
        for f, _ in self.records:
            if f.started_at is None:
                continue
            hit = names if isinstance(f, fl.Split) else frozenset(f"n{i}" for i in f.targets)
            end = f.healed_at if f.healed_at is not None else time.time()
            out.append(inv.FaultWindow(f.kind, hit, f.started_at, end))
        return out

    def _elastic_checks(
        self, cl: ChaosCluster, journals: Mapping[str, JournalData]
    ) -> list[inv.Violation]:
        """The elastic scenario: the recorder's hook calls against the journals (the
        actors' `scale` decisions, the victims' transitions) and the cuts in force."""
        spec, files = self.elastic, self.scale_files
        assert spec is not None and files is not None
        res = self.result
        calls = el.read_calls(files.calls)
        # a side acts alone until every view has the other side back: each cut lasts
        # until its views agreed again (15 s when that was not measured)
        settled = {id(f): r.converge_s for f, r in self.records}
        cuts, split = [], []
        for f, _ in self.records:
            if f.started_at is None or f.kind not in inv.CUT_KINDS:
                continue
            healed = f.healed_at if f.healed_at is not None else time.time()
            after = settled.get(id(f))
            after = inv.FAULT_SLACK if after is None else after
            cuts.append(inv.FaultWindow(f.kind, frozenset(), f.started_at, healed + after))
            split.append(inv.FaultWindow(f.kind, frozenset(), f.started_at, healed))
        slack = 2 * spec.lease_ttl  # then the lease of the side that yields runs out
        dbl = inv.check_double_action(
            calls,
            journals,
            cuts,
            in_cooldown=spec.in_cooldown,
            max_step=spec.max_step,
            slack=slack,
        )
        idle = inv.check_victims_idle(dbl.removals, journals, drain_grace=spec.drain_grace)
        decisions = inv.scale_decisions(journals)
        ins = [c for c in calls if c.action == "in"]
        outs = [c for c in calls if c.action == "out"]
        during = [r for r in dbl.removals if inv.partitions_in_force(split, r.at, r.at, 0.0) > 1]
        actors = sorted({(c.actor, c.epoch) for c in calls})
        # attempts whose victims still held work when asked right before the hook
        held = sum(a.log_text().count("event=scale.hook_held ") for a in cl.agents)
        res.scale = {
            "hook_calls": len(calls),
            "scale_in_calls": len(ins),
            "scale_out_calls": len(outs),
            "decisions": len(decisions),
            "removals": len(dbl.removals),
            "removed": [r.node for r in dbl.removals],
            "removed_while_split": len(during),
            "actors": [f"{a} e{e}" for a, e in actors],
            "peak_by_sides": {str(k): v for k, v in sorted(dbl.peak.items())},
            "bound_by_sides": {
                str(k): inv.bound_double_action(spec.max_step, k) for k in sorted(dbl.peak)
            },
            "double_windows": dbl.doubles,
            "named_twice": list(dbl.repeated),
            "hooks_held": held,
            "victims_judged": idle.judged,
            "after_grace": idle.after_grace,
            "homed_elsewhere": idle.homed_elsewhere,
        }
        peaks = ", ".join(
            f"{v} with {k} side(s) in force (bound {inv.bound_double_action(spec.max_step, k)})"
            for k, v in sorted(dbl.peak.items())
        )
        res.notes.append(
            f"elastic: {len(calls)} hook calls ({len(ins)} scale-in, {len(outs)} scale-out) "
            f"by {', '.join(res.scale['actors']) or 'nobody'}; {len(decisions)} scale-in "
            f"decisions journaled; {len(dbl.removals)} nodes removed, {len(during)} of them "
            f"chosen while split; most removed in one {spec.in_cooldown:g} s in-cooldown "
            f"window: {peaks or '-'}; {dbl.doubles} windows above max-step "
            f"{spec.max_step}; nodes named by two scale-in actions: "
            f"{', '.join(dbl.repeated) or 'none'}; victims judged idle at their hook: "
            f"{idle.judged} "
            f"({idle.after_grace} after the drain grace), {idle.homed_elsewhere} unfinished "
            "tasks homed at a victim ran elsewhere then"
        )
        res.notes.append(
            f"elastic hook calls: {el.describe_calls(calls, self.t0)}; {held} scale-in "
            "attempts not run because a victim still held work when asked (scale.hook_held)"
        )
        return [*dbl.violations, *idle.violations]

    def _priority_checks(
        self, cl: ChaosCluster, journals: Mapping[str, JournalData], specs: Mapping[str, Any]
    ) -> list[inv.Violation]:
        """The priority scenario: executions laid out in time from the tasks' own marks,
        against the executors' journals, their logged preemptions and the faults."""
        res = self.result
        execs = read_executions(self.root / "marks")
        acked = {a.id for a in self.wl.acked}
        execs = {t: rs for t, rs in execs.items() if t in acked}
        homes = {t: str(specs[t].home) for t in execs if t in specs}
        windows = self._fault_windows(cl)
        logged = [p for a in cl.agents for p in inv.logged_preemptions(a.name, a.log_text())]
        out = inv.check_one_at_a_time(execs, homes, windows)
        out += inv.check_recorded(execs, journals, windows)
        rerun_v, why = inv.check_reruns(execs, journals, homes, windows)
        out += rerun_v
        out += inv.check_preemptions_recorded(logged, journals, windows)
        out += inv.check_preemption_happened(journals)
        pre = inv.preemptions(journals)
        res.preemptions = len(pre)
        victims = {e.task_id for e in pre}
        remote = sum(1 for e in pre if homes.get(e.task_id, e.node) != e.node)
        reruns = sum(max(0, len(rs) - 1) for rs in execs.values())
        stopped = sum(1 for rs in execs.values() for r in rs if r.stopped)
        res.notes.append(
            f"preemption: {len(pre)} 'preempted by' transitions in the executors' journals "
            f"({remote} of a guest task), {len(logged)} logged, {len(victims)} tasks preempted; "
            f"{sum(len(rs) for rs in execs.values())} executions from marks, {stopped} stopped "
            f"by a signal, {reruns} re-runs: {why['preempted']} after a preemption, "
            f"{why['fault']} explained by a kill or cut"
        )
        return out

    def _detection(self, cl: ChaosCluster) -> None:
        """Time from each fault's start to the first agent that suspected a node it cut
        off (from the agents' own logs)."""
        seen: list[tuple[float, str, str]] = []  # (ts, observer, suspected peer)
        for a in cl.agents:
            for line in a.log_text().splitlines():
                if "event=member." not in line:
                    continue
                kv = inv.logfmt(line)
                if kv.get("event") in SUSPECT_EVENTS and "ts" in kv and "peer" in kv:
                    try:
                        seen.append((float(kv["ts"]), a.name, kv["peer"]))
                    except ValueError:
                        continue
        names = [a.name for a in cl.agents]
        for f, rec in self.records:
            if not f.detectable or f.started_at is None:
                continue
            tg = {f"n{i}" for i in f.targets}
            rest = [n for n in names if n not in tg]
            pairs = {(o, v) for o in rest for v in tg}
            if isinstance(f, fl.Split):
                pairs |= {(v, o) for o in rest for v in tg}
            end = f.healed_at or float("inf")
            hits = [ts for ts, o, p in seen if (o, p) in pairs and f.started_at <= ts <= end]
            rec.detect_s = round(min(hits) - f.started_at, 2) if hits else None
            if not hits:
                rec.note = (rec.note + "; " if rec.note else "") + "not suspected while active"
