"""Where a gang's members go, and how many a node can take now (issue 22, pure).

The home asks for a node per member at the start of each round. Each member takes
the better of two nodes sampled among those with room left (room counted down as
members are placed), as single tasks do; with fewer sampled nodes than two, or a
cluster that has room only in a few places, it still finds them, since only nodes
with room are sampled. No room for every member: None, and the home backs off
(the room it read is as stale as gossip; the nodes' own checks decide).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from .. import model as m
from . import constraints as cons
from . import gpu as gpupol


def gpu_room(devices: Sequence[m.GpuDeviceFree], gpu: m.GpuRequest) -> int:
    """How many members, each asking `gpu`, the devices' free parts take now."""
    if gpupol.is_whole(gpu):
        return gpupol.whole_free(devices) // max(1, gpupol.devices_wanted(gpu))
    total = 0
    for d in devices:
        need = gpupol.memory_needed(gpu, d.total_mem)
        by_core = d.free_core // gpu.core if gpu.core > 0 else 0
        by_mem = d.free_mem // need if need > 0 else by_core
        total += max(0, min(by_core, by_mem))
    return total


def report_room(
    r: m.LoadReport, spec: m.TaskSpec, constraints: Sequence[cons.Constraint] = ()
) -> int:
    """How many members of `spec` a peer could take now, as its report says."""
    if r.shares <= 0:  # draining
        return 0
    if constraints and cons.unmet(constraints, dict(r.labels)) is not None:
        return 0
    room = r.slots - r.running - r.queued
    if spec.gpu is not None:
        room = min(room, gpu_room(r.gpus, spec.gpu))
    if spec.mem and r.mem_available > 0:
        room = min(room, r.mem_available // spec.mem)
    if spec.cpu and r.cpus > 0:
        room = min(room, math.floor(r.cpus / spec.cpu + 1e-9))
    return max(room, 0)


def place_members(
    size: int, candidates: Sequence[tuple[m.NodeId, int]], rng: random.Random, d: int = 2
) -> tuple[list[m.NodeId] | None, str]:
    """A node for each of `size` members (by slot), or None and why not."""
    room = {n: k for n, k in candidates if k > 0}
    total = sum(room.values())
    if total < size:
        return None, f"room for {total} of {size} members on {len(room)} nodes"
    out: list[m.NodeId] = []
    for _ in range(size):
        open_ = sorted(n for n, k in room.items() if k > 0)
        pick = rng.sample(open_, min(d, len(open_)))
        best = max(pick, key=lambda n: (room[n], n))
        room[best] -= 1
        out.append(best)
    return out, ""
