"""GPU slicing after Koordinator's DeviceShare: request rules, allocator, summaries.

A node's GPUs are divided in *core units* (100 per device, i.e. percent of one
device) and bytes of device memory. A request either takes a slice of one device
(core 1-99 plus memory bytes or a percent of that device's memory) or k whole
devices (core = k*100), chosen topology-aware so a multi-GPU job gets the
best-connected set that is free.

Everything here is pure: the allocator is a plain object whose methods only read
and write its own bookkeeping, so the agent, the simulator and property tests use
it alike. The device inventory and its topology are in gpu_inventory (re-exported
here); NVML discovery and the journal live in runtime/ and feed
`devices_from_nvml` / `devices_from_config` and `GpuAllocator.restore`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from swarm.model import GpuDeviceFree, GpuRequest, TaskId

from .gpu_inventory import (
    ByteSizeError,
    GpuConfigError,
    GpuDevice,
    Link,
    Topology,
    devices_from_config,
    devices_from_nvml,
    distance,
    parse_bytes,
)

__all__ = [
    "CORE_PER_DEVICE",
    "RULES",
    "Allocation",
    "ByteSizeError",
    "DeviceShare",
    "Fragmentation",
    "GpuAllocationError",
    "GpuAllocator",
    "GpuConfigError",
    "GpuDevice",
    "GpuRequestError",
    "Link",
    "Policy",
    "Topology",
    "devices_from_config",
    "devices_from_nvml",
    "devices_wanted",
    "distance",
    "env_for",
    "fits_summary",
    "fragmentation",
    "is_whole",
    "largest_free_slice",
    "memory_needed",
    "parse_bytes",
    "request_from_flags",
    "validate",
    "whole_free",
]

CORE_PER_DEVICE = 100

Policy = Literal["binpack", "spread"]

# ------------------------------------------------------------------ requests


class GpuRequestError(ValueError):
    """A GPU request breaks one of Koordinator's rules; `rule` is a stable code."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{message} (rule: {rule})")
        self.rule = rule
        self.detail = message


# Stable rule codes (clients and tests match on them).
RULE_EXCLUSIVE = "gpu-exclusive"
RULE_POSITIVE = "positive"
RULE_MULTIPLE_OF_100 = "multiple-of-100"
RULE_CORE_NEEDS_MEMORY = "core-needs-memory"
RULE_MEMORY_NEEDS_CORE = "memory-needs-core"
RULE_MEMORY_XOR_RATIO = "memory-xor-ratio"
RULE_RATIO_WITHIN_CORE = "ratio-within-core"
RULE_TYPE = "integer"

RULES = frozenset(
    {
        RULE_EXCLUSIVE,
        RULE_POSITIVE,
        RULE_MULTIPLE_OF_100,
        RULE_CORE_NEEDS_MEMORY,
        RULE_MEMORY_NEEDS_CORE,
        RULE_MEMORY_XOR_RATIO,
        RULE_RATIO_WITHIN_CORE,
        RULE_TYPE,
    }
)


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GpuRequestError(RULE_TYPE, f"{name} must be an integer, got {value!r:.40}")
    return value


def _check_percent(name: str, value: int) -> None:
    if value <= 0:
        raise GpuRequestError(RULE_POSITIVE, f"{name} must be positive, got {value}")
    if value > CORE_PER_DEVICE and value % CORE_PER_DEVICE:
        raise GpuRequestError(
            RULE_MULTIPLE_OF_100,
            f"{name} above 100 asks for whole GPUs and must be a multiple of 100, got {value}",
        )


def validate(req: GpuRequest) -> None:
    """Raise GpuRequestError naming the first broken rule; return None if valid.

    Rules (Koordinator's DeviceShare): every value is a positive integer; a
    percentage above 100 means whole GPUs and must be a multiple of 100; core
    alone is not a request (it needs memory bytes or a memory ratio); bytes and
    ratio together are ambiguous; a memory ratio cannot exceed what the core asks
    for (at most 100 for a slice of one device, at most `core` for whole GPUs).
    """
    core = _check_int("gpu-core", req.core)
    _check_percent("gpu-core", core)
    if req.memory_bytes is not None and req.memory_ratio is not None:
        raise GpuRequestError(
            RULE_MEMORY_XOR_RATIO, "give gpu-memory (bytes) or gpu-memory-ratio, not both"
        )
    if req.memory_bytes is None and req.memory_ratio is None:
        raise GpuRequestError(
            RULE_CORE_NEEDS_MEMORY,
            "gpu-core needs gpu-memory or gpu-memory-ratio; --gpu N sets core and ratio both",
        )
    if req.memory_bytes is not None:
        mem = _check_int("gpu-memory", req.memory_bytes)
        if mem <= 0:
            raise GpuRequestError(RULE_POSITIVE, f"gpu-memory must be positive, got {mem}")
    if req.memory_ratio is not None:
        ratio = _check_int("gpu-memory-ratio", req.memory_ratio)
        _check_percent("gpu-memory-ratio", ratio)
        limit = max(core, CORE_PER_DEVICE) if core % CORE_PER_DEVICE == 0 else CORE_PER_DEVICE
        if ratio > limit:
            raise GpuRequestError(
                RULE_RATIO_WITHIN_CORE,
                f"gpu-memory-ratio {ratio} exceeds the {limit}% of device memory that "
                f"gpu-core {core} spans",
            )


