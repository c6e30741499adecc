"""Could any node of the cluster ever run a task? (pure; the submit path asks it)

A task that asks for more CPU, memory or GPU than any machine has would otherwise be
accepted and stay queued forever with no word. The agent refuses it at submit instead,
with the reason, but only when it is sure: every live member's capacity must be known
(from its gossiped load report; the node's own counts too) and none of them could host
the request even when entirely idle. A live member whose report has not arrived yet,
or that does not report a capacity (0 = not reported), could be the one that fits, so
the answer is then "maybe" (None) and the task is accepted as before.

Capacity, not current load: a busy node frees up, a drained node can be undrained,
so only what a node has at all (cores, total memory, GPU devices and their memory,
and its labels for hard constraints) decides here. Global tasks run on every node
as each one admits them; they are not checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from swarm.model import GpuDeviceFree, GpuRequest, LoadReport, NodeId, TaskSpec

from .constraints import unmet
from .gpu import fits_summary
from .placement import parsed


@attrs.frozen
class NodeCapacity:
    """What one node has at all, from its load report (0 = not reported)."""

    node: NodeId
    cpus: float = 0.0
    mem_total: int = 0
    gpus: tuple[GpuDeviceFree, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, r: LoadReport) -> NodeCapacity:
        return cls(r.node, r.cpus, r.mem_total, r.gpus, r.labels)


def _idle(gpus: Sequence[GpuDeviceFree]) -> tuple[GpuDeviceFree, ...]:
    """The same devices with nothing allocated on them."""
    return tuple(attrs.evolve(g, free_core=100, free_mem=g.total_mem) for g in gpus)


def why_not(spec: TaskSpec, cap: NodeCapacity) -> str | None:
    """None when `cap` could host `spec` once idle, else why not (one short clause).
    Hard constraints count as capacity: labels change only when an operator edits them."""
    if spec.constraints:
        why = unmet(parsed(spec.constraints), dict(cap.labels))
        if why is not None:
            return why
    if spec.cpu is not None and spec.cpu > 0 and cap.cpus > 0 and spec.cpu > cap.cpus:
        return f"wants {spec.cpu:g} cores, has {cap.cpus:g}"
    if spec.mem is not None and spec.mem > 0 and cap.mem_total > 0 and spec.mem > cap.mem_total:
        return f"wants {spec.mem} bytes of memory, has {cap.mem_total}"
    if spec.gpu is not None and not fits_summary(spec.gpu, _idle(cap.gpus)):
        return f"wants GPU {_gpu_text(spec.gpu)}, has {_gpus_text(cap.gpus)}"
    return None


def _gpu_text(g: GpuRequest) -> str:
    mem = ""
    if g.memory_bytes is not None:
        mem = f", {g.memory_bytes} bytes"
    elif g.memory_ratio is not None:
        mem = f", memory {g.memory_ratio}%"
    return f"{g.core}%{mem}"


def _gpus_text(gpus: Sequence[GpuDeviceFree]) -> str:
    if not gpus:
        return "no GPUs"
    return f"{len(gpus)} GPU(s) of at most {max(g.total_mem for g in gpus)} bytes"


def asks_for_something(spec: TaskSpec) -> bool:
    """Could some node lack what `spec` asks for? (False: the common, fast case.)"""
    return not spec.is_global and (
        spec.cpu is not None
        or spec.mem is not None
        or spec.gpu is not None
        or bool(spec.constraints)
    )


def unsatisfiable(
    spec: TaskSpec, own: NodeCapacity, peers: Iterable[NodeCapacity | None]
) -> str | None:
    """Why no node could ever run `spec`, or None when one could (or might).

    `own` is this node's capacity; `peers` holds one entry per other live member
    (alive or suspect): its capacity, or None while its report is unknown. Any
    unknown member, or any node that could host the task, answers None.
    """
    if not asks_for_something(spec):
        return None
    reasons: list[str] = []
    for cap in (own, *peers):
        if cap is None:
            return None
        why = why_not(spec, cap)
        if why is None:
            return None
        reasons.append(f"{cap.node}: {why}")
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    n = len(reasons)
    return f"no node of the cluster could ever run this task ({n} known node(s): {shown})"
