"""What the agent finds out about its host: labels for "where a task may run".

`discover` gives the built-in node labels (arch, os, kernel, hostname, cpus, memory,
GPU count and model) that a task's constraints can match next to the labels the
config declares; `scan_data_dirs` lists the data keys under the declared data
directories, which swarm.policy.datakeys folds into the digest each load report
carries. Both run at start-up and on reload, on an agent that must come up on any
host, so every function here is total: an unreadable file or an odd value omits a
label or a key and never raises.

No subprocess: the GPU model comes from the NVIDIA driver's /proc files, which need
neither nvidia-smi nor NVML (the allocator's inventory, swarm.runtime.gpu, is a
separate concern).
"""

from __future__ import annotations

import heapq
import os
import platform
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil

from ..policy.datakeys import valid_data_key

GiB = 2**30

OS_RELEASE = (Path("/etc/os-release"), Path("/usr/lib/os-release"))
"""Where os-release(5) lives; the second is the documented fallback."""

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")

_MAX_VALUE = 128  # a label value longer than this is not a fact worth gossiping


def _clean(value: str) -> str | None:
    """A label value, or None when it is empty, too long or not printable."""
    value = value.strip()
    if not value or len(value) > _MAX_VALUE or not value.isprintable():
        return None
    return value


def _read_text(path: Path, limit: int = 65536) -> str | None:
    """At most `limit` characters of a text file, or None when it cannot be read."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except (OSError, ValueError):
        return None


def os_release(paths: Sequence[Path] = OS_RELEASE) -> dict[str, str]:
    """The KEY=value pairs of the first readable os-release file ({} when none).

    The format is shell-like; only the quoting that real files use is undone (one
    pair of matching quotes, backslash escapes inside double quotes), without a
    shell parser that could raise on a stray quote.
    """
    for path in paths:
        text = _read_text(path)
        if text is None:
            continue
        out: dict[str, str] = {}
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.partition("=")
            key = key.strip()
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                quote, value = value[0], value[1:-1]
                if quote == '"':
                    for ch in '\\"$`':
                        value = value.replace("\\" + ch, ch)
            out[key] = value
        return out
    return {}


def _cpus() -> int | None:
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity on this platform
        usable = 0
    return usable or os.cpu_count()


def _mem_bytes() -> int | None:
    try:
        return int(psutil.virtual_memory().total)
    except Exception:  # psutil raises its own and OS errors on odd hosts
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return None


def _hostname() -> str | None:
    try:
        return socket.gethostname()
    except OSError:
        return None


def discover(*, gpu_models: Sequence[str] = ()) -> dict[str, str]:
    """The host's built-in labels.

    Always: `arch` (platform.machine(), e.g. x86_64), `os` (e.g. linux), `kernel`,
    `hostname`, `cpus` (the CPUs this process may use, which is what it can give
    tasks, not the machine's count) and `mem` (whole GiB rounded down, at least 1,
    e.g. "24G"), each omitted only when the host will not say. `os.id` and
    `os.version` from os-release when it is there. `gpu.count` and `gpu.model` (the
    first model, spaces as "-": "NVIDIA-H200") only when `gpu_models` is non-empty,
    so that "has a GPU" is "has the label".
    """
    labels: dict[str, str] = {}

    def put(name: str, value: object) -> None:
        if value is None:
            return
        clean = _clean(str(value))
        if clean is not None:
            labels[name] = clean

    put("arch", platform.machine())
    put("os", platform.system().lower())
    rel = os_release()
    put("os.id", rel.get("ID"))
    put("os.version", rel.get("VERSION_ID"))
    put("kernel", platform.release())
    put("hostname", _hostname())
    put("cpus", _cpus())
    mem = _mem_bytes()
    if mem is not None:
        put("mem", f"{max(1, mem // GiB)}G")
    models = [m for m in ("-".join(str(g).split()) for g in gpu_models) if m]
    if gpu_models:
        put("gpu.count", len(gpu_models))
        if models:
            put("gpu.model", models[0])
    return labels


def gpu_models_from_proc(root: Path = NVIDIA_GPUS) -> list[str]:
    """The model of each NVIDIA GPU, from `<root>/<pci id>/information` ("Model:"
    line), in PCI-id order; [] without the driver. Whitespace inside a model is
    collapsed to single spaces."""
    try:
        files = sorted(root.glob("*/information"))
    except (OSError, ValueError):
        return []
    models: list[str] = []
    for path in files:
        text = _read_text(path)
        if text is None:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "Model":
                model = " ".join(value.split())
                if model:
                    models.append(model)
                break
    return models


def _names(directory: Path, limit: int) -> list[str]:
    """The `limit` smallest entry names directly inside `directory`, dotfiles left out
    (bounded memory however large the directory)."""

    def entries() -> Iterator[str]:
        with os.scandir(directory) as it:
            for entry in it:
                if not entry.name.startswith("."):
                    yield entry.name

    return heapq.nsmallest(limit, entries())


def scan_data_dirs(dirs: Sequence[Path], limit: int = 4096) -> list[str]:
    """The data keys under the declared data directories, at most `limit`.

    For each directory D (in the order given) and each entry E directly inside it
    (sorted by name, not recursive, no dotfiles): `E.name` (once, however many
    directories have it) and the absolute path `D.resolve() / E.name`. Keys that
    `valid_data_key` refuses are left out. A missing or unreadable D is skipped
    without a word: the caller decides what to log. Nothing is opened but the
    directories themselves.
    """
    keys: list[str] = []
    seen: set[str] = set()
    if limit <= 0:
        return keys
    for d in dirs:
        try:
            base = Path(d).resolve()
            names = _names(base, limit)
        except (OSError, RuntimeError, ValueError):  # missing, unreadable, symlink loop
            continue
        for name in names:
            for key in (name, str(base / name)):
                if key in seen or not valid_data_key(key):
                    continue
                seen.add(key)
                keys.append(key)
                if len(keys) >= limit:
                    return keys
    return keys