def request_from_flags(
    gpu: int | None, core: int | None, memory: int | None, ratio: int | None
) -> GpuRequest | None:
    """Build and validate a request from `--gpu`, `--gpu-core`, `--gpu-memory`,
    `--gpu-memory-ratio`; None when no GPU flag was given.

    `--gpu N` is shorthand for core N and memory ratio N and excludes the other
    three. Memory without core is refused rather than guessed: the user has to say
    how much compute the slice needs.
    """
    if gpu is None and core is None and memory is None and ratio is None:
        return None
    if gpu is not None:
        if core is not None or memory is not None or ratio is not None:
            raise GpuRequestError(
                RULE_EXCLUSIVE,
                "--gpu cannot be combined with --gpu-core, --gpu-memory or --gpu-memory-ratio",
            )
        n = _check_int("--gpu", gpu)
        _check_percent("--gpu", n)
        req = GpuRequest(core=n, memory_ratio=n)
    else:
        if core is None:
            raise GpuRequestError(
                RULE_MEMORY_NEEDS_CORE,
                "--gpu-memory / --gpu-memory-ratio need --gpu-core; --gpu N sets core and ratio",
            )
        req = GpuRequest(core=core, memory_bytes=memory, memory_ratio=ratio)
    validate(req)
    return req


def is_whole(req: GpuRequest) -> bool:
    """Whole-device requests (100, 200, ...) take entirely free devices."""
    return req.core % CORE_PER_DEVICE == 0


