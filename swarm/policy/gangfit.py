"""Can a gang ever fit? (issue 22, pure): the submit-time check on gossiped capacity.

`swarm submit --gang N` is refused at once when N members could not run together
even on an empty cluster: each live node, as its latest load report describes it,
could take some number of members when nothing else runs there (its slots, its
usable cores, its memory and its GPUs, each divided by one member's demand), and the
nodes whose labels meet the gang's hard constraints together take fewer than N. A
gang that fits an empty cluster but not the current one is accepted and waits (its
home backs off, holding nothing); this check only catches the request that would
wait for ever.

The answer is as stale as gossip: a node that joined a moment ago is not counted,
so the check errs towards refusing a gang that needs the very last node; the reason
names the count, so the user can see why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .. import model as m
from . import constraints as cons


def gpu_members(devices: Sequence[m.GpuDeviceFree], gpu: m.GpuRequest) -> int:
    """How many members, each asking `gpu`, the devices take when all are free."""
    if gpu.core >= 100:  # whole devices, core // 100 of them per member
        return len(devices) // (gpu.core // 100)
    total = 0
    for d in devices:
        by_core = 100 // gpu.core
        if gpu.memory_bytes:
            need = gpu.memory_bytes
        elif gpu.memory_ratio:
            need = math.ceil(d.total_mem * gpu.memory_ratio / 100)
        else:
            need = 0
        by_mem = d.total_mem // need if need > 0 else by_core
        total += min(by_core, by_mem)
    return total


def members_when_empty(
    report: m.LoadReport, cpu: float = 0.0, mem: int = 0, gpu: m.GpuRequest | None = None
) -> int:
    """Members of this demand the node could run at once with nothing else running."""
    n = report.slots
    if cpu > 0 and report.cpus > 0:
        n = min(n, math.floor(report.cpus / cpu + 1e-9))
    if mem > 0 and report.mem_total > 0:
        n = min(n, report.mem_total // mem)
    if gpu is not None:
        n = min(n, gpu_members(report.gpus, gpu))
    return max(n, 0)


def never_fits(
    reports: Iterable[m.LoadReport],
    size: int,
    *,
    cpu: float = 0.0,
    mem: int = 0,
    gpu: m.GpuRequest | None = None,
    constraints: Sequence[cons.Constraint] = (),
) -> str:
    """'' when `size` members could run together on the live nodes as gossiped (were
    they empty); otherwise the reason, naming the field and the count."""
    room = 0
    eligible = 0
    for r in reports:
        if constraints and cons.unmet(constraints, dict(r.labels)) is not None:
            continue
        eligible += 1
        room += members_when_empty(r, cpu, mem, gpu)
        if room >= size:
            return ""
    nodes = f"{eligible} node" + ("" if eligible == 1 else "s")
    where = f"the {nodes} meeting its constraints" if constraints else f"the {nodes} alive"
    return (
        f"gang: {size} members can never run together: {where} could run {room} "
        "of them at once even if nothing else ran (slots, cores, memory and GPUs, "
        "as gossiped)"
    )
