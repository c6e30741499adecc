"""Request-versus-usage admission: least-fit, 2x oversubscription and Flex.

A time-stepped cluster (one step is one usage sample, e.g. a minute of trace time):
tasks arrive with CPU and memory *requests* and a usage that wanders around a
per-task mean far below the request (`workloads.google_like`), with bursts above it.
Tasks wait in one pending queue until admitted; they run for their duration and
leave. Demand is offered above what the cluster can hold, so the admission rule
decides how much runs.

Policies (all admission checks go through swarm's policy functions):

* least-fit: the node with the most unrequested room (the "least fit", i.e.
  worst-fit); admit iff ``committed requests + request <= capacity``, checked with
  `flex_refusal(P=1, usage=committed requests, ...)`.
* oversub-2x: the same with the capacity doubled.
* flex (FIFO or largest-request-first queue): swarm's own path. The agent's rule
  (`node.decide.choose`, two choices) samples two nodes whose reported idle CPU and
  free memory fit the request (`placement.refusal` on the reports, one step old), and
  the target runs the agent's admission (`node.decide.admission_refusal`, i.e.
  `placement.admit`) with its Flex state: ``P * estimated usage + request <=
  capacity``, usage estimated by `PeakEstimator`, P updated every step by
  `flex_update` from local QoS. A refused task is placed again without the refusers
  (`PlacementRetry`), up to `RetryPolicy.max_tries`, then waits for the next step.
  Tasks admitted during a step count at their request until the next usage sample.

QoS: a node violates QoS in a step when its CPU (or memory) demand exceeds its
capacity; the PSI value given to `qos_holds` is the stalled share of demand,
``100 * excess / demand``.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterator

import attrs

from swarm.model import LoadReport, TaskSpec
from swarm.node.decide import TWO_CHOICE, admission_refusal, choose
from swarm.policy.load import (
    Capacity,
    FlexConfig,
    FlexState,
    PeakEstimator,
    Usage,
    flex_refusal,
    flex_update,
    qos_holds,
)
from swarm.policy.placement import PlacementRetry, RetryPolicy
from swarm.policy.shares import ShareLedger
from swarm.policy.view import LoadView, PeerEntry

from .workloads import GoogleLikeConfig, Job, google_like, usage_noise

REQUESTS = "requests"
FLEX = "flex"
FIFO = "fifo"
LRF = "lrf"

MIB = 1024  # memory is tracked in MiB (integers, as Usage/Capacity want)


def flex_config(p_min: float = 1.0) -> FlexConfig:
    """The simulator's Flex parameters: the design's rule, per usage sample, with QoS
    meaning "no demand above capacity" (PSI proxy target 1 %)."""
    return FlexConfig(
        p_init=max(1.5, p_min),
        p_min=p_min,
        p_max=max(16.0, p_min),
        alpha=0.99,
        psi_cpu_target=1.0,
        psi_mem_target=1.0,
    )


@attrs.frozen
class FlexSimConfig:
    admission: str = REQUESTS  # "requests": sum of requests vs capacity; "flex": swarm's
    oversub: float = 1.0  # requests: capacity multiplier (1 = least-fit, 2 = 2x)
    order: str = FIFO  # pending queue: "fifo", or "lrf" (largest request first)
    nodes: int = 40
    cores: float = 32.0
    mem_gib: float = 128.0
    horizon: int = 600  # steps
    warmup: int = 150  # statistics start here
    offered: float = 3.5  # offered requested core-steps / cluster core capacity
    patience: int = 60  # a pending task gives up after this many steps
    scan: int = 50  # pending tasks looked at per step
    persistence: float = 0.8  # AR(1) correlation of a task's usage noise step to step
    flex: FlexConfig = attrs.field(factory=flex_config)
    half_life: float = 5.0  # steps, for the PeakEstimator
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    seed: int = 0
    workload: GoogleLikeConfig = attrs.field(factory=GoogleLikeConfig)

    def __attrs_post_init__(self) -> None:
        if self.admission not in (REQUESTS, FLEX) or self.order not in (FIFO, LRF):
            raise ValueError("admission must be requests|flex and order fifo|lrf")
        if self.oversub <= 0:
            raise ValueError("oversub must be > 0")

    @property
    def label(self) -> str:
        if self.admission == REQUESTS:
            what = "least-fit" if self.oversub == 1.0 else f"oversub {self.oversub:g}x"
        else:
            what = f"flex Pmin={self.flex.p_min:g}"
        return what + (" LRF" if self.order == LRF else "")


class _Task:
    __slots__ = (
        "cpu",
        "cpu_cap",
        "cpu_half_var",
        "cpu_mean",
        "cpu_sig",
        "end",
        "job",
        "mem",
        "mem_mean",
        "mem_use",
        "queued_at",
        "spec",
        "z_cpu",
    )

    def __init__(self, job: Job, idx: int, queued_at: int, rng: random.Random, peak: float) -> None:
        self.job = job
        self.spec = TaskSpec(
            id=f"t{idx}",
            argv=(),
            weight=float(job.cpu or 0.0),
            cpu=job.cpu,
            mem=int((job.mem or 0.0) * MIB),
        )
        self.cpu = float(job.cpu or 0.0)
        self.mem = float(job.mem or 0.0) * MIB
        self.cpu_mean = job.cpu_use
        self.mem_mean = job.mem_use * MIB
        self.cpu_sig, mem_sig = usage_noise(job.klass)
        self.cpu_half_var = 0.5 * self.cpu_sig**2
        self.cpu_cap = peak * self.cpu
        # Memory barely moves in the traces: one draw per task around its mean.
        self.mem_use = min(peak * self.mem, self.mem_mean * rng.lognormvariate(0.0, mem_sig))
        self.z_cpu = rng.gauss(0.0, 1.0)
        self.end = 0
        self.queued_at = queued_at


class _Node:
    __slots__ = (
        "cap",
        "committed_cpu",
        "committed_mem",
        "flex",
        "fresh_cpu",
        "fresh_mem",
        "id",
        "ledger",
        "mem",
        "peak",
        "tasks",
        "use_cpu",
        "use_mem",
    )

    def __init__(self, i: int, cores: float, mem: float, flex: FlexState, half_life: float):
        self.id = f"n{i:04d}"
        self.cap = cores
        self.mem = mem
        self.tasks: list[_Task] = []
        self.committed_cpu = 0.0
        self.committed_mem = 0.0
        self.use_cpu = 0.0
        self.use_mem = 0.0
        self.fresh_cpu = 0.0  # requests admitted since the last usage sample
        self.fresh_mem = 0.0
        self.flex = flex
        self.peak = PeakEstimator(half_life=half_life)
        self.ledger = ShareLedger(max(1, round(1024 * cores / 32.0)))


@attrs.frozen
class FlexResult:
    label: str
    utilisation: float  # CPU used (capped at capacity) / capacity, time average
    violation_pct: float  # % of node-steps with demand above capacity
    spread: float  # std / mean of per-node CPU usage, time average
    admitted: int  # tasks admitted after warm-up
    gave_up: int  # tasks that waited longer than `patience`
    mean_wait: float  # steps from arrival to admission (admitted tasks)
    requested: float  # committed requests / capacity, time average


class FlexSim:
    def __init__(self, cfg: FlexSimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed * 104729 + 3)
        self.noise = random.Random(cfg.seed * 7 + 11)
        flex0 = FlexState.initial(cfg.flex)
        self.nodes = [
            _Node(i, cfg.cores, cfg.mem_gib * MIB, flex0, cfg.half_life) for i in range(cfg.nodes)
        ]
        self.by_id = {n.id: n for n in self.nodes}
        rate = cfg.offered * cfg.nodes * cfg.cores / _mean_core_steps(cfg.workload)
        self._jobs: Iterator[Job] = google_like(
            rate, random.Random(cfg.seed), until=float(cfg.horizon), config=cfg.workload
        )
        self._next: Job | None = next(self._jobs, None)
        self.pending: deque[_Task] = deque()
        self.view = LoadView()
        self._front = LoadReport("frontend", 1, shares=0)
        self._idx = 0

    # ------------------------------------------------------------------ steps

    def run(self) -> FlexResult:
        cfg = self.cfg
        util = viol = spread = req = 0.0
        steps = 0
        admitted = gave_up = 0
        waits = 0.0
        for step in range(cfg.horizon):
            measuring = step >= cfg.warmup
            self._arrivals(step)
            self._departures(step)
            u, v, s, r = self._sample(step)
            if measuring:
                util += u
                viol += v
                spread += s
                req += r
                steps += 1
            self._publish(step)
            a, w, g = self._admit(step)
            if measuring:
                admitted += a
                waits += w
                gave_up += g
        n = max(1, steps)
        return FlexResult(
            label=cfg.label,
            utilisation=util / n,
            violation_pct=100.0 * viol / n,
            spread=spread / n,
            admitted=admitted,
            gave_up=gave_up,
            mean_wait=waits / admitted if admitted else math.nan,
            requested=req / n,
        )

    def _arrivals(self, step: int) -> None:
        while self._next is not None and self._next.t < step + 1:
            task = _Task(self._next, self._idx, step, self.noise, self.cfg.workload.max_peak)
            self.pending.append(task)
            self._idx += 1
            self._next = next(self._jobs, None)

    def _departures(self, step: int) -> None:
        for n in self.nodes:
            if not any(t.end <= step for t in n.tasks):
                continue
            keep = []
            for t in n.tasks:
                if t.end <= step:
                    n.committed_cpu -= t.cpu
                    n.committed_mem -= t.mem
                    n.ledger.remove(t.spec.id)
                else:
                    keep.append(t)
            n.tasks = keep

    def _sample(self, step: int) -> tuple[float, float, float, float]:
        """Draw every running task's usage for this step; update estimators and Flex."""
        cfg = self.cfg
        rho = cfg.persistence
        shock = math.sqrt(1.0 - rho * rho)
        gauss = self.noise.gauss
        used = 0.0
        viol = 0
        loads = []
        for n in self.nodes:
            cpu = mem = 0.0
            for t in n.tasks:
                z = rho * t.z_cpu + shock * gauss(0.0, 1.0)
                t.z_cpu = z
                c = t.cpu_mean * math.exp(t.cpu_sig * z - t.cpu_half_var)
                cpu += c if c < t.cpu_cap else t.cpu_cap
                mem += t.mem_use
            n.use_cpu, n.use_mem = cpu, mem
            n.fresh_cpu = n.fresh_mem = 0.0
            over_cpu = cpu > n.cap
            over_mem = mem > n.mem
            if over_cpu or over_mem:
                viol += 1
            used += min(cpu, n.cap)
            loads.append(cpu)
            n.peak = n.peak.update(float(step), Usage(cpu=cpu, mem=int(mem)))
            psi_cpu = 100.0 * (cpu - n.cap) / cpu if over_cpu else 0.0
            psi_mem = 100.0 * (mem - n.mem) / mem if over_mem else 0.0
            n.flex = flex_update(n.flex, cfg.flex, qos_holds(psi_cpu, psi_mem, cfg.flex))
        total = len(self.nodes) * cfg.cores
        mean = sum(loads) / len(loads)
        var = sum((x - mean) ** 2 for x in loads) / len(loads)
        spread = math.sqrt(var) / mean if mean > 0 else 0.0
        req = sum(n.committed_cpu for n in self.nodes) / total
        return used / total, viol / len(self.nodes), spread, req

    def _report(self, n: _Node, step: int) -> LoadReport:
        est = n.peak.estimate
        cpu = est.cpu + n.fresh_cpu
        mem = est.mem + n.fresh_mem
        return LoadReport(
            n.id,
            step + 1,
            shares=n.ledger.shares,
            weight_sum=n.ledger.weight_sum,
            running=len(n.tasks),
            slots=len(n.tasks) + 1,
            cpus=n.cap,
            cpu_util=min(1.0, cpu / n.cap),
            mem_total=int(n.mem),
            mem_available=max(0, int(n.mem - mem)),
        )

    def _publish(self, step: int) -> None:
        for n in self.nodes:
            self.view.put(n.id, PeerEntry(self._report(n, step), float(step)))

    # ------------------------------------------------------------------ admission

    def _admit(self, step: int) -> tuple[int, float, int]:
        cfg = self.cfg
        live = [t for t in self.pending if t.queued_at >= step - cfg.patience]
        gave_up = len(self.pending) - len(live)
        # The scheduler looks at the `scan` oldest tasks per step; LRF reorders that
        # window by request (largest first), so nothing starves behind big tasks.
        window, keep = live[: cfg.scan], live[cfg.scan :]
        if cfg.order == LRF:
            window.sort(key=lambda t: (-t.cpu, t.queued_at))
        admitted = 0
        waits = 0.0
        failed: list[tuple[float, float]] = []
        for t in window:
            # A task needing at least the CPU and memory of one that already found no
            # node in this pass is not tried again until the next step.
            if any(t.cpu >= c and t.mem >= m for c, m in failed):
                keep.append(t)
                continue
            node = self._choose(t, step)
            if node is None:
                failed.append((t.cpu, t.mem))
                keep.append(t)
                continue
            self._start(node, t, step)
            admitted += 1
            waits += step - t.queued_at
        keep.sort(key=lambda t: t.queued_at)
        self.pending = deque(keep)
        return admitted, waits, gave_up

    def _choose(self, t: _Task, step: int) -> _Node | None:
        if self.cfg.admission == REQUESTS:
            factor = self.cfg.oversub
            best: _Node | None = None
            best_room = -math.inf
            for n in self.nodes:
                room = min((n.cap - n.committed_cpu) / n.cap, (n.mem - n.committed_mem) / n.mem)
                if room > best_room:
                    best, best_room = n, room
            if best is None:
                return None
            why = flex_refusal(
                1.0,
                Usage(cpu=best.committed_cpu, mem=int(best.committed_mem)),
                Capacity(cpu=factor * best.cap, mem=int(factor * best.mem)),
                t.cpu,
                int(t.mem),
            )
            return best if why is None else None
        # swarm: place(d=2) on the reports, then the target's admit on fresh state.
        retry = PlacementRetry()
        for _ in range(self.cfg.retry.max_tries):
            p = choose(
                TWO_CHOICE,
                2,
                t.spec,
                self._front,
                self.view,
                self.rng,
                float(step),
                retry.exclude,
                scan_below=0,  # rejection-sample: no full scan for explain's sake
            )
            if p.target is None:
                return None
            n = self.by_id[p.target]
            est = n.peak.estimate
            usage = Usage(cpu=est.cpu + n.fresh_cpu, mem=est.mem + int(n.fresh_mem))
            cap = Capacity(cpu=n.cap, mem=int(n.mem))
            if admission_refusal(t.spec, n.ledger, n.flex, usage, cap) is None:
                return n
            retry = retry.on_refusal(n.id, float(step), self.cfg.retry, self.rng)
            if not retry.ready(float(step)):
                return None
        return None

    def _start(self, n: _Node, t: _Task, step: int) -> None:
        n.tasks.append(t)
        n.committed_cpu += t.cpu
        n.committed_mem += t.mem
        n.fresh_cpu += t.cpu
        n.fresh_mem += t.mem
        n.ledger.add(t.spec)
        t.end = step + max(1, round(t.job.duration))
        if self.cfg.admission == FLEX:
            self.view.put(n.id, PeerEntry(self._report(n, step), float(step)))


def _mean_core_steps(cfg: GoogleLikeConfig) -> float:
    """E[cpu request * duration] of the workload (lognormal means; caps ignored)."""
    total = 0.0
    for c in cfg.classes:
        cpu = c.cpu_request[0] * math.exp(c.cpu_request[1] ** 2 / 2)
        dur = c.duration[0] * math.exp(c.duration[1] ** 2 / 2)
        total += c.fraction * cpu * dur
    return total


def run_flex(cfg: FlexSimConfig) -> FlexResult:
    return FlexSim(cfg).run()
