"""Faults, each with a start and a heal, applied to a running ChaosCluster.

Process faults (kill -9 and restart, SIGSTOP/SIGCONT, a CPU hog, a restart under the
transport fault shim) work everywhere; network faults (isolation, split, one-way
partition, random loss, bandwidth) need the namespace LAN, and a full disk needs the
node's state dir on a small tmpfs (root).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import subprocess
import sys
from typing import ClassVar

import attrs

from . import netns
from .cluster import ChaosAgent, ChaosCluster

_table_ids = itertools.count(1)

FILLER = ".chaos-filler"


@attrs.define
class Fault:
    """One fault on some nodes (1-based indices). Subclasses set `kind`."""

    targets: tuple[int, ...]
    started_at: float | None = None
    healed_at: float | None = None
    error: str = ""

    kind: ClassVar[str] = "?"
    needs_netns: ClassVar[bool] = False
    needs_tmpfs: ClassVar[bool] = False
    # whether the other nodes should notice (suspect/declare dead) the targets
    detectable: ClassVar[bool] = False

    def describe(self) -> str:
        return f"{self.kind}({','.join(f'n{i}' for i in self.targets)})"

    def agents(self, cl: ChaosCluster) -> list[ChaosAgent]:
        return [cl.agents[i - 1] for i in self.targets]

    def start(self, cl: ChaosCluster) -> None:
        raise NotImplementedError

    def heal(self, cl: ChaosCluster) -> None:
        raise NotImplementedError


@attrs.define
class Kill(Fault):
    """kill -9, then (at heal) a restart from the same state dir."""

    kind: ClassVar[str] = "kill"
    detectable: ClassVar[bool] = True

    def start(self, cl: ChaosCluster) -> None:
        for a in self.agents(cl):
            a.kill9()

    def heal(self, cl: ChaosCluster) -> None:
        back = [a for a in self.agents(cl) if not a.lost]
        for a in back:
            if not a.alive():
                a.start()
        for a in back:
            a.wait_ready()


@attrs.define
class Lose(Fault):
    """The node is gone for good, with its tasks (a machine lost): every process in its
    network namespace is killed (the agent, task supervisors, tasks) and nothing ever
    restarts it. Its disk stays readable, for the checks only (issue 19)."""

    kind: ClassVar[str] = "lose"
    detectable: ClassVar[bool] = True
    needs_netns: ClassVar[bool] = True

    def start(self, cl: ChaosCluster) -> None:
        for a in self.agents(cl):
            a.lost = True
            a.kill9()
            if cl.lan is not None:
                netns.kill_namespace_processes(cl.lan.ns(a.index))

    def heal(self, cl: ChaosCluster) -> None:
        pass  # never


@attrs.define
class Pause(Fault):
    """SIGSTOP: a frozen agent that holds its sockets but answers nothing."""

    kind: ClassVar[str] = "pause"
    detectable: ClassVar[bool] = True

    def start(self, cl: ChaosCluster) -> None:
        for a in self.agents(cl):
            a.pause()

    def heal(self, cl: ChaosCluster) -> None:
        for a in self.agents(cl):
            a.resume()


@attrs.define
class _NftFault(Fault):
    table: str = ""
    needs_netns: ClassVar[bool] = True

    def rules(self, cl: ChaosCluster) -> list[str]:
        raise NotImplementedError

    def others(self, cl: ChaosCluster) -> list[int]:
        return [a.index for a in cl.agents if a.index not in self.targets]

    def start(self, cl: ChaosCluster) -> None:
        assert cl.lan is not None
        self.table = f"chaos{next(_table_ids)}"
        cl.lan.add_rules(self.table, self.rules(cl))

    def heal(self, cl: ChaosCluster) -> None:
        assert cl.lan is not None
        cl.lan.drop_table(self.table)


@attrs.define
class Isolate(_NftFault):
    """The targets can neither reach nor be reached by anyone else."""

    kind: ClassVar[str] = "isolate"
    detectable: ClassVar[bool] = True

    def rules(self, cl: ChaosCluster) -> list[str]:
        assert cl.lan is not None
        o = self.others(cl)
        return cl.lan.block_rules(self.targets, o) + cl.lan.block_rules(o, self.targets)


@attrs.define
class Split(_NftFault):
    """Two halves: the targets on one side, everyone else on the other."""

    kind: ClassVar[str] = "split"
    detectable: ClassVar[bool] = True

    def describe(self) -> str:
        return f"split({','.join(f'n{i}' for i in self.targets)} | rest)"

    def rules(self, cl: ChaosCluster) -> list[str]:
        assert cl.lan is not None
        o = self.others(cl)
        return cl.lan.block_rules(self.targets, o) + cl.lan.block_rules(o, self.targets)


@attrs.define
class OneWay(_NftFault):
    """The targets' frames to the others are dropped; the others still reach them."""

    kind: ClassVar[str] = "one-way"
    detectable: ClassVar[bool] = True

    def describe(self) -> str:
        return f"one-way({','.join(f'n{i}' for i in self.targets)} -/-> rest)"

    def rules(self, cl: ChaosCluster) -> list[str]:
        assert cl.lan is not None
        return cl.lan.block_rules(self.targets, self.others(cl))


@attrs.define
class Loss(_NftFault):
    """Random loss of `percent`% of the frames to and from each target (nft numgen)."""

    percent: int = 30
    kind: ClassVar[str] = "loss"

    def describe(self) -> str:
        return f"loss{self.percent}%({','.join(f'n{i}' for i in self.targets)})"

    def rules(self, cl: ChaosCluster) -> list[str]:
        assert cl.lan is not None
        return [r for i in self.targets for r in cl.lan.loss_rules(i, self.percent)]


