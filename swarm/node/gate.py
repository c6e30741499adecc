"""The start gate: may a queued local task start now? Shares, reservations, drain,
the handoff being settled, and a GPU slice. The only place where a chaos test switch
(`breaks`, from the runtime's test-only settings) may let a forbidden start through.

A task let through has its shares taken here, not when its process starts: one
dispatch pass lets several queued tasks through before any of them runs, and each
must see the reservations of those let through before it.
"""

from __future__ import annotations

from collections.abc import Collection

from .. import model as m
from ..cluster import handoff as h
from ..policy import gpu as gpupol
from ..policy import shares as sh
from . import events as ev
from .recovery import GPU


def can_start(
    task: m.Task,
    node: m.NodeId,
    guest: h.GuestSide,
    ledger: sh.ShareLedger,
    gpus: gpupol.GpuAllocator,
    gpu_policy: str,
    breaks: Collection[str] = (),
) -> tuple[str | None, list[ev.Instruction]]:
    """(why the task must not start now, or None: go; what to journal and log)."""
    if task.spec.home != node and not task.spec.is_global and not guest.may_run(task.id):
        return "handoff not settled", []
    if task.id not in ledger:
        ledger.add(task.spec)
    out: list[ev.Instruction] = []
    why = ledger.refuse_start(task.id)
    if why is None and task.spec.gpu is not None:
        why, out = allocate_gpu(task, gpus, gpu_policy)
    if why is None:
        ledger.start(task.id)
    elif ("ignore-drain" if ledger.draining else "oversubscribe") in breaks:
        return None, out  # TEST-ONLY: the chaos suite's self-test (swarm/testbreak.py)
    return why, out


def allocate_gpu(
    task: m.Task, gpus: gpupol.GpuAllocator, policy: str
) -> tuple[str | None, list[ev.Instruction]]:
    assert task.spec.gpu is not None
    if gpus.get(task.id) is not None:
        return None, []
    try:
        a = gpus.allocate(task.id, task.spec.gpu, "spread" if policy == "spread" else "binpack")
    except (gpupol.GpuRequestError, gpupol.GpuAllocationError) as e:
        return f"gpu request cannot be met here: {e}", []
    if a is None:
        core, mem = gpupol.largest_free_slice(gpus.summary())
        return f"waiting for a GPU slice (largest free {core}% core, {mem} bytes)", []
    return None, [
        ev.Persist((ev.Put(GPU + task.id, a.to_record()),)),
        ev.log("info", "gpu.allocated", task=task.id, devices=",".join(map(str, a.indices))),
        ev.LoadChanged(),
    ]


def release_gpu(tid: m.TaskId, gpus: gpupol.GpuAllocator) -> list[ev.Instruction]:
    if gpus.release(tid) is None:
        return []
    return [ev.Persist((ev.Delete(GPU + tid),)), ev.log("info", "gpu.released", task=tid)]
