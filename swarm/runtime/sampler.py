"""Local load sampling: psutil, /proc/pressure (PSI) and, later, NVML.

Only measures; what the numbers mean for placement and admission is policy/'s
business. Sampling is cheap (a few /proc reads) and non-blocking, so it runs on
the event loop.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from .. import testbreak
from ..policy.load import HostSample

__all__ = ["HostSample", "Sampler", "read_psi"]

PSI_DIR = Path("/proc/pressure")


def read_psi(resource: str, root: Path = PSI_DIR) -> float:
    """`some avg10` of /proc/pressure/<resource>, 0.0 where PSI is unavailable."""
    try:
        text = (root / resource).read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("some "):
            for part in line.split()[1:]:
                key, _, value = part.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return 0.0
    return 0.0


def usable_cpus() -> float:
    try:
        return float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return float(os.cpu_count() or 1)


class Sampler:
    def __init__(self, psi_root: Path = PSI_DIR) -> None:
        self.psi_root = psi_root
        self.cpus = usable_cpus()
        psutil.cpu_percent(interval=None)  # prime the delta

    def sample(self) -> HostSample:
        util = psutil.cpu_percent(interval=None) / 100.0
        try:
            load1 = os.getloadavg()[0]
        except OSError:
            load1 = 0.0
        vm = psutil.virtual_memory()
        ncpu = float(psutil.cpu_count() or 1)
        forced = testbreak.load_per_core()  # None outside test mode
        return HostSample(
            cpu_util=util,
            load_per_core=load1 / ncpu if forced is None else forced,
            cpus=self.cpus,
            mem_available=int(vm.available),
            mem_total=int(vm.total),
            psi_cpu=read_psi("cpu", self.psi_root),
            psi_mem=read_psi("memory", self.psi_root),
            cpu_used_cores=util * ncpu,
            mem_used=int(vm.total - vm.available),
        )