@attrs.define
class Bandwidth(Fault):
    """tc tbf on the targets' links, both directions."""

    rate: str = "256kbit"
    kind: ClassVar[str] = "bandwidth"
    needs_netns: ClassVar[bool] = True

    def describe(self) -> str:
        return f"bandwidth {self.rate}({','.join(f'n{i}' for i in self.targets)})"

    def start(self, cl: ChaosCluster) -> None:
        assert cl.lan is not None
        for i in self.targets:
            cl.lan.limit_bandwidth(i, self.rate)

    def heal(self, cl: ChaosCluster) -> None:
        assert cl.lan is not None
        for i in self.targets:
            cl.lan.clear_bandwidth(i)


@attrs.define
class Shim(Fault):
    """Restart the targets (SIGTERM) under the transport fault shim (delay, duplication,
    reordering, drops: what netem would do, done in the agent's own transport); the heal
    restarts them without it."""

    spec: str = "delay=0.01:0.05,dup=0.05,reorder=0.1,drop=0.05"
    before: dict[int, str | None] = attrs.field(factory=dict)
    kind: ClassVar[str] = "shim"

    def describe(self) -> str:
        return f"shim[{self.spec}]({','.join(f'n{i}' for i in self.targets)})"

    def _restart(self, cl: ChaosCluster, specs: dict[int, str | None]) -> None:
        for a in self.agents(cl):
            a.terminate(timeout=20)
            a.shim = specs[a.index]
            a.start()
        for a in self.agents(cl):
            a.wait_ready()

    def start(self, cl: ChaosCluster) -> None:
        self.before = {a.index: a.shim for a in self.agents(cl)}
        self._restart(cl, {i: self.spec for i in self.targets})

    def heal(self, cl: ChaosCluster) -> None:
        self._restart(cl, self.before)


@attrs.define
class Restart(Fault):
    """An agent restart as `systemctl restart` does it (an upgrade, a changed config):
    SIGTERM, then a new run from the same state dir at once. The scenario's agents run
    with `--keep-tasks always` (under systemd the default, `restart`, detects the
    restart job), so running tasks stay with their supervisors and are re-attached.
    Instant: the heal does nothing."""

    kind: ClassVar[str] = "restart"

    def start(self, cl: ChaosCluster) -> None:
        back = [a for a in self.agents(cl) if not a.lost]  # a lost node stays lost
        for a in back:
            a.terminate(timeout=30)
            a.start()
        for a in back:
            a.wait_ready()

    def heal(self, cl: ChaosCluster) -> None:
        pass


SKEW = 5.0  # seconds


@attrs.define
class Skew(Fault):
    """The targets' clocks off by +5 s (odd node numbers) or -5 s (even) for the
    fault's span: each is restarted (SIGTERM) reading the system clock shifted
    (SWARM_TEST_CLOCK_SKEW, test mode only: network namespaces share the host's
    clock); the heal restarts it with the true clock."""

    kind: ClassVar[str] = "skew"
    before: dict[int, dict[str, str]] = attrs.field(factory=dict)

    def _restart(self, cl: ChaosCluster, skewed: bool) -> None:
        back = [a for a in self.agents(cl) if not a.lost]
        for a in back:
            a.terminate(timeout=30)
            if skewed:
                self.before[a.index] = a.env
                off = SKEW if a.index % 2 else -SKEW
                a.env = {**a.env, "SWARM_TEST_MODE": "1", "SWARM_TEST_CLOCK_SKEW": str(off)}
            else:
                a.env = self.before.get(a.index, a.env)
            a.start()
        for a in back:
            a.wait_ready()

    def start(self, cl: ChaosCluster) -> None:
        self._restart(cl, True)

    def heal(self, cl: ChaosCluster) -> None:
        self._restart(cl, False)


@attrs.define
class CpuHog(Fault):
    """Busy loops started in the targets' namespaces (one per core). On one machine the
    whole host feels them; the node's own sampler reports the load it sees."""

    procs: int = 2
    pids: list[int] = attrs.field(factory=list)
    kind: ClassVar[str] = "cpu-hog"

    def start(self, cl: ChaosCluster) -> None:
        for i in self.targets:
            for _ in range(self.procs):
                p = cl.spawn_helper(i, [sys.executable, "-c", "while True: pass"])
                self.pids.append(p.pid)

    def heal(self, cl: ChaosCluster) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in list(cl.helpers):
            if p.pid in self.pids:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
                cl.helpers.remove(p)
        self.pids.clear()


@attrs.define
class DiskFull(Fault):
    """Fill the tmpfs under the targets' state dirs (journal, task logs) to ENOSPC."""

    kind: ClassVar[str] = "disk-full"
    needs_tmpfs: ClassVar[bool] = True

    def start(self, cl: ChaosCluster) -> None:
        for a in self.agents(cl):
            if a.tmpfs is None:
                raise RuntimeError(f"{a.name}: state dir is not on a tmpfs")
            fill(a.tmpfs / FILLER)

    def heal(self, cl: ChaosCluster) -> None:
        for a in self.agents(cl):
            if a.tmpfs is not None:
                (a.tmpfs / FILLER).unlink(missing_ok=True)


def fill(path: os.PathLike[str]) -> int:
    """Write zeros to `path` until the file system is full; returns bytes written."""
    chunk = b"\0" * (1 << 20)
    written = 0
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n = f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(chunk) > 4096:
                    chunk = chunk[: len(chunk) // 16]
                    continue
                break
            written += n or 0
    return written


KINDS: dict[str, type[Fault]] = {
    c.kind: c
    for c in (
        Kill,
        Lose,
        Pause,
        Isolate,
        Split,
        OneWay,
        Loss,
        Bandwidth,
        Shim,
        CpuHog,
        DiskFull,
        Restart,
        Skew,
    )
}
