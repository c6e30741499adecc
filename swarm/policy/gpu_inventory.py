"""GPU inventory: what devices a node has and how they are connected.

Sources are the agent config (`[[gpu]]` tables, for hosts and tests without NVML)
and NVML-shaped data gathered by the runtime sampler; both end as `GpuDevice`
values, and `Topology` ranks pairs NVLink < PCIe switch < NUMA node < system.
Pure parsing with errors that name the offending key. Also home of `parse_bytes`,
the size parser the config and the CLI share.
"""

from __future__ import annotations

import enum
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import attrs

# ------------------------------------------------------------------ byte sizes


class ByteSizeError(ValueError):
    """A size string that is not a non-negative byte count with a known unit."""


_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")
_UNITS: Mapping[str, int] = {
    "": 1,
    "b": 1,
    # Single letters are binary, like systemd, docker and CUDA MPS ("1G" = 2**30).
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "p": 2**50,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
    "pi": 2**50,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
    # Explicit SI names keep their SI meaning.
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
}


def parse_bytes(value: str | int) -> int:
    """Bytes from "1000000", 1000000, "512M", "8GiB", "1.5G" or "80GB".

    K/M/G/T/P and Ki/KiB... are powers of 1024; KB/MB/GB/TB/PB are powers of 1000.
    Units are case-insensitive; fractions round down to whole bytes.
    """
    if isinstance(value, bool):
        raise ByteSizeError(f"expected a size like '8GiB' or a byte count, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ByteSizeError(f"size must not be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise ByteSizeError(f"expected a size like '8GiB' or a byte count, got {value!r:.40}")
    m = _SIZE_RE.match(value)
    if m is None:
        raise ByteSizeError(
            f"cannot read {value!r:.40} as a size: expected a number and an optional unit "
            f"(B, K, M, G, T, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
        )
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise ByteSizeError(
            f"unknown size unit {m.group(2)!r} in {value!r:.40}: use B, K, M, G, T, "
            f"KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)"
        )
    try:
        amount = Decimal(number)
    except InvalidOperation as e:  # pragma: no cover - the regex only admits decimals
        raise ByteSizeError(f"cannot read {value!r:.40} as a size") from e
    return int(amount * _UNITS[unit])


# ------------------------------------------------------------------ inventory


def _opt_str(value: str | int | None) -> str | None:
    return None if value is None else str(value)


@attrs.frozen
class GpuDevice:
    """One physical GPU and where it sits (for topology-aware multi-GPU choices)."""

    index: int
    uuid: str
    minor: int
    memory_bytes: int
    numa_node: int | None = None
    pcie_switch: str | None = attrs.field(default=None, converter=_opt_str)
    nvlink_group: str | None = attrs.field(default=None, converter=_opt_str)


class Link(enum.IntEnum):
    """How close two devices are; lower is better (peer bandwidth, latency)."""

    SAME = 0
    NVLINK = 1
    PCIE_SWITCH = 2
    NUMA = 3
    SYSTEM = 4


def distance(a: GpuDevice, b: GpuDevice) -> Link:
    if a.index == b.index:
        return Link.SAME
    if a.nvlink_group is not None and a.nvlink_group == b.nvlink_group:
        return Link.NVLINK
    if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
        return Link.PCIE_SWITCH
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return Link.NUMA
    return Link.SYSTEM


class Topology:
    """The node's devices by index with pairwise distances precomputed."""

    def __init__(self, devices: Iterable[GpuDevice]) -> None:
        devs = sorted(devices, key=lambda d: d.index)
        self.devices: tuple[GpuDevice, ...] = tuple(devs)
        self.by_index: dict[int, GpuDevice] = {d.index: d for d in devs}
        if len(self.by_index) != len(devs):
            raise GpuConfigError("gpu", "two devices share one index")
        self._dist: dict[tuple[int, int], Link] = {
            (a.index, b.index): distance(a, b) for a in devs for b in devs
        }

    def distance(self, a: int, b: int) -> Link:
        return self._dist[(a, b)]

    def set_cost(self, indices: Sequence[int]) -> tuple[int, int]:
        """(max, sum) of pairwise distances in a device set; lower is better."""
        ds = [self._dist[(a, b)] for a, b in itertools.combinations(indices, 2)]
        return (max(ds, default=0), sum(ds))

    def closeness(self, index: int, others: Iterable[int]) -> int:
        """How well `index` connects to `others` (higher = better connected)."""
        return sum(Link.SYSTEM - self._dist[(index, o)] for o in others if o != index)


class GpuConfigError(ValueError):
    """A GPU inventory entry (config or NVML data) that cannot be used; names the key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


_CONFIG_KEYS = {
    "id": "index",
    "index": "index",
    "uuid": "uuid",
    "minor": "minor",
    "memory": "memory",
    "numa": "numa",
    "numa_node": "numa",
    "numa-node": "numa",
    "pcie_switch": "pcie_switch",
    "pcie-switch": "pcie_switch",
    "nvlink_group": "nvlink_group",
    "nvlink-group": "nvlink_group",
}


def _cfg_int(key: str, value: Any, lo: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GpuConfigError(key, f"expected an integer, got {value!r:.40}")
    if value < lo:
        raise GpuConfigError(key, f"must be >= {lo}, got {value}")
    return value


def _cfg_label(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise GpuConfigError(key, f"expected a name or number, got {value!r:.40}")
    return str(value)


def devices_from_config(tables: Any, node: str) -> tuple[GpuDevice, ...]:
    """GpuDevice values from the agent config's `[[gpus]]` tables (for hosts and tests
    without NVML). Keys: id or index, uuid (optional: "GPU-fake-<node>-<index>"),
    minor (default: index), memory ("80GiB" or bytes, required), numa, pcie_switch,
    nvlink_group (hyphenated spellings accepted). Unknown keys are errors so that a
    typo does not silently lose topology.
    """
    if not isinstance(tables, list | tuple):
        raise GpuConfigError("gpu", f"expected a list of tables ([[gpu]]), got {tables!r:.40}")
    devices: list[GpuDevice] = []
    seen_index: set[int] = set()
    seen_uuid: set[str] = set()
    for pos, table in enumerate(tables):
        where = f"gpu[{pos}]"
        if not isinstance(table, Mapping):
            raise GpuConfigError(where, f"expected a table, got {table!r:.40}")
        fields: dict[str, tuple[str, Any]] = {}
        for raw_key, value in table.items():
            key = f"{where}.{raw_key}"
            canon = _CONFIG_KEYS.get(raw_key) if isinstance(raw_key, str) else None
            if canon is None:
                known = "id, index, uuid, minor, memory, numa, pcie_switch, nvlink_group"
                raise GpuConfigError(key, f"unknown key (known: {known})")
            if canon in fields:
                raise GpuConfigError(key, f"given twice (also as {fields[canon][0]!r})")
            fields[canon] = (key, value)
        index = _cfg_int(*fields["index"]) if "index" in fields else pos
        if index in seen_index:
            raise GpuConfigError(f"{where}.index", f"index {index} used twice")
        if "memory" not in fields:
            raise GpuConfigError(f"{where}.memory", 'required (e.g. memory = "80GiB")')
        mkey, mval = fields["memory"]
        try:
            memory = parse_bytes(mval)
        except ByteSizeError as e:
            raise GpuConfigError(mkey, str(e)) from None
        if memory <= 0:
            raise GpuConfigError(mkey, "must be positive")
        if "uuid" in fields:
            ukey, uval = fields["uuid"]
            if not isinstance(uval, str) or not uval.strip() or "," in uval:
                raise GpuConfigError(ukey, f"expected a GPU UUID string, got {uval!r:.40}")
            uuid = uval.strip()
        else:
            uuid = f"GPU-fake-{node}-{index}"
        if uuid in seen_uuid:
            raise GpuConfigError(f"{where}.uuid", f"uuid {uuid!r} used twice")
        minor = _cfg_int(fields["minor"][0], fields["minor"][1]) if "minor" in fields else index
        numa = _cfg_int(fields["numa"][0], fields["numa"][1]) if "numa" in fields else None
        switch = _cfg_label(*fields["pcie_switch"]) if "pcie_switch" in fields else None
        group = _cfg_label(*fields["nvlink_group"]) if "nvlink_group" in fields else None
        seen_index.add(index)
        seen_uuid.add(uuid)
        devices.append(GpuDevice(index, uuid, minor, memory, numa, switch, group))
    return tuple(sorted(devices, key=lambda d: d.index))


# NVML topology levels (nvmlGpuTopologyLevel_t).
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50


def _components(n: int, linked: Any) -> list[int]:
    """Union-find over n items; returns the smallest member of each item's group."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if linked(i, j):
                a, b = find(i), find(j)
                parent[max(a, b)] = min(a, b)
    return [find(i) for i in range(n)]


