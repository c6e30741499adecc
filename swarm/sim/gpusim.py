"""GPU slicing in the cluster: allocation rate and fragmentation, binpack vs spread.

Nodes with 8 GPUs each (two NVLink groups of four, 80 GiB per device), tasks with
GPU requests where most are a fraction of one device (`workloads.gpu_jobs`). A task
is placed by the agent's rule (`node.decide.choose`, two choices): only nodes whose
gossiped GPU summary fits the request are sampled (`gpu.fits_summary` inside
`placement.refusal`). The target's start gate (`node.gate.allocate_gpu`, over its
`policy.gpu.GpuAllocator`) then picks the devices with the given policy (binpack: the
fullest device that fits; spread: the emptiest); `node.gate.release_gpu` frees them.
A task that fits nowhere waits in a FIFO queue that is retried whenever GPUs are freed.

Fragmentation is `policy.gpu.fragmentation` taken against the workload's request mix
and weighted by it: the free GPU compute that the next request, drawn from the mix,
could not use (the measure of Weng et al., ATC'23), as a share of all GPU compute. A
request that is waiting has, by construction, failed to fit the free capacity
(the queue is retried whenever GPUs free up), so the mix rather than the queue is
the yardstick. Sampled once per time unit and averaged.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Iterator, Sequence

import attrs

from swarm.model import GpuRequest, LoadReport, Task, TaskSpec
from swarm.node.decide import TWO_CHOICE, choose
from swarm.node.gate import allocate_gpu, release_gpu
from swarm.policy.gpu import (
    CORE_PER_DEVICE,
    GpuAllocator,
    GpuDevice,
    Policy,
    fragmentation,
)
from swarm.policy.placement import PlacementRetry, RetryPolicy
from swarm.policy.view import LoadView, PeerEntry

from .workloads import GPU_MIX, Job, gpu_jobs, mean_gpu_core

GIB = 1 << 30


def node_devices(count: int = 8, mem: int = 80 * GIB, group: int = 4) -> tuple[GpuDevice, ...]:
    return tuple(
        GpuDevice(
            index=i,
            uuid=f"GPU-{i:02d}",
            minor=i,
            memory_bytes=mem,
            numa_node=i // group,
            nvlink_group=f"nvl{i // group}",
        )
        for i in range(count)
    )


@attrs.frozen
class GpuSimConfig:
    policy: Policy = "binpack"
    nodes: int = 16
    gpus_per_node: int = 8
    offered: float = 1.0  # offered GPU-time / GPU capacity
    horizon: float = 400.0
    warmup: float = 80.0
    duration: tuple[float, float] = (10.0, 1.0)  # lognormal (median, sigma)
    mix: tuple[tuple[int, float], ...] = GPU_MIX
    scan: int = 64  # waiting tasks tried per scheduling pass
    seed: int = 0


@attrs.frozen
class GpuResult:
    policy: str
    allocation: float  # allocated gpu-core / total, time average
    fragmentation: float  # expected free core the next request cannot use / total core
    frag_of_free: float  # the same / free core
    whole_blocked: float  # free core on devices a whole-GPU request cannot use / free core
    placed: int  # tasks started after warm-up
    mean_wait: float  # time units from arrival to start
    wait_whole: float  # mean wait of whole-GPU (>= 100) requests
    wait_slice: float  # mean wait of fractional requests
    waiting: float  # tasks waiting, time average


class _GNode:
    __slots__ = ("alloc", "alloc_total", "id", "version", "weight")

    def __init__(self, i: int, devices: Sequence[GpuDevice]) -> None:
        self.id = f"g{i:03d}"
        self.alloc = GpuAllocator(devices)
        self.alloc_total = len(devices) * CORE_PER_DEVICE
        self.version = 0
        self.weight = 0.0


class GpuSim:
    def __init__(self, cfg: GpuSimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed * 31 + 5)
        devices = node_devices(cfg.gpus_per_node)
        self.nodes = [_GNode(i, devices) for i in range(cfg.nodes)]
        self.by_id = {n.id: n for n in self.nodes}
        self.view = LoadView()
        for n in self.nodes:
            self._publish(n, 0.0)
        capacity = cfg.nodes * cfg.gpus_per_node  # GPUs
        per_task = mean_gpu_core(cfg.mix) / CORE_PER_DEVICE
        mean_dur = cfg.duration[0] * math.exp(cfg.duration[1] ** 2 / 2)
        rate = cfg.offered * capacity / (per_task * mean_dur)
        self._jobs: Iterator[Job] = gpu_jobs(
            rate,
            random.Random(cfg.seed),
            until=cfg.horizon,
            duration=cfg.duration,
            mix=cfg.mix,
        )
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.waiting: deque[tuple[float, TaskSpec, Job]] = deque()
        self._front = LoadReport("frontend", 1, shares=0)
        self._mix = tuple((GpuRequest(core=c, memory_ratio=c), p) for c, p in cfg.mix)
        self._one_gpu = GpuRequest(core=CORE_PER_DEVICE, memory_ratio=CORE_PER_DEVICE)
        self._n = 0
        self._retry = RetryPolicy()

    def _push(self, t: float, kind: int, obj: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj))

    def _publish(self, n: _GNode, now: float) -> None:
        n.version += 1
        r = LoadReport(n.id, n.version, weight_sum=n.weight, gpus=n.alloc.summary())
        self.view.put(n.id, PeerEntry(r, now))

    def run(self) -> GpuResult:
        cfg = self.cfg
        total_core = cfg.nodes * cfg.gpus_per_node * CORE_PER_DEVICE
        alloc_sum = frag_sum = frag_free_sum = whole_sum = wait_sum = 0.0
        samples = 0
        waits: list[float] = []
        waits_whole: list[float] = []
        waits_slice: list[float] = []
        job = next(self._jobs, None)
        if job is not None:
            self._push(job.t, 0, job)
        t = math.ceil(cfg.warmup)
        while t < cfg.horizon:
            self._push(float(t), 2, None)
            t += 1
        while self._heap:
            now, _, kind, obj = heapq.heappop(self._heap)
            if now >= cfg.horizon:
                break
            if kind == 0:  # arrival
                assert isinstance(obj, Job)
                self._n += 1
                spec = TaskSpec(
                    id=f"t{self._n}", argv=(), gpu=obj.gpu, weight=obj.weight, submitted_at=now
                )
                nxt = next(self._jobs, None)
                if nxt is not None:
                    self._push(nxt.t, 0, nxt)
                # A newcomer may start at once (backfill); else it waits in line.
                if self._try_start(spec, obj, now):
                    self._record(now, now, spec, waits, waits_whole, waits_slice)
                else:
                    self.waiting.append((now, spec, obj))
                continue
            elif kind == 1:  # completion
                assert isinstance(obj, tuple)
                node, spec = obj
                release_gpu(spec.id, node.alloc)
                node.weight -= spec.weight
                self._publish(node, now)
            else:  # sample
                free_core = 0
                expected = 0.0
                whole = 0
                allocated = 0
                for n in self.nodes:
                    summary = n.alloc.summary()
                    for req, p in self._mix:
                        f = fragmentation(summary, (req,))
                        expected += p * f.unusable_core
                    free = sum(max(0, g.free_core) for g in summary)
                    free_core += free
                    allocated += n.alloc_total - free
                    whole += fragmentation(summary, (self._one_gpu,)).unusable_core
                alloc_sum += allocated / total_core
                frag_sum += expected / total_core
                frag_free_sum += expected / free_core if free_core else 0.0
                whole_sum += whole / free_core if free_core else 0.0
                wait_sum += len(self.waiting)
                samples += 1
                continue
            self._schedule(now, waits, waits_whole, waits_slice)
        s = max(1, samples)

        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else math.nan

        return GpuResult(
            policy=cfg.policy,
            allocation=alloc_sum / s,
            fragmentation=frag_sum / s,
            frag_of_free=frag_free_sum / s,
            whole_blocked=whole_sum / s,
            placed=len(waits),
            mean_wait=mean(waits),
            wait_whole=mean(waits_whole),
            wait_slice=mean(waits_slice),
            waiting=wait_sum / s,
        )

    def _record(
        self,
        arrived: float,
        now: float,
        spec: TaskSpec,
        waits: list[float],
        whole: list[float],
        part: list[float],
    ) -> None:
        if arrived >= self.cfg.warmup:
            waits.append(now - arrived)
            req = spec.gpu
            assert req is not None
            (whole if req.core >= CORE_PER_DEVICE else part).append(now - arrived)

    def _schedule(
        self, now: float, waits: list[float], whole: list[float], part: list[float]
    ) -> None:
        """GPUs were freed: try the oldest `scan` waiting tasks in order, start what
        fits. A request shape that found no node is not tried again in this pass."""
        cfg = self.cfg
        keep: deque[tuple[float, TaskSpec, Job]] = deque()
        tried = 0
        failed: set[GpuRequest] = set()
        while self.waiting:
            item = self.waiting.popleft()
            arrived, spec, job = item
            if tried >= cfg.scan or spec.gpu in failed:
                keep.append(item)
                continue
            tried += 1
            if not self._try_start(spec, job, now):
                assert spec.gpu is not None
                failed.add(spec.gpu)
                keep.append(item)
                continue
            self._record(arrived, now, spec, waits, whole, part)
        self.waiting = keep

    def _try_start(self, spec: TaskSpec, job: Job, now: float) -> bool:
        """The agent's placement (two choices on the gossiped GPU summaries), then its
        gate's GPU step at the target (`node.gate.allocate_gpu`: the slice, by the
        run's policy); a target without a slice refuses and the next try excludes it.
        After `max_tries` refusals the task waits in the queue for GPUs to free up (the
        agent would back off and place again: here the queue is retried on every
        release instead)."""
        task = Task(spec)
        retry = PlacementRetry()
        for _ in range(self._retry.max_tries):
            p = choose(TWO_CHOICE, 2, spec, self._front, self.view, self.rng, now, retry.exclude)
            if p.target is None:
                return False
            node = self.by_id[p.target]
            why, _ = allocate_gpu(task, node.alloc, self.cfg.policy)
            if why is None:
                node.weight += spec.weight
                self._publish(node, now)
                self._push(now + job.duration, 1, (node, spec))
                return True
            retry = retry.on_refusal(node.id, now, self._retry, self.rng)
        return False


def run_gpu(cfg: GpuSimConfig) -> GpuResult:
    return GpuSim(cfg).run()
