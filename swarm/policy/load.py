"""Load index (the fleet share formula), usage estimate and Flex admission penalty.

Load index: ``weight_sum / (shares - reserved)``. Shares express a node's capacity,
weights a task's demand, so equal load means "fair share" across unequal machines.
A node with no unreserved shares left has infinite load: it takes no more ordinary
work. Shares default to 1024 per slot (`default_shares`), so one weight-1 task per
slot is load 1/1024 (`UNIT`) on any node with default settings.

Flex: admit when, for every resource, ``P * estimated_usage + request <= capacity``.
P is a penalty on measured usage that grows quickly while local QoS (PSI) is violated
and decays slowly while it holds, so a node that is hurting stops taking work at once
and reopens gradually.
"""

from __future__ import annotations

import math

import attrs

from swarm.model import DEFAULT_SHARES, LoadReport, TaskSpec

INF = math.inf
UNIT = 1.0 / DEFAULT_SHARES
"""Load of one weight-1.0 task on a default node; thresholds are written in it."""


# ------------------------------------------------------------------ load index


SHARES_PER_SLOT = DEFAULT_SHARES


def default_shares(slots: int) -> int:
    """A node's shares when its operator sets none: 1024 per slot (slots default to the
    CPUs), so the load index is tasks per slot and a 16-slot node takes four times the
    work of a 4-slot one; transfer's thresholds (in UNIT) then read per slot."""
    return SHARES_PER_SLOT * max(int(slots), 1)


def load_index(weight_sum: float, shares: int, reserved: int) -> float:
    """Current load; infinite when no unreserved share is left (drained or full)."""
    capacity = shares - reserved
    if capacity <= 0:
        return INF
    return max(weight_sum, 0.0) / capacity


def projected_load(
    weight_sum: float, shares: int, reserved: int, weight: float, reserve: int
) -> float:
    """Load after adding one task of `weight` that reserves `reserve` shares.

    Infinite when the task would leave no unreserved share: such a node is chosen only
    if every candidate is in the same position.
    """
    capacity = shares - reserved - reserve
    if capacity <= 0:
        return INF
    return max(weight_sum + weight, 0.0) / capacity


def report_load(r: LoadReport) -> float:
    return load_index(r.weight_sum, r.shares, r.reserved_shares)


def report_projected(r: LoadReport, spec: TaskSpec) -> float:
    return projected_load(
        r.weight_sum, r.shares, r.reserved_shares, spec.weight, spec.reserve_shares
    )


def free_shares(r: LoadReport) -> int:
    """Unconsumed shares (negative when global tasks pushed the node below zero)."""
    return r.shares - r.reserved_shares


# --------------------------------------------------------------- usage estimate


@attrs.frozen
class Usage:
    """Measured or estimated use of the node's resources (all tasks and the host)."""

    cpu: float = 0.0  # cores busy
    mem: int = 0  # bytes in use (total - available)


@attrs.frozen
class Capacity:
    """What the node has; 0 means unknown and that resource is not checked."""

    cpu: float = 0.0  # cores
    mem: int = 0  # bytes


@attrs.frozen
class PeakEstimator:
    """Decaying recent-peak usage estimate: ``est = max(sample, est * 2^(-dt/half_life))``.

    Why a decaying peak rather than an EWMA: admission must cover the usage that will
    come back, and bursts are what violate QoS. An EWMA under-reports bursty usage by
    the burst's duty cycle and lags on a rise; a peak follows a rise at once and
    forgets it smoothly (half-life), with O(1) state and no window buffer. Time-based
    decay keeps it right when samples arrive irregularly.
    """

    half_life: float = 60.0
    cpu: float = 0.0
    mem: float = 0.0
    at: float | None = None

    def update(self, now: float, sample: Usage) -> PeakEstimator:
        cpu, mem = float(sample.cpu), float(sample.mem)
        if self.at is None:
            return attrs.evolve(self, cpu=cpu, mem=mem, at=now)
        dt = max(0.0, now - self.at)  # a clock step back decays nothing
        k = 0.5 ** (dt / self.half_life) if self.half_life > 0 else 0.0
        return attrs.evolve(
            self, cpu=max(cpu, self.cpu * k), mem=max(mem, self.mem * k), at=max(now, self.at)
        )

    @property
    def estimate(self) -> Usage:
        return Usage(cpu=self.cpu, mem=math.ceil(self.mem))