def devices_from_nvml(
    infos: Sequence[Mapping[str, Any]],
    levels: Sequence[Sequence[int]] | None = None,
    nvlink: Sequence[Sequence[int | bool]] | None = None,
) -> tuple[GpuDevice, ...]:
    """GpuDevice values from NVML-shaped data gathered by the runtime sampler.

    infos[i]: {"index", "uuid", "minor", "memory" (bytes), optional "numa"}.
    levels[i][j]: nvmlDeviceGetTopologyCommonAncestor level (0/10/20 = same PCIe
    switch tree, 30/40 = same host bridge / NUMA node, 50 = across sockets).
    nvlink[i][j]: number of NVLinks (or a bool) between devices i and j.
    Groups are connected components of those relations, named after their lowest
    position ("nvl0", "sw2").
    """
    n = len(infos)
    for name, matrix in (("levels", levels), ("nvlink", nvlink)):
        if matrix is not None and (len(matrix) != n or any(len(row) != n for row in matrix)):
            raise GpuConfigError(name, f"expected a {n}x{n} matrix")
    devs: list[tuple[int, str, int, int, int | None]] = []
    for pos, info in enumerate(infos):
        where = f"nvml[{pos}]"
        if not isinstance(info, Mapping):
            raise GpuConfigError(where, f"expected a mapping, got {info!r:.40}")
        for key in ("index", "uuid", "minor", "memory"):
            if key not in info:
                raise GpuConfigError(f"{where}.{key}", "missing")
        uuid = info["uuid"]
        if not isinstance(uuid, str) or not uuid:
            raise GpuConfigError(f"{where}.uuid", f"expected a string, got {uuid!r:.40}")
        numa_raw = info.get("numa")
        numa = None
        if numa_raw is not None and not (isinstance(numa_raw, int) and numa_raw < 0):
            numa = _cfg_int(f"{where}.numa", numa_raw)  # NVML reports -1 for "unknown"
        memory = _cfg_int(f"{where}.memory", info["memory"], lo=1)
        devs.append(
            (
                _cfg_int(f"{where}.index", info["index"]),
                uuid,
                _cfg_int(f"{where}.minor", info["minor"]),
                memory,
                numa,
            )
        )
    switch: list[int] | None = None
    node_of: list[int] | None = None
    groups: list[int] | None = None
    if levels is not None:
        lv = levels
        for i in range(n):
            for j in range(n):
                _cfg_int(f"levels[{i}][{j}]", lv[i][j])
        switch = _components(n, lambda i, j: lv[i][j] <= NVML_TOPOLOGY_MULTIPLE)
        node_of = _components(n, lambda i, j: lv[i][j] <= NVML_TOPOLOGY_NODE)
    if nvlink is not None:
        nl = nvlink
        groups = _components(n, lambda i, j: bool(nl[i][j]) or bool(nl[j][i]))
    out: list[GpuDevice] = []
    for pos, (index, uuid, minor, memory, numa) in enumerate(devs):
        out.append(
            GpuDevice(
                index=index,
                uuid=uuid,
                minor=minor,
                memory_bytes=memory,
                numa_node=numa if numa is not None or node_of is None else node_of[pos],
                pcie_switch=None if switch is None else f"sw{switch[pos]}",
                nvlink_group=(
                    None if groups is None or groups.count(groups[pos]) < 2 else f"nvl{groups[pos]}"
                ),
            )
        )
    Topology(out)  # rejects duplicate indices
    return tuple(sorted(out, key=lambda d: d.index))
