"""Can a gang ever fit? (issue 22): the submit-time check on gossiped capacity."""

from __future__ import annotations

from swarm import model as m
from swarm.policy import constraints as cons
from swarm.policy import gangfit as gf

GIB = 1 << 30


def report(
    node: str, slots: int = 4, cpus: float = 4.0, mem: int = 16 * GIB, gpus: int = 0, labels=()
) -> m.LoadReport:
    devices = tuple(m.GpuDeviceFree(i, 100, 80 * GIB, 80 * GIB) for i in range(gpus))
    return m.LoadReport(
        node, 1, slots=slots, cpus=cpus, mem_total=mem, gpus=devices, labels=tuple(labels)
    )


def test_each_resource_bounds_the_members_of_an_empty_node() -> None:
    r = report("a", slots=8, cpus=4.0, mem=16 * GIB, gpus=2)
    assert gf.members_when_empty(r) == 8
    assert gf.members_when_empty(r, cpu=1.5) == 2  # 4 cores / 1.5
    assert gf.members_when_empty(r, cpu=1.0) == 4
    assert gf.members_when_empty(r, mem=5 * GIB) == 3
    assert gf.members_when_empty(r, gpu=m.GpuRequest(core=100)) == 2  # whole devices
    assert gf.members_when_empty(r, gpu=m.GpuRequest(core=200)) == 1
    assert gf.members_when_empty(r, gpu=m.GpuRequest(core=25)) == 8  # 4 slices a device, 8 slots
    assert (
        gf.members_when_empty(r, gpu=m.GpuRequest(core=10, memory_bytes=30 * GIB)) == 4
    )  # 2 a device by memory
    assert gf.members_when_empty(r, gpu=m.GpuRequest(core=10, memory_ratio=50)) == 4
    assert gf.members_when_empty(report("b", gpus=0), gpu=m.GpuRequest(core=50)) == 0


def test_a_gang_that_fits_an_empty_cluster_is_accepted_one_that_cannot_is_refused() -> None:
    nodes = [report(f"n{i}", slots=4, gpus=1) for i in range(4)]
    assert gf.never_fits(nodes, 16) == ""
    why = gf.never_fits(nodes, 17)
    assert why.startswith("gang: 17 members can never run together") and "could run 16" in why
    # one whole GPU per member: 4 devices in all
    assert gf.never_fits(nodes, 4, gpu=m.GpuRequest(core=100)) == ""
    assert "could run 4 of them" in gf.never_fits(nodes, 5, gpu=m.GpuRequest(core=100))


def test_only_nodes_that_meet_the_constraints_count() -> None:
    nodes = [report("a", labels=(("rack", "r1"),)), report("b", labels=(("rack", "r2"),))]
    c = cons.parse_constraints(["rack=r1"])
    assert gf.never_fits(nodes, 4, constraints=c) == ""
    why = gf.never_fits(nodes, 5, constraints=c)
    assert "the 1 node meeting its constraints could run 4" in why
    assert "the 0 nodes alive could run 0" in gf.never_fits([], 1)
