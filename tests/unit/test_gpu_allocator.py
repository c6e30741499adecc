"""GPU allocator: never over-allocates, releases exactly, topology-aware, restorable."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.model import GpuDeviceFree, GpuRequest
from swarm.policy import gpu
from swarm.policy.gpu import (
    Allocation,
    DeviceShare,
    GpuAllocationError,
    GpuAllocator,
    GpuDevice,
    GpuRequestError,
    env_for,
    fits_summary,
    fragmentation,
    largest_free_slice,
    memory_needed,
    whole_free,
)

GiB = 2**30


def eight_gpus(mem: int = 80 * GiB) -> list[GpuDevice]:
    """Two NVLink groups of 4 (one per NUMA node), PCIe switches in pairs."""
    return [
        GpuDevice(
            index=i,
            uuid=f"GPU-{i}",
            minor=i,
            memory_bytes=mem,
            numa_node=i // 4,
            pcie_switch=f"sw{i // 2}",
            nvlink_group=f"nvl{i // 4}",
        )
        for i in range(8)
    ]


@st.composite
def inventories(draw: st.DrawFn, max_devices: int = 6) -> list[GpuDevice]:
    n = draw(st.integers(1, max_devices))
    mems = st.sampled_from([16 * GiB, 40 * GiB, 80 * GiB, 1000, 7])
    return [
        GpuDevice(
            index=i,
            uuid=f"GPU-{i}",
            minor=i,
            memory_bytes=draw(mems),
            numa_node=draw(st.none() | st.integers(0, 1)),
            pcie_switch=draw(st.none() | st.sampled_from(["a", "b", "c"])),
            nvlink_group=draw(st.none() | st.sampled_from(["x", "y"])),
        )
        for i in range(n)
    ]


def requests(max_whole: int = 4) -> st.SearchStrategy[GpuRequest]:
    slices = st.builds(
        GpuRequest,
        core=st.integers(1, 100),
        memory_ratio=st.integers(1, 100),
    ) | st.builds(
        GpuRequest,
        core=st.integers(1, 99),
        memory_bytes=st.integers(1, 90 * GiB),
    )

    @st.composite
    def whole(draw: st.DrawFn) -> GpuRequest:
        k = draw(st.integers(1, max_whole))
        if draw(st.booleans()):
            return GpuRequest(core=100 * k, memory_ratio=100 * draw(st.integers(1, k)))
        return GpuRequest(core=100 * k, memory_bytes=draw(st.integers(1, 100 * GiB * k)))

    return st.one_of(slices, whole())


def usage(g: GpuDeviceFree) -> float:
    return (100 - g.free_core) / 100 + (g.total_mem - g.free_mem) / g.total_mem


def check_books(alloc: GpuAllocator) -> None:
    """Free + held == capacity on every device, and nothing is negative."""
    core_held: Counter[int] = Counter()
    mem_held: Counter[int] = Counter()
    for a in alloc.allocations():
        assert len(set(a.indices)) == len(a.parts)
        for p in a.parts:
            core_held[p.index] += p.core
            mem_held[p.index] += p.memory
    for g in alloc.summary():
        assert 0 <= g.free_core <= 100
        assert 0 <= g.free_mem <= g.total_mem
        assert g.free_core + core_held[g.index] == 100
        assert g.free_mem + mem_held[g.index] == g.total_mem


ops = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "alloc", "release"]),
        requests(),
        st.sampled_from(["binpack", "spread"]),
        st.integers(0, 30),
    ),
    max_size=40,
)


@settings(max_examples=120, deadline=None)
@given(inventories(), ops)
def test_random_sequences_never_over_allocate(
    devices: list[GpuDevice], steps: list[tuple[str, GpuRequest, gpu.Policy, int]]
) -> None:
    alloc = GpuAllocator(devices)
    for kind, req, policy, n in steps:
        before = {g.index: g for g in alloc.summary()}
        if kind == "alloc":
            task = f"t{n}"
            held = alloc.get(task)
            if held is not None and held.request != req:
                with pytest.raises(GpuAllocationError):
                    alloc.allocate(task, req, policy)
                continue
            got = alloc.allocate(task, req, policy)
            if held is not None:
                assert got == held
                assert {g.index: g for g in alloc.summary()} == before
                continue
            # The gossiped summary predicts the allocator exactly.
            assert (got is not None) == fits_summary(req, tuple(before.values()))
            if got is None:
                assert {g.index: g for g in alloc.summary()} == before
                continue
            assert got.task_id == task and got.request == req
            if gpu.is_whole(req):
                assert len(got.parts) == req.core // 100
                for p in got.parts:
                    b = before[p.index]
                    assert b.free_core == 100 and b.free_mem == b.total_mem
                    assert p.core == 100 and p.memory == b.total_mem
            else:
                (p,) = got.parts
                b = before[p.index]
                assert p.core == req.core
                assert p.memory == memory_needed(req, b.total_mem)
                fitting = [
                    g
                    for g in before.values()
                    if g.free_core >= req.core and g.free_mem >= memory_needed(req, g.total_mem)
                ]
                pick = max if policy == "binpack" else min
                assert usage(b) == usage(pick(fitting, key=usage))
        else:
            victims = [a.task_id for a in alloc.allocations()]
            task = victims[n % len(victims)] if victims else f"t{n}"
            gone = alloc.release(task)
            assert alloc.get(task) is None
            after = {g.index: g for g in alloc.summary()}
            if gone is None:
                assert after == before
            else:
                freed_core: Counter[int] = Counter()
                freed_mem: Counter[int] = Counter()
                for p in gone.parts:
                    freed_core[p.index] += p.core
                    freed_mem[p.index] += p.memory
                for i, g in after.items():
                    assert g.free_core == before[i].free_core + freed_core[i]
                    assert g.free_mem == before[i].free_mem + freed_mem[i]
            assert alloc.release(task) is None  # idempotent
        check_books(alloc)


def group_of(i: int) -> int:
    return i // 4


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 7), st.integers(1, 100)), max_size=8),
    st.integers(1, 4),
)
def test_whole_gpus_stay_in_one_nvlink_group_when_possible(
    occupied: list[tuple[int, int]], k: int
) -> None:
    alloc = GpuAllocator(eight_gpus())
    # Occupy some devices with slices restored straight onto them.
    restored = [
        Allocation(f"o{n}", GpuRequest(core=c, memory_ratio=c), (DeviceShare(i, c, c * GiB // 2),))
        for n, (i, c) in enumerate(occupied)
    ]
    alloc.restore(restored)
    summary = alloc.summary()
    free = [g.index for g in summary if g.free_core == 100 and g.free_mem == g.total_mem]
    got = alloc.allocate("w", GpuRequest(core=100 * k, memory_ratio=100 * k))
    assert (got is None) == (len(free) < k)
    if got is None:
        return
    assert set(got.indices) <= set(free)
    per_group = Counter(group_of(i) for i in free)
    if any(n >= k for n in per_group.values()):
        assert len({group_of(i) for i in got.indices}) == 1
        # And it takes from the tighter group when both could serve it.
        chosen = group_of(got.indices[0])
        assert per_group[chosen] == min(n for n in per_group.values() if n >= k)
    check_books(alloc)


def test_two_gpus_prefer_smaller_free_group_and_same_switch() -> None:
    alloc = GpuAllocator(eight_gpus())
    assert alloc.allocate("a", GpuRequest(core=200, memory_ratio=200)) is not None
    got = alloc.allocate("b", GpuRequest(core=200, memory_ratio=200))
    assert got is not None
    # Group 0 has devices 2,3 left (same switch, NVLink): taking them keeps group 1 whole.
    assert got.indices == (2, 3)
    got = alloc.allocate("c", GpuRequest(core=400, memory_ratio=400))
    assert got is not None and got.indices == (4, 5, 6, 7)
    assert alloc.allocate("d", GpuRequest(core=100, memory_ratio=100)) is None


def test_pcie_switch_beats_numa_beats_system() -> None:
    devs = [
        GpuDevice(0, "G0", 0, GiB, numa_node=0, pcie_switch="s0"),
        GpuDevice(1, "G1", 1, GiB, numa_node=0, pcie_switch="s1"),
        GpuDevice(2, "G2", 2, GiB, numa_node=1, pcie_switch="s2"),
        GpuDevice(3, "G3", 3, GiB, numa_node=1, pcie_switch="s2"),
        GpuDevice(4, "G4", 4, GiB, numa_node=2),
    ]
    alloc = GpuAllocator(devs)
    assert alloc.topology.distance(2, 3) == gpu.Link.PCIE_SWITCH
    assert alloc.topology.distance(0, 1) == gpu.Link.NUMA
    assert alloc.topology.distance(0, 4) == gpu.Link.SYSTEM
    assert alloc.topology.distance(4, 4) == gpu.Link.SAME
    two = GpuRequest(core=200, memory_ratio=200)
    assert alloc.allocate("a", two).indices == (2, 3)  # type: ignore[union-attr]
    assert alloc.allocate("b", two).indices == (0, 1)  # type: ignore[union-attr]
    assert alloc.allocate("c", GpuRequest(core=100, memory_ratio=100)).indices == (4,)  # type: ignore[union-attr]


def test_greedy_search_on_large_inventory() -> None:
    devs = [
        GpuDevice(i, f"G{i}", i, GiB, numa_node=i // 8, nvlink_group=f"n{i // 8}")
        for i in range(16)
    ]
    alloc = GpuAllocator(devs)
    got = alloc.allocate("a", GpuRequest(core=800, memory_ratio=800))
    assert got is not None and {i // 8 for i in got.indices} == {0}
    got = alloc.allocate("b", GpuRequest(core=800, memory_ratio=800))
    assert got is not None and {i // 8 for i in got.indices} == {1}


def test_binpack_packs_and_spread_spreads() -> None:
    half = GpuRequest(core=30, memory_ratio=30)
    packed = GpuAllocator(eight_gpus())
    a = packed.allocate("a", half)
    b = packed.allocate("b", half)
    assert a is not None and b is not None and a.indices == b.indices
    spread = GpuAllocator(eight_gpus())
    a = spread.allocate("a", half, "spread")
    b = spread.allocate("b", half, "spread")
    assert a is not None and b is not None and a.indices != b.indices
    # Spread's tie-break keeps the untouched NVLink group whole: the second slice
    # goes next to the first (its group is already broken), not into group 1.
    assert group_of(a.indices[0]) == group_of(b.indices[0])
    assert whole_free(spread.summary()) == 6


def test_single_whole_gpu_takes_worst_connected_device() -> None:
    devs = [*eight_gpus(), GpuDevice(8, "lonely", 8, 80 * GiB, numa_node=2)]
    alloc = GpuAllocator(devs)
    got = alloc.allocate("a", GpuRequest(core=100, memory_ratio=100))
    assert got is not None and got.indices == (8,)
    got = alloc.allocate("b", GpuRequest(core=10, memory_ratio=10))
    assert got is not None and got.indices == (0,)


def test_memory_bytes_and_ratio_are_per_device() -> None:
    devs = [GpuDevice(0, "A", 0, 16 * GiB), GpuDevice(1, "B", 1, 80 * GiB)]
    alloc = GpuAllocator(devs)
    got = alloc.allocate("a", GpuRequest(core=10, memory_bytes=20 * GiB))
    assert got is not None and got.parts == (DeviceShare(1, 10, 20 * GiB),)
    got = alloc.allocate("b", GpuRequest(core=10, memory_ratio=50))
    assert got is not None and got.parts == (DeviceShare(1, 10, 40 * GiB),)
    # Too big for any device.
    assert alloc.allocate("c", GpuRequest(core=10, memory_bytes=81 * GiB)) is None
    # Whole-GPU requests split bytes per device: 2 x 40 GiB only fits... nowhere now.
    assert alloc.allocate("d", GpuRequest(core=200, memory_bytes=20 * GiB)) is None
    alloc.release("a")
    alloc.release("b")
    got = alloc.allocate("d", GpuRequest(core=200, memory_bytes=20 * GiB))
    assert got is not None and got.parts == (
        DeviceShare(0, 100, 16 * GiB),
        DeviceShare(1, 100, 80 * GiB),
    )
    assert alloc.allocate("e", GpuRequest(core=200, memory_bytes=40 * GiB)) is None


def test_allocate_is_idempotent_and_rejects_conflicts() -> None:
    alloc = GpuAllocator(eight_gpus())
    req = GpuRequest(core=50, memory_ratio=50)
    first = alloc.allocate("t", req)
    assert alloc.allocate("t", req, "spread") == first
    assert sum(g.free_core for g in alloc.summary()) == 750
    with pytest.raises(GpuAllocationError):
        alloc.allocate("t", GpuRequest(core=60, memory_ratio=60))
    with pytest.raises(GpuRequestError):
        alloc.allocate("u", GpuRequest(core=50))
    with pytest.raises(ValueError, match="unknown GPU policy"):
        alloc.allocate("u", req, "random")  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None)
@given(inventories(), st.lists(st.tuples(requests(), st.sampled_from(["binpack", "spread"]))))
def test_restore_round_trip(
    devices: list[GpuDevice], reqs: list[tuple[GpuRequest, gpu.Policy]]
) -> None:
    alloc = GpuAllocator(devices)
    for n, (req, policy) in enumerate(reqs):
        alloc.allocate(f"t{n}", req, policy)
    records = [a.to_record() for a in alloc.allocations()]
    fresh = GpuAllocator(devices)
    assert fresh.restore(Allocation.from_record(r) for r in records) == ()
    assert fresh.summary() == alloc.summary()
    assert set(fresh.allocations()) == set(alloc.allocations())
    # Restoring twice is harmless.
    assert fresh.restore(alloc.allocations()) == ()
    assert fresh.summary() == alloc.summary()
    check_books(fresh)


def test_restore_refuses_what_no_longer_fits() -> None:
    alloc = GpuAllocator(eight_gpus()[:2])
    whole = GpuRequest(core=100, memory_ratio=100)
    ok = Allocation("a", whole, (DeviceShare(0, 100, 80 * GiB),))
    clash = Allocation("b", whole, (DeviceShare(0, 100, 80 * GiB),))
    gone = Allocation("c", whole, (DeviceShare(5, 100, 80 * GiB),))
    twice = Allocation("d", whole, (DeviceShare(1, 50, GiB), DeviceShare(1, 50, GiB)))
    silly = Allocation("e", whole, (DeviceShare(1, 500, GiB),))
    other = Allocation("a", whole, (DeviceShare(1, 100, 80 * GiB),))
    refused = dict(alloc.restore([ok, clash, gone, twice, silly, other]))
    assert set(refused) == {"b", "c", "d", "e", "a"}
    assert "not enough free" in refused["b"]
    assert "not in this node's inventory" in refused["c"]
    assert "twice" in refused["d"]
    assert "out of range" in refused["e"]
    assert "different allocation" in refused["a"]
    assert alloc.get("a") == ok
    check_books(alloc)


@pytest.mark.parametrize(
    "rec",
    [
        None,
        [],
        {"task": "", "request": {"core": 1}, "parts": [[0, 1, 1]]},
        {"task": "t", "request": [], "parts": [[0, 1, 1]]},
        {"task": "t", "request": {"core": "1"}, "parts": [[0, 1, 1]]},
        {"task": "t", "request": {"core": 1}, "parts": []},
        {"task": "t", "request": {"core": 1}, "parts": [[0, 1]]},
        {"task": "t", "request": {"core": 1}, "parts": [[0, True, 1]]},
    ],
)
def test_bad_records_raise_typed_errors(rec: object) -> None:
    with pytest.raises(GpuAllocationError):
        Allocation.from_record(rec)


def test_env_for_slice_and_whole() -> None:
    devs = eight_gpus()
    alloc = GpuAllocator(devs)
    s = alloc.allocate("s", GpuRequest(core=25, memory_bytes=10 * GiB + 123))
    assert s is not None
    env = env_for(s, devs, mps=False)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-0",
        "SWARM_GPU_DEVICES": "0",
        "SWARM_GPU_CORE": "25",
        "SWARM_GPU_MEMORY": str(10 * GiB + 123),
    }
    env = env_for(s, {d.index: d for d in devs}, mps=True)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    w = alloc.allocate("w", GpuRequest(core=200, memory_ratio=200))
    assert w is not None
    env = env_for(w, devs, mps=True)
    # Group 0 is already broken by the slice on GPU 0, so the pair comes from there.
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1,GPU-2"
    assert env["SWARM_GPU_DEVICES"] == "1,2"
    assert env["SWARM_GPU_CORE"] == "100,100"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    # Ordinals are as the process sees them after CUDA_VISIBLE_DEVICES.
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=81920M,1=81920M"
    with pytest.raises(GpuAllocationError):
        env_for(w, devs[:2], mps=False)


def test_summary_helpers() -> None:
    alloc = GpuAllocator(eight_gpus()[:3])
    assert largest_free_slice(()) == (0, 0)
    assert whole_free(alloc.summary()) == 3
    alloc.allocate("a", GpuRequest(core=60, memory_ratio=20))
    alloc.allocate("b", GpuRequest(core=100, memory_ratio=100))
    alloc.allocate("c", GpuRequest(core=100, memory_ratio=100))
    assert whole_free(alloc.summary()) == 0
    assert largest_free_slice(alloc.summary()) == (40, 64 * GiB)
    assert not fits_summary(GpuRequest(core=50), alloc.summary())  # invalid: never fits
    assert fits_summary(GpuRequest(core=40, memory_ratio=80), alloc.summary())
    assert not fits_summary(GpuRequest(core=41, memory_ratio=10), alloc.summary())


def test_fragmentation() -> None:
    t = 80 * GiB
    gpus = (
        GpuDeviceFree(0, 10, 8 * GiB, t),  # a 10% sliver
        GpuDeviceFree(1, 50, 40 * GiB, t),
        GpuDeviceFree(2, 100, t, t),
    )
    f = fragmentation(gpus, [GpuRequest(core=40, memory_ratio=40)])
    assert (f.free_core, f.unusable_core) == (160, 10)
    assert f.unusable_mem == 8 * GiB
    assert f.ratio == pytest.approx(10 / 160)
    # A two-GPU job cannot use anything: only one device is entirely free.
    f = fragmentation(gpus, [GpuRequest(core=200, memory_ratio=200)])
    assert f.unusable_core == 160 and f.ratio == 1.0
    f = fragmentation(gpus, [GpuRequest(core=100, memory_ratio=100)])
    assert f.unusable_core == 60
    assert fragmentation(gpus, []).ratio == 1.0
    assert fragmentation((), [GpuRequest(core=1, memory_ratio=1)]).ratio == 0.0
    # Invalid requests in the queue are ignored, not fatal.
    assert fragmentation(gpus, [GpuRequest(core=0)]).unusable_core == 160
