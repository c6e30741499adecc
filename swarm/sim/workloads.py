"""Workloads for the simulator: what arrives, when, and what it asks for.

Every generator is driven by its own seeded `random.Random`, separate from the one the
policies use, so two policies compared on the same seed see exactly the same arrivals
(common random numbers: differences come from the policies, not from the draw).

Times are in units of the mean service time unless a workload says otherwise; `work`
is the CPU time a task needs on one core of speed 1.

Shapes and where they come from:

* `balls`: m unit tasks at once (balls into bins; Mitzenmacher 2001).
* `poisson`: Poisson arrivals with `Exponential` or `BoundedPareto` service. Process
  lifetimes are heavy-tailed with alpha about 1 (Harchol-Balter & Downey 1997); the
  bounded form keeps a finite variance so that a run of a few hundred thousand tasks
  has a stable mean.
* `google_like`: tasks with CPU and memory *requests* and a time-varying *usage*,
  shaped after the published analyses of Google's 2011 cluster trace (Reiss et al.,
  SoCC 2012): usage far below request on average (CPU about a third of the request,
  memory about half), peaks above it for some tasks, long-running production tasks vs
  short batch tasks. The parameters are in `GoogleLikeConfig`; they are a shape, not
  a fit.
* `gpu_jobs`: GPU requests where most are a fraction of one device, shaped after
  Alibaba's published GPU-cluster traces (PAI 2020, Weng et al. NSDI'22; the 2023
  GPU-sharing trace, Weng et al. ATC'23).
* `read_trace`: replay a CSV of (arrival, duration, cpu request, mem request, cpu
  usage, mem usage) so that users can feed their own traces.
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import attrs

from swarm.model import GpuRequest

# ------------------------------------------------------------------ jobs


class Job:
    """One arriving task, as the workload describes it. Plain slots: millions are made."""

    __slots__ = (
        "cpu",
        "cpu_use",
        "duration",
        "gpu",
        "klass",
        "mem",
        "mem_use",
        "reserve",
        "t",
        "weight",
        "work",
    )

    def __init__(
        self,
        t: float,
        work: float,
        *,
        weight: float = 1.0,
        reserve: int = 0,
        cpu: float | None = None,
        mem: float | None = None,
        cpu_use: float = 0.0,
        mem_use: float = 0.0,
        klass: str = "",
        gpu: GpuRequest | None = None,
        duration: float | None = None,
    ) -> None:
        self.t = t
        self.work = work
        self.weight = weight
        self.reserve = reserve
        self.cpu = cpu
        self.mem = mem
        self.cpu_use = cpu_use  # mean usage (cores) for request-vs-usage workloads
        self.mem_use = mem_use
        self.klass = klass
        self.gpu = gpu
        self.duration = work if duration is None else duration

    def __repr__(self) -> str:
        return f"Job(t={self.t:.4g}, work={self.work:.4g}, klass={self.klass!r})"


# ------------------------------------------------------------------ service times


@attrs.frozen
class Exponential:
    mean: float = 1.0

    def draw(self, rng: random.Random) -> float:
        return rng.expovariate(1.0 / self.mean)

    def label(self) -> str:
        return f"exponential (mean {self.mean:g})"


@attrs.frozen
class BoundedPareto:
    """Pareto(alpha) truncated to [lo, lo*ratio], scaled so that its mean is `mean`.

    Why bounded: with alpha near 1 the plain Pareto has infinite variance, and the
    mean response time of a finite run is then dominated by the few largest draws.
    """

    alpha: float = 1.1
    ratio: float = 1000.0  # hi / lo
    mean: float = 1.0

    @property
    def lo(self) -> float:
        a, r = self.alpha, self.ratio
        if abs(a - 1.0) < 1e-12:
            factor = math.log(r) / (1.0 - 1.0 / r)
        else:
            factor = a / (a - 1.0) * (1.0 - r ** (1.0 - a)) / (1.0 - r ** (-a))
        return self.mean / factor

    @property
    def hi(self) -> float:
        return self.lo * self.ratio

    def draw(self, rng: random.Random) -> float:
        lo, a = self.lo, self.alpha
        tail = 1.0 - self.ratio ** (-a)  # P(X <= hi) for the unbounded Pareto
        u = rng.random() * tail
        return float(lo * (1.0 - u) ** (-1.0 / a))

    def label(self) -> str:
        return f"bounded Pareto (alpha {self.alpha:g}, max/min {self.ratio:g}, mean {self.mean:g})"


ServiceDist = Exponential | BoundedPareto


# ------------------------------------------------------------------ generators


def balls(m: int) -> list[Job]:
    """m unit tasks, all at time 0."""
    return [Job(0.0, 1.0) for _ in range(m)]


def poisson(
    rate: float,
    service: ServiceDist,
    rng: random.Random,
    *,
    count: int | None = None,
    until: float | None = None,
    reserve: Sequence[tuple[int, float]] = (),
    weight: float = 1.0,
) -> Iterator[Job]:
    """Poisson arrivals at `rate` per time unit; stops after `count` jobs or at `until`.

    `reserve` is a list of (shares, probability): that fraction of tasks reserves that
    many shares while it runs (the rest reserve none).
    """
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if count is None and until is None:
        raise ValueError("poisson needs count or until")
    t = 0.0
    n = 0
    while True:
        t += rng.expovariate(rate)
        if until is not None and t >= until:
            return
        res = 0
        if reserve:
            u = rng.random()
            for shares, p in reserve:
                if u < p:
                    res = shares
                    break
                u -= p
        yield Job(t, service.draw(rng), reserve=res, weight=weight)
        n += 1
        if count is not None and n >= count:
            return


# ------------------------------------------------------------------ nodes


@attrs.frozen
class NodeSpec:
    """A simulated machine.

    `cores` is the CPU its running tasks share (processor sharing: k running tasks
    each progress at speed * min(1, cores / k)); at most `slots` tasks run at once and
    the rest wait in FIFO order. slots = cores = 1 is the single-server FIFO queue of
    queueing theory. `cpu`/`mem` are the capacities for request-vs-usage workloads.
    """

    shares: int = 1024
    cores: float = 1.0
    slots: int = 1
    speed: float = 1.0
    mem: float = 0.0


def uniform_nodes(n: int, **kw: float) -> tuple[NodeSpec, ...]:
    spec = NodeSpec(**kw)  # type: ignore[arg-type]
    return tuple(spec for _ in range(n))


# Share mix of the heterogeneous-shares workload: (shares, cores, fraction of nodes).
HETERO_MIX: tuple[tuple[int, float, float], ...] = (
    (512, 0.5, 0.25),
    (1024, 1.0, 0.40),
    (2048, 2.0, 0.25),
    (4096, 4.0, 0.10),
)


def hetero_nodes(
    n: int,
    rng: random.Random,
    mix: Sequence[tuple[int, float, float]] = HETERO_MIX,
    *,
    slots_per_core: int = 1,
) -> tuple[NodeSpec, ...]:
    """Nodes whose shares follow their capacity (shares 1024 per core), in the given
    proportions; deterministic counts (largest remainder), shuffled with `rng`."""
    want = [n * frac for _, _, frac in mix]
    counts = [int(w) for w in want]
    order = sorted(range(len(mix)), key=lambda i: want[i] - counts[i], reverse=True)
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    out: list[NodeSpec] = []
    for (shares, cores, _), c in zip(mix, counts, strict=True):
        slots = max(1, round(cores * slots_per_core))
        out.extend(NodeSpec(shares=shares, cores=cores, slots=slots) for _ in range(c))
    rng.shuffle(out)
    return tuple(out)


# ------------------------------------------------------------------ request vs usage


@attrs.frozen
class UsageClass:
    """One priority class of the request-vs-usage workload."""

    name: str
    fraction: float  # of arrivals
    cpu_request: tuple[float, float]  # lognormal (median cores, sigma)
    mem_request: tuple[float, float]  # lognormal (median GiB, sigma)
    cpu_ratio: tuple[float, float]  # beta (mean, concentration): task mean usage / request
    mem_ratio: tuple[float, float]
    duration: tuple[float, float]  # lognormal (median time units, sigma)
    cpu_noise: float  # sigma of the multiplicative lognormal usage noise per step
    mem_noise: float


@attrs.frozen
class GoogleLikeConfig:
    """Shaped after Reiss et al. (SoCC 2012) on Google's 2011 trace: usage well below
    request on average (CPU ~ 1/3, memory ~ 1/2), wide per-task spread, bursts above
    the request (CPU is compressible), production tasks long-running, batch short.
    """

    classes: tuple[UsageClass, ...] = (
        UsageClass(
            name="prod",
            fraction=0.3,
            cpu_request=(2.0, 0.6),
            mem_request=(4.0, 0.7),
            cpu_ratio=(0.30, 4.0),
            mem_ratio=(0.55, 6.0),
            duration=(150.0, 0.8),
            cpu_noise=0.45,
            mem_noise=0.08,
        ),
        UsageClass(
            name="batch",
            fraction=0.7,
            cpu_request=(1.0, 0.7),
            mem_request=(2.0, 0.8),
            cpu_ratio=(0.45, 3.0),
            mem_ratio=(0.50, 5.0),
            duration=(20.0, 1.0),
            cpu_noise=0.35,
            mem_noise=0.10,
        ),
    )
    max_peak: float = 2.0  # usage is capped at this multiple of the request

    def __attrs_post_init__(self) -> None:
        total = sum(c.fraction for c in self.classes)
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"class fractions must sum to 1, got {total}")


DEFAULT_USAGE = GoogleLikeConfig()


def _beta(rng: random.Random, mean: float, conc: float) -> float:
    return rng.betavariate(mean * conc, (1.0 - mean) * conc)


def google_like(
    rate: float,
    rng: random.Random,
    *,
    until: float,
    config: GoogleLikeConfig = DEFAULT_USAGE,
) -> Iterator[Job]:
    """Poisson arrivals of request-vs-usage tasks. `cpu_use`/`mem_use` are each task's
    *mean* usage; the simulator adds the per-step noise of its class."""
    t = 0.0
    classes = config.classes
    while True:
        t += rng.expovariate(rate)
        if t >= until:
            return
        u = rng.random()
        cls = classes[-1]
        for c in classes:
            if u < c.fraction:
                cls = c
                break
            u -= c.fraction
        cpu = min(16.0, rng.lognormvariate(math.log(cls.cpu_request[0]), cls.cpu_request[1]))
        mem = min(64.0, rng.lognormvariate(math.log(cls.mem_request[0]), cls.mem_request[1]))
        dur = max(1.0, rng.lognormvariate(math.log(cls.duration[0]), cls.duration[1]))
        yield Job(
            t,
            dur,
            duration=dur,
            cpu=round(cpu, 3),
            mem=round(mem, 3),
            cpu_use=cpu * _beta(rng, *cls.cpu_ratio),
            mem_use=mem * _beta(rng, *cls.mem_ratio),
            klass=cls.name,
        )


def usage_noise(cls_name: str, config: GoogleLikeConfig = DEFAULT_USAGE) -> tuple[float, float]:
    """(CPU noise sigma, memory noise sigma) of a usage class by name."""
    for c in config.classes:
        if c.name == cls_name:
            return c.cpu_noise, c.mem_noise
    return 0.3, 0.1  # replayed traces: a middle value


# ------------------------------------------------------------------ GPU


# (gpu-core percent, probability). Most requests are a slice of one device; whole
# devices and multi-GPU jobs are the minority but hold most of the GPU time.
GPU_MIX: tuple[tuple[int, float], ...] = (
    (10, 0.06),
    (20, 0.08),
    (25, 0.10),
    (30, 0.07),
    (40, 0.07),
    (50, 0.16),
    (60, 0.05),
    (75, 0.06),
    (100, 0.22),
    (200, 0.07),
    (400, 0.04),
    (800, 0.02),
)


def gpu_request(rng: random.Random, mix: Sequence[tuple[int, float]] = GPU_MIX) -> GpuRequest:
    u = rng.random()
    core = mix[-1][0]
    for c, p in mix:
        if u < p:
            core = c
            break
        u -= p
    if core < 100:
        # GPU memory follows the compute share roughly, with some memory-heavy slices.
        ratio = min(100, max(5, round(core * rng.choice((0.5, 1.0, 1.0, 1.5)))))
        return GpuRequest(core=core, memory_ratio=ratio)
    return GpuRequest(core=core, memory_ratio=core)


def gpu_jobs(
    rate: float,
    rng: random.Random,
    *,
    until: float,
    duration: tuple[float, float] = (10.0, 1.0),
    mix: Sequence[tuple[int, float]] = GPU_MIX,
) -> Iterator[Job]:
    """Poisson arrivals of GPU tasks with lognormal durations (median, sigma)."""
    t = 0.0
    med, sigma = duration
    while True:
        t += rng.expovariate(rate)
        if t >= until:
            return
        req = gpu_request(rng, mix)
        dur = rng.lognormvariate(math.log(med), sigma)
        yield Job(t, dur, duration=dur, gpu=req, weight=req.core / 100.0, klass="gpu")


def mean_gpu_core(mix: Sequence[tuple[int, float]] = GPU_MIX) -> float:
    """Expected gpu-core units (percent of a device) per request."""
    return sum(c * p for c, p in mix)


# ------------------------------------------------------------------ trace replay

TRACE_COLUMNS = ("arrival", "duration", "cpu_request", "mem_request", "cpu_usage", "mem_usage")


@attrs.frozen
class Trace:
    """A replayed trace: the jobs in arrival order, and the rows that were dropped."""

    jobs: tuple[Job, ...]
    dropped: int
    problems: tuple[str, ...]  # the first few reasons, for the user

    def __len__(self) -> int:
        return len(self.jobs)


def _row_job(row: Sequence[str]) -> Job:
    if len(row) < len(TRACE_COLUMNS):
        raise ValueError(f"expected {len(TRACE_COLUMNS)} columns, got {len(row)}")
    vals = [float(x) for x in row[: len(TRACE_COLUMNS)]]
    if not all(math.isfinite(v) for v in vals):
        raise ValueError("non-finite number")
    arrival, duration, cpu, mem, cpu_use, mem_use = vals
    if arrival < 0 or duration <= 0 or cpu < 0 or mem < 0 or cpu_use < 0 or mem_use < 0:
        raise ValueError("negative value or non-positive duration")
    return Job(
        arrival,
        duration,
        duration=duration,
        cpu=cpu,
        mem=mem,
        cpu_use=cpu_use,
        mem_use=mem_use,
        klass="trace",
    )


def parse_trace(lines: Iterable[str], *, max_problems: int = 5) -> Trace:
    """Parse CSV lines (arrival, duration, cpu_request, mem_request, cpu_usage, mem_usage),
    one record per line (quoted fields may not span lines).

    A header line is recognised by a non-numeric first field and skipped; blank lines
    and lines starting with '#' are ignored. Bad rows (too few columns, not numbers,
    negative values, zero duration) are dropped and counted, never fatal. Units: times
    in the simulator's time unit, CPU in cores, memory in the node capacity's unit.
    """
    jobs: list[Job] = []
    dropped = 0
    problems: list[str] = []
    for lineno, line in enumerate(lines, start=1):
        try:
            row = next(csv.reader([line]), [])
        except csv.Error as e:  # e.g. a field over the csv module's size limit
            row, err = None, str(e)
        if row is not None:
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            if lineno == 1 and row[0].strip().lower() in ("arrival", "time", "t", "submit"):
                continue
            try:
                jobs.append(_row_job(row))
                continue
            except ValueError as e:
                err = str(e)
        dropped += 1
        if len(problems) < max_problems:
            problems.append(f"line {lineno}: {err}")
    jobs.sort(key=lambda j: j.t)
    return Trace(tuple(jobs), dropped, tuple(problems))


def read_trace(path: str | Path) -> Trace:
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        return parse_trace(f)


def write_trace(jobs: Iterable[Job]) -> str:
    """The CSV form `parse_trace` reads (with a header), e.g. to export a workload."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(TRACE_COLUMNS)
    for j in jobs:
        w.writerow(
            [
                f"{j.t:.6g}",
                f"{j.duration:.6g}",
                f"{j.cpu or 0:.6g}",
                f"{j.mem or 0:.6g}",
                f"{j.cpu_use:.6g}",
                f"{j.mem_use:.6g}",
            ]
        )
    return buf.getvalue()
