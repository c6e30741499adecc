"""GPU inventory from the agent config and from NVML-shaped data."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.policy import gpu_inventory
from swarm.policy.gpu import (
    GpuConfigError,
    GpuDevice,
    Link,
    Topology,
    devices_from_config,
    devices_from_nvml,
)

GiB = 2**30

CONFIG = """
[[gpu]]
id = 0
memory = "80GiB"
numa = 0
pcie_switch = "sw0"
nvlink_group = "a"

[[gpu]]
id = 1
uuid = "GPU-1234"
minor = 7
memory = 85899345920
numa = 0
pcie-switch = 0
nvlink-group = 1
"""


def test_config_tables() -> None:
    tables = tomllib.loads(CONFIG)["gpu"]
    devs = devices_from_config(tables, node="n1")
    assert devs == (
        GpuDevice(0, "GPU-fake-n1-0", 0, 80 * GiB, 0, "sw0", "a"),
        GpuDevice(1, "GPU-1234", 7, 80 * GiB, 0, "0", "1"),
    )
    topo = Topology(devs)
    assert topo.distance(0, 1) == Link.NUMA
    assert topo.set_cost([0, 1]) == (Link.NUMA, Link.NUMA)


def test_config_positions_are_default_indices() -> None:
    devs = devices_from_config([{"memory": "1G"}, {"memory": 5}], node="x")
    assert [(d.index, d.uuid, d.minor) for d in devs] == [
        (0, "GPU-fake-x-0", 0),
        (1, "GPU-fake-x-1", 1),
    ]


@pytest.mark.parametrize(
    ("tables", "key", "words"),
    [
        ({"memory": "1G"}, "gpu", "list of tables"),
        ([5], "gpu[0]", "expected a table"),
        ([{}], "gpu[0].memory", "required"),
        ([{"memory": "lots"}], "gpu[0].memory", "cannot read"),
        ([{"memory": "8 GB!"}], "gpu[0].memory", "cannot read"),
        ([{"memory": 0}], "gpu[0].memory", "positive"),
        ([{"memory": "1G", "colour": "red"}], "gpu[0].colour", "unknown key"),
        ([{"memory": "1G", "id": 0, "index": 0}], "gpu[0].index", "given twice"),
        ([{"memory": "1G", "id": -1}], "gpu[0].id", ">= 0"),
        ([{"memory": "1G", "id": "0"}], "gpu[0].id", "integer"),
        ([{"memory": "1G"}, {"memory": "1G", "id": 0}], "gpu[1].index", "used twice"),
        ([{"memory": "1G", "uuid": 5}], "gpu[0].uuid", "UUID string"),
        ([{"memory": "1G", "uuid": "a,b"}], "gpu[0].uuid", "UUID string"),
        (
            [{"memory": "1G", "uuid": "u"}, {"memory": "1G", "uuid": "u"}],
            "gpu[1].uuid",
            "used twice",
        ),
        ([{"memory": "1G", "numa": "zero"}], "gpu[0].numa", "integer"),
        ([{"memory": "1G", "minor": True}], "gpu[0].minor", "integer"),
        ([{"memory": "1G", "nvlink_group": ""}], "gpu[0].nvlink_group", "name or number"),
        ([{"memory": "1G", "pcie_switch": [1]}], "gpu[0].pcie_switch", "name or number"),
    ],
)
def test_config_errors_name_the_key(tables: Any, key: str, words: str) -> None:
    with pytest.raises(GpuConfigError) as info:
        devices_from_config(tables, node="n")
    assert info.value.key == key
    assert words in str(info.value)
    assert str(info.value).startswith(key)


scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4) | st.floats()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["id", "uuid", "memory", "numa", "pcie_switch", "nvlink_group", "x"]),
            scalars | st.just("1GiB"),
        ),
        max_size=4,
    )
)
def test_config_parser_only_raises_config_errors(tables: list[dict[str, Any]]) -> None:
    try:
        devs = devices_from_config(tables, node="n")
    except GpuConfigError:
        return
    assert len({d.index for d in devs}) == len(devs) == len(tables)
    assert all(d.memory_bytes > 0 for d in devs)


def nvml_info(n: int) -> list[dict[str, Any]]:
    return [
        {"index": i, "uuid": f"GPU-{i}", "minor": i, "memory": 80 * GiB, "numa": -1}
        for i in range(n)
    ]


def test_nvml_shaped_data() -> None:
    # A DGX-like box: 0-3 and 4-7 NVLinked; pairs under one switch; sockets 0/1.
    def level(i: int, j: int) -> int:
        if i == j:
            return gpu_inventory.NVML_TOPOLOGY_INTERNAL
        if i // 2 == j // 2:
            return gpu_inventory.NVML_TOPOLOGY_SINGLE
        if i // 4 == j // 4:
            return gpu_inventory.NVML_TOPOLOGY_NODE
        return gpu_inventory.NVML_TOPOLOGY_SYSTEM

    levels = [[level(i, j) for j in range(8)] for i in range(8)]
    links = [[12 if i != j and i // 4 == j // 4 else 0 for j in range(8)] for i in range(8)]
    devs = devices_from_nvml(nvml_info(8), levels, links)
    assert [d.nvlink_group for d in devs] == ["nvl0"] * 4 + ["nvl4"] * 4
    assert [d.pcie_switch for d in devs] == ["sw0", "sw0", "sw2", "sw2", "sw4", "sw4", "sw6", "sw6"]
    assert [d.numa_node for d in devs] == [0] * 4 + [4] * 4
    topo = Topology(devs)
    assert topo.distance(0, 3) == Link.NVLINK
    assert topo.distance(0, 4) == Link.SYSTEM
    # Without NVLink the switch pairs and the sockets still show.
    devs = devices_from_nvml(nvml_info(8), levels)
    topo = Topology(devs)
    assert topo.distance(0, 1) == Link.PCIE_SWITCH
    assert topo.distance(0, 2) == Link.NUMA
    # With nothing but the basics there is no topology at all.
    devs = devices_from_nvml([{"index": 0, "uuid": "G", "minor": 0, "memory": 1, "numa": 1}])
    assert devs == (GpuDevice(0, "G", 0, 1, 1, None, None),)


@pytest.mark.parametrize(
    ("infos", "levels", "key"),
    [
        ([{"index": 0, "uuid": "G", "minor": 0}], None, "nvml[0].memory"),
        ([{"index": 0, "uuid": "", "minor": 0, "memory": 1}], None, "nvml[0].uuid"),
        ([{"index": 0, "uuid": "G", "minor": 0, "memory": 0}], None, "nvml[0].memory"),
        ([{"index": 0, "uuid": "G", "minor": 0, "memory": 1, "numa": "x"}], None, "nvml[0].numa"),
        (["junk"], None, "nvml[0]"),
        (nvml_info(2), [[0, 10]], "levels"),
        (nvml_info(2), [[0, "x"], [10, 0]], "levels[0][1]"),
        (nvml_info(1) + nvml_info(1), None, "gpu"),
    ],
)
def test_nvml_errors(infos: Any, levels: Any, key: str) -> None:
    with pytest.raises(GpuConfigError) as info:
        devices_from_nvml(infos, levels)
    assert info.value.key == key


def test_nvml_discovery_can_be_turned_off() -> None:
    """`nvml = false`: no NVML probe at all (test agents on a GPU machine, or a host
    whose GPUs are not swarm's); declared devices still win."""
    from swarm.runtime.gpu import discover

    inv = discover(None, "n1", nvml=False)
    assert inv.devices == () and inv.source == "none" and "nvml = false" in inv.note
    declared = [{"index": 0, "memory": "1GiB"}]
    assert discover(declared, "n1", nvml=False).source == "config"