# ------------------------------------------------------------------------- Flex


@attrs.frozen
class FlexConfig:
    """Flex parameters. The defaults are those of the design: P0 1.5, Pmin 1, alpha 0.99,
    beta 1. `min_rise` keeps a violation at the floor from being a no-op (P - Pmin = 0
    there); `p_max` keeps a long violation from growing P without bound.
    """

    p_init: float = 1.5
    p_min: float = 1.0
    p_max: float = 16.0
    alpha: float = 0.99
    beta: float = 1.0
    min_rise: float = 0.1
    psi_cpu_target: float = 20.0  # percent, PSI cpu "some avg10"
    psi_mem_target: float = 10.0  # percent, PSI memory "some avg10"

    def __attrs_post_init__(self) -> None:
        if not (0 < self.p_min <= self.p_init <= self.p_max):
            raise ValueError("flex: need 0 < p_min <= p_init <= p_max")
        if not (0 < self.alpha <= 1):
            raise ValueError("flex: alpha must be in (0, 1]")
        if self.beta <= 0 or self.min_rise <= 0:
            raise ValueError("flex: beta and min_rise must be > 0")


@attrs.frozen
class FlexState:
    p: float
    violated: bool = False  # QoS state seen at the last update

    @classmethod
    def initial(cls, cfg: FlexConfig) -> FlexState:
        return cls(p=cfg.p_init)


def qos_holds(psi_cpu: float, psi_mem: float, cfg: FlexConfig) -> bool:
    """Local QoS: PSI some avg10 of cpu and memory both under their targets."""
    return psi_cpu < cfg.psi_cpu_target and psi_mem < cfg.psi_mem_target


def flex_update(state: FlexState, cfg: FlexConfig, qos_ok: bool) -> FlexState:
    """One period: decay ``P = max(Pmin, alpha*P)`` when QoS holds, else
    ``P = min(Pmax, P + beta * max(P - Pmin, min_rise))``."""
    if qos_ok:
        return FlexState(p=max(cfg.p_min, cfg.alpha * state.p), violated=False)
    rise = cfg.beta * max(state.p - cfg.p_min, cfg.min_rise)
    return FlexState(p=min(cfg.p_max, max(cfg.p_min, state.p + rise)), violated=True)


def flex_refusal(
    p: float, usage: Usage, capacity: Capacity, cpu_request: float, mem_request: int
) -> str | None:
    """None when ``P * usage + request <= capacity`` holds for CPU and memory, else why.

    A resource whose capacity is unknown (0) is not checked. An undeclared request
    counts as 0: the node still refuses when its penalised usage alone is over.
    """
    if capacity.cpu > 0:
        need = p * usage.cpu + cpu_request
        if need > capacity.cpu:
            return (
                f"cpu: P*usage + request = {p:.2f}*{usage.cpu:.2f} + {cpu_request:.2f}"
                f" = {need:.2f} > capacity {capacity.cpu:.2f} cores"
            )
    if capacity.mem > 0:
        needm = p * usage.mem + mem_request
        if needm > capacity.mem:
            return (
                f"memory: P*usage + request = {p:.2f}*{usage.mem} + {mem_request}"
                f" = {needm:.0f} > capacity {capacity.mem} bytes"
            )
    return None


@attrs.frozen
class HostSample:
    """One measurement of the host (the runtime's sampler takes it; decisions read it)."""

    cpu_util: float  # 0..1 of the whole machine since the previous sample
    load_per_core: float  # 1-minute load average / logical CPUs
    cpus: float  # logical CPUs usable by this process
    mem_available: int
    mem_total: int
    psi_cpu: float  # some avg10, percent
    psi_mem: float
    cpu_used_cores: float  # cpu_util * cpus: usage in cores (for Flex)
    mem_used: int