def devices_wanted(req: GpuRequest) -> int:
    return max(1, req.core // CORE_PER_DEVICE) if is_whole(req) else 1


def memory_needed(req: GpuRequest, total_mem: int) -> int:
    """Bytes the request needs on one device of `total_mem` bytes.

    For whole-device requests bytes and ratio are split evenly over the k devices
    (Koordinator divides a multi-device request per instance); they only decide
    which devices qualify, since a whole device carries all its memory.
    """
    k = devices_wanted(req)
    if req.memory_ratio is not None:
        return -(-total_mem * req.memory_ratio // (CORE_PER_DEVICE * k))
    if req.memory_bytes is not None:
        return -(-req.memory_bytes // k)
    return 0


def _valid(req: GpuRequest) -> bool:
    try:
        validate(req)
    except GpuRequestError:
        return False
    return True


# ------------------------------------------------------------ summary helpers


def _entirely_free(g: GpuDeviceFree) -> bool:
    return g.free_core >= CORE_PER_DEVICE and g.free_mem >= g.total_mem


def _slice_fits(req: GpuRequest, g: GpuDeviceFree) -> bool:
    return g.free_core >= req.core and g.free_mem >= memory_needed(req, g.total_mem)


def _whole_candidate(req: GpuRequest, g: GpuDeviceFree) -> bool:
    return _entirely_free(g) and memory_needed(req, g.total_mem) <= g.total_mem


def fits_summary(req: GpuRequest, gpus: Sequence[GpuDeviceFree]) -> bool:
    """Could a node with this load-report GPU summary host `req` right now?

    Mirrors `GpuAllocator.allocate` exactly (a property test holds them together),
    so placement can filter peers on their gossiped summary. An invalid request
    fits nowhere (False, never an exception).
    """
    if not _valid(req):
        return False
    if is_whole(req):
        return sum(1 for g in gpus if _whole_candidate(req, g)) >= devices_wanted(req)
    return any(_slice_fits(req, g) for g in gpus)


def largest_free_slice(gpus: Sequence[GpuDeviceFree]) -> tuple[int, int]:
    """(free core, free memory) of the device with the most free core (then memory);
    (0, 0) without GPUs. A scoring hint for placement."""
    best = (0, 0)
    for g in gpus:
        best = max(best, (g.free_core, g.free_mem))
    return best


def whole_free(gpus: Sequence[GpuDeviceFree]) -> int:
    """How many devices are entirely free (core and memory)."""
    return sum(1 for g in gpus if _entirely_free(g))


@attrs.frozen
class Fragmentation:
    """Free GPU capacity and the part of it that no waiting request can use."""

    free_core: int
    unusable_core: int
    free_mem: int
    unusable_mem: int

    @property
    def ratio(self) -> float:
        """Share of free core units that are stranded (0.0 when nothing is free)."""
        return self.unusable_core / self.free_core if self.free_core else 0.0


def fragmentation(gpus: Sequence[GpuDeviceFree], waiting: Iterable[GpuRequest]) -> Fragmentation:
    """Free capacity on devices that no request in `waiting` could use.

    A device counts as usable when some waiting slice fits on it, or when it is
    entirely free and enough entirely free devices exist for some waiting whole-GPU
    request. With nothing waiting, all free capacity is unusable by definition; the
    simulator passes its queue (or a representative request mix) as `waiting`.
    """
    reqs = [r for r in waiting if _valid(r)]
    n_whole = whole_free(gpus)
    free_core = unusable_core = free_mem = unusable_mem = 0
    for g in gpus:
        core, mem = max(0, g.free_core), max(0, g.free_mem)
        free_core += core
        free_mem += mem
        usable = False
        for r in reqs:
            if is_whole(r):
                if _whole_candidate(r, g) and n_whole >= devices_wanted(r):
                    usable = True
            elif _slice_fits(r, g):
                usable = True
            if usable:
                break
        if not usable:
            unusable_core += core
            unusable_mem += mem
    return Fragmentation(free_core, unusable_core, free_mem, unusable_mem)


# ------------------------------------------------------------------ allocator


class GpuAllocationError(ValueError):
    """A conflicting allocate (same task, different request) or a bad record."""


@attrs.frozen
class DeviceShare:
    """What one allocation holds on one device."""

    index: int
    core: int
    memory: int


@attrs.frozen
class Allocation:
    """A task's GPU holding, in the order devices are exposed to the process."""

    task_id: TaskId
    request: GpuRequest
    parts: tuple[DeviceShare, ...]

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(p.index for p in self.parts)

    def to_record(self) -> dict[str, Any]:
        """Plain data for the journal (msgpack/JSON friendly)."""
        return {
            "task": self.task_id,
            "request": {
                "core": self.request.core,
                "memory_bytes": self.request.memory_bytes,
                "memory_ratio": self.request.memory_ratio,
            },
            "parts": [[p.index, p.core, p.memory] for p in self.parts],
        }

    @classmethod
    def from_record(cls, rec: Any) -> Allocation:
        """Inverse of to_record; GpuAllocationError on anything malformed."""

        def as_int(v: Any, what: str, optional: bool = False) -> Any:
            if optional and v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int):
                raise GpuAllocationError(f"allocation record: {what} must be an integer")
            return v

        if not isinstance(rec, Mapping):
            raise GpuAllocationError("allocation record: expected a mapping")
        task = rec.get("task")
        req = rec.get("request")
        parts = rec.get("parts")
        if not isinstance(task, str) or not task:
            raise GpuAllocationError("allocation record: task must be a non-empty string")
        if not isinstance(req, Mapping):
            raise GpuAllocationError("allocation record: request must be a mapping")
        if not isinstance(parts, list | tuple) or not parts:
            raise GpuAllocationError("allocation record: parts must be a non-empty list")
        request = GpuRequest(
            core=as_int(req.get("core"), "request.core"),
            memory_bytes=as_int(req.get("memory_bytes"), "request.memory_bytes", True),
            memory_ratio=as_int(req.get("memory_ratio"), "request.memory_ratio", True),
        )
        shares = []
        for p in parts:
            if not isinstance(p, list | tuple) or len(p) != 3:
                raise GpuAllocationError("allocation record: part must be [index, core, memory]")
            shares.append(DeviceShare(*(as_int(x, "part") for x in p)))
        return cls(task, request, tuple(shares))


class GpuAllocator:
    """Per-node bookkeeping of core units and memory per device.

    Deterministic and I/O-free. `allocate` is idempotent per task id; `release`
    gives back exactly what the task held.

    Slice order: binpack takes the most-used device that fits (keeps whole devices
    free for whole-GPU jobs), spread the least-used (usage = used core fraction +
    used memory fraction). Ties go to the device least connected to the other
    entirely free devices, so well-connected free groups stay intact for
    multi-GPU work; then the lowest index.

    Whole-GPU requests take k entirely free devices minimising (max pairwise
    distance, sum of pairwise distances), then the set least connected to the free
    devices left behind (so a request does not split a larger free group when a
    smaller one fits), then the lowest indices.
    """

    # Exhaustive search up to this many candidate sets; greedy growth beyond.
    EXHAUSTIVE_LIMIT = 5000

    def __init__(self, devices: Iterable[GpuDevice]) -> None:
        self.topology = Topology(devices)
        self._free_core: dict[int, int] = {d.index: CORE_PER_DEVICE for d in self.devices}
        self._free_mem: dict[int, int] = {d.index: d.memory_bytes for d in self.devices}
        self._allocs: dict[TaskId, Allocation] = {}

    @property
    def devices(self) -> tuple[GpuDevice, ...]:
        return self.topology.devices

    def allocations(self) -> tuple[Allocation, ...]:
        return tuple(self._allocs.values())

    def get(self, task_id: TaskId) -> Allocation | None:
        return self._allocs.get(task_id)

    def summary(self) -> tuple[GpuDeviceFree, ...]:
        return tuple(
            GpuDeviceFree(
                d.index, self._free_core[d.index], self._free_mem[d.index], d.memory_bytes
            )
            for d in self.devices
        )

    def fits(self, req: GpuRequest) -> bool:
        return fits_summary(req, self.summary())

    # -- choice

    def _is_entirely_free(self, d: GpuDevice) -> bool:
        return (
            self._free_core[d.index] == CORE_PER_DEVICE
            and self._free_mem[d.index] == d.memory_bytes
        )

    def _usage(self, d: GpuDevice) -> float:
        used_core = (CORE_PER_DEVICE - self._free_core[d.index]) / CORE_PER_DEVICE
        used_mem = (d.memory_bytes - self._free_mem[d.index]) / d.memory_bytes
        return used_core + used_mem

    def _choose_slice(self, req: GpuRequest, policy: Policy) -> DeviceShare | None:
        fitting = [
            d
            for d in self.devices
            if self._free_core[d.index] >= req.core
            and self._free_mem[d.index] >= memory_needed(req, d.memory_bytes)
        ]
        if not fitting:
            return None
        free = [d.index for d in self.devices if self._is_entirely_free(d)]
        sign = -1.0 if policy == "binpack" else 1.0
        best = min(
            fitting,
            key=lambda d: (
                sign * self._usage(d),
                self.topology.closeness(d.index, free),
                d.index,
            ),
        )
        return DeviceShare(best.index, req.core, memory_needed(req, best.memory_bytes))

    def _choose_whole(self, req: GpuRequest) -> tuple[DeviceShare, ...] | None:
        k = devices_wanted(req)
        cands = [
            d.index
            for d in self.devices
            if self._is_entirely_free(d) and memory_needed(req, d.memory_bytes) <= d.memory_bytes
        ]
        if len(cands) < k:
            return None
        all_free = [d.index for d in self.devices if self._is_entirely_free(d)]
        topo = self.topology

        def key(s: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
            mx, total = topo.set_cost(s)
            rest = [i for i in all_free if i not in s]
            left = sum(topo.closeness(i, rest) for i in s)
            return (mx, total, left, s)

        if math.comb(len(cands), k) <= self.EXHAUSTIVE_LIMIT:
            sets: Iterable[tuple[int, ...]] = itertools.combinations(cands, k)
        else:
            sets = (self._grow(seed, cands, k) for seed in cands)
        best = min(sets, key=key)
        by_index = topo.by_index
        return tuple(DeviceShare(i, CORE_PER_DEVICE, by_index[i].memory_bytes) for i in best)

    def _grow(self, seed: int, cands: Sequence[int], k: int) -> tuple[int, ...]:
        """Greedy set growth from `seed` for inventories too large to enumerate."""
        chosen = [seed]
        topo = self.topology
        while len(chosen) < k:
            nxt = min(
                (c for c in cands if c not in chosen),
                key=lambda c: (
                    max(topo.distance(c, x) for x in chosen),
                    sum(topo.distance(c, x) for x in chosen),
                    c,
                ),
            )
            chosen.append(nxt)
        return tuple(sorted(chosen))

    # -- changes

    def allocate(
        self, task_id: TaskId, req: GpuRequest, policy: Policy = "binpack"
    ) -> Allocation | None:
        """Reserve GPUs for `task_id`; None when the request does not fit now.

        Raises GpuRequestError for an invalid request, GpuAllocationError when the
        task already holds an allocation for a different request. Asking again
        with the same request returns the existing allocation.
        """
        validate(req)
        if policy not in ("binpack", "spread"):
            raise ValueError(f"unknown GPU policy {policy!r} (binpack or spread)")
        held = self._allocs.get(task_id)
        if held is not None:
            if held.request != req:
                raise GpuAllocationError(
                    f"task {task_id} already holds GPUs for {held.request}, not {req}"
                )
            return held
        if is_whole(req):
            parts = self._choose_whole(req)
        else:
            one = self._choose_slice(req, policy)
            parts = None if one is None else (one,)
        if parts is None:
            return None
        alloc = Allocation(task_id, req, parts)
        self._take(alloc)
        return alloc

    def _take(self, alloc: Allocation) -> None:
        for p in alloc.parts:
            self._free_core[p.index] -= p.core
            self._free_mem[p.index] -= p.memory
        self._allocs[alloc.task_id] = alloc

    def release(self, task_id: TaskId) -> Allocation | None:
        """Give back what `task_id` held; None (and no change) if it held nothing."""
        alloc = self._allocs.pop(task_id, None)
        if alloc is None:
            return None
        for p in alloc.parts:
            self._free_core[p.index] += p.core
            self._free_mem[p.index] += p.memory
        return alloc

    def _restore_problem(self, alloc: Allocation) -> str | None:
        held = self._allocs.get(alloc.task_id)
        if held is not None:
            return None if held == alloc else "task already holds a different allocation"
        if not alloc.parts:
            return "no devices"
        if len(set(alloc.indices)) != len(alloc.parts):
            return "a device appears twice"
        for p in alloc.parts:
            dev = self.topology.by_index.get(p.index)
            if dev is None:
                return f"device {p.index} is not in this node's inventory"
            if not (0 < p.core <= CORE_PER_DEVICE) or not (0 <= p.memory <= dev.memory_bytes):
                return f"device {p.index}: core {p.core} / memory {p.memory} out of range"
            if p.core > self._free_core[p.index] or p.memory > self._free_mem[p.index]:
                return f"device {p.index}: not enough free core or memory left"
        return None

    def restore(self, allocations: Iterable[Allocation]) -> tuple[tuple[TaskId, str], ...]:
        """Re-apply journaled allocations after an agent restart.

        Returns the (task id, reason) of allocations that cannot be honoured any
        more (device gone, smaller memory, overlapping records): the caller
        requeues or fails those tasks instead of the agent crashing.
        Already-present identical allocations are accepted (idempotent).
        """
        refused: list[tuple[TaskId, str]] = []
        for alloc in allocations:
            problem = self._restore_problem(alloc)
            if problem is not None:
                refused.append((alloc.task_id, problem))
            elif alloc.task_id not in self._allocs:
                self._take(alloc)
        return tuple(refused)


# ------------------------------------------------------------------ environment

MIB = 2**20


def env_for(
    allocation: Allocation,
    devices: Iterable[GpuDevice] | Mapping[int, GpuDevice],
    mps: bool,
) -> dict[str, str]:
    """Environment for the task's process.

    CUDA_VISIBLE_DEVICES lists UUIDs (robust against index remapping under MPS),
    in allocation order; the SWARM_GPU_* values are comma-separated in that same
    order. With MPS, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps compute and
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT caps memory as "<ordinal>=<MiB>M" entries,
    where the ordinal is the device's position as the process sees it (0, 1, ...
    after CUDA_VISIBLE_DEVICES), rounded down to whole MiB (at least 1M).
    """
    by_index = devices if isinstance(devices, Mapping) else {d.index: d for d in devices}
    parts = allocation.parts
    missing = [p.index for p in parts if p.index not in by_index]
    if missing:
        raise GpuAllocationError(f"allocation names unknown devices {missing}")
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(by_index[p.index].uuid for p in parts),
        "SWARM_GPU_DEVICES": ",".join(str(p.index) for p in parts),
        "SWARM_GPU_CORE": ",".join(str(p.core) for p in parts),
        "SWARM_GPU_MEMORY": ",".join(str(p.memory) for p in parts),
    }
    if mps:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(p.core for p in parts))
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{ordinal}={max(1, p.memory // MIB)}M" for ordinal, p in enumerate(parts)
        )
    return env
