"""GPU inventory: NVML when a driver is there, otherwise the devices the config declares.

NVML (module `pynvml`, package nvidia-ml-py, the optional `gpu` extra) gives count,
UUID, minor number, memory and the pairwise topology (common ancestor level, NVLink
counts). Without the library, or without a driver, the node has no GPUs unless the
config declares them (`[[gpus]]` tables: how tests and GPU-less hosts run this code).
What the numbers mean for allocation is swarm.policy.gpu's business.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..policy.gpu_inventory import GpuDevice, devices_from_config, devices_from_nvml


@attrs.frozen
class Inventory:
    devices: tuple[GpuDevice, ...]
    source: str  # "nvml" | "config" | "none"
    note: str = ""  # why NVML was not used, when it was not


def _nvml_infos() -> tuple[list[dict[str, Any]], list[list[int]], list[list[int]]]:
    import pynvml  # optional dependency

    pynvml.nvmlInit()
    try:
        n = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        infos: list[dict[str, Any]] = []
        for i, hd in enumerate(handles):
            uuid = pynvml.nvmlDeviceGetUUID(hd)
            if isinstance(uuid, bytes):
                uuid = uuid.decode()
            mem = pynvml.nvmlDeviceGetMemoryInfo(hd)
            info: dict[str, Any] = {
                "index": i,
                "uuid": uuid,
                "minor": int(pynvml.nvmlDeviceGetMinorNumber(hd)),
                "memory": int(mem.total),
            }
            try:
                info["numa"] = int(pynvml.nvmlDeviceGetNumaNodeId(hd))
            except Exception:  # older drivers: no NUMA query
                pass
            infos.append(info)
        levels = [[0] * n for _ in range(n)]
        nvlink = [[0] * n for _ in range(n)]
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                try:
                    levels[i][j] = int(
                        pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                    )
                except Exception:
                    levels[i][j] = 50
        for i, hd in enumerate(handles):
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if not pynvml.nvmlDeviceGetNvLinkState(hd, link):
                        continue
                    pci = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(hd, link)
                except Exception:
                    break
                bus = getattr(pci, "busId", b"")
                for j, other in enumerate(handles):
                    if j != i and pynvml.nvmlDeviceGetPciInfo(other).busId == bus:
                        nvlink[i][j] += 1
        return infos, levels, nvlink
    finally:
        pynvml.nvmlShutdown()


def discover(declared: Any, node: str, *, nvml: bool = True) -> Inventory:
    """The node's GPUs. Declared devices win (explicit configuration), then NVML unless
    `nvml` is off (a host whose GPUs are not swarm's to hand out, or a test agent that
    must not pick up the machine's real GPUs)."""
    if declared:
        return Inventory(devices_from_config(declared, node), "config")
    if not nvml:
        return Inventory((), "none", "NVML discovery is off (nvml = false)")
    try:
        infos, levels, nvlink = _nvml_infos()
    except ImportError:
        return Inventory((), "none", "nvidia-ml-py not installed")
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return Inventory((), "none", f"NVML unavailable: {type(e).__name__}: {e}")
    if not infos:
        return Inventory((), "none", "NVML found no devices")
    return Inventory(devices_from_nvml(infos, levels, nvlink), "nvml")
