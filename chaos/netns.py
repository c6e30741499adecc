"""A simulated LAN for one chaos run: a hub namespace with a bridge, one namespace per
node joined to it by a veth pair, and the faults that live in the network (nftables
rules on the bridge, tc qdiscs on the veths). Root only.

Names carry a per-run id (`swch-<run>-hub`, `swch-<run>-n3`) so two runs never share
anything, and a run that died without tearing down can be recognised and swept by the
next one: each live run keeps `<RUN_DIR>/<run>.pid`; namespaces whose run has no live
pid are leftovers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

PREFIX = "swch"
RUN_DIR = Path("/run/swarm-chaos")
SUBNET = "10.77.0"
NODE_IF = "eth0"  # interface names are per namespace, so every node uses the same


class NetError(Exception):
    """A network command failed; the message has the command and its stderr."""


def run(args: Sequence[str], *, check: bool = True, input: str | None = None) -> str:
    p = subprocess.run(list(args), capture_output=True, text=True, input=input, timeout=30)
    if check and p.returncode != 0:
        raise NetError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def namespaces_usable() -> tuple[bool, str]:
    """Whether this process can build the LAN; the reason when it cannot."""
    if os.geteuid() != 0:
        return False, "not root: network namespaces need root"
    for tool in ("ip", "nft", "tc", "nsenter"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is not installed (make sysdeps installs it)"
    probe = f"{PREFIX}-probe{os.getpid()}"
    try:
        run(["ip", "netns", "add", probe])
    except NetError as e:
        return False, f"cannot create a network namespace: {e}"
    finally:
        run(["ip", "netns", "del", probe], check=False)
    return True, ""


def list_namespaces() -> list[str]:
    out = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_alive(run_id: str) -> bool:
    try:
        pid = int((RUN_DIR / f"{run_id}.pid").read_text().strip())
    except (OSError, ValueError):
        return False
    return _pid_alive(pid)


def kill_namespace_processes(ns: str) -> None:
    out = run(["ip", "netns", "pids", ns], check=False)
    for word in out.split():
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.kill(int(word), 9)


def sweep_leftovers() -> list[str]:
    """Remove namespaces, mounts and pid files of earlier runs that are no longer alive."""
    swept: list[str] = []
    dead_runs: set[str] = set()
    for ns in list_namespaces():
        parts = ns.split("-")
        if len(parts) < 3 or parts[0] != PREFIX:
            continue
        run_id = parts[1]
        if run_alive(run_id):
            continue
        dead_runs.add(run_id)
        kill_namespace_processes(ns)
        run(["ip", "netns", "del", ns], check=False)
        swept.append(ns)
    for pidfile in RUN_DIR.glob("*.pid") if RUN_DIR.is_dir() else []:
        if not run_alive(pidfile.stem):
            dead_runs.add(pidfile.stem)
            pidfile.unlink(missing_ok=True)
    for mnt in _mounts():
        name = Path(mnt).parts
        for run_id in dead_runs:
            if f"{PREFIX}-{run_id}" in name:
                run(["umount", "-l", mnt], check=False)
                swept.append(mnt)
    return swept


def _mounts() -> list[str]:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    return [line.split()[1] for line in lines if len(line.split()) > 1]


def claim_run(run_id: str) -> None:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    (RUN_DIR / f"{run_id}.pid").write_text(str(os.getpid()))


def release_run(run_id: str) -> None:
    (RUN_DIR / f"{run_id}.pid").unlink(missing_ok=True)


class Lan:
    """The hub, the bridge and one namespace per node (1-based indices)."""

    def __init__(self, run_id: str, n: int) -> None:
        if not 1 <= n <= 250:
            raise ValueError("between 1 and 250 nodes")
        self.run_id = run_id
        self.n = n
        self.hub = f"{PREFIX}-{run_id}-hub"
        self._tables: set[str] = set()
        self._qdiscs: set[int] = set()
        self.created: list[str] = []

    def ns(self, i: int) -> str:
        return f"{PREFIX}-{self.run_id}-n{i}"

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{i}"

    @staticmethod
    def hub_if(i: int) -> str:
        return f"h{i}"

    def netns_path(self, i: int) -> str:
        return f"/run/netns/{self.ns(i)}"

    # ---------------------------------------------------------------- set-up

    def create(self) -> None:
        run(["ip", "netns", "add", self.hub])
        self.created.append(self.hub)
        run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
        run(["ip", "-n", self.hub, "link", "set", "lo", "up"])
        for i in range(1, self.n + 1):
            ns = self.ns(i)
            run(["ip", "netns", "add", ns])
            self.created.append(ns)
            run(["ip", "link", "add", NODE_IF, "netns", ns, "type", "veth", "peer", "name",
                 self.hub_if(i), "netns", self.hub])  # fmt: skip
            run(["ip", "-n", self.hub, "link", "set", self.hub_if(i), "master", "br0", "up"])
            run(["ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", NODE_IF])
            run(["ip", "-n", ns, "link", "set", NODE_IF, "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def destroy(self) -> None:
        for ns in reversed(self.created):
            kill_namespace_processes(ns)
            run(["ip", "netns", "del", ns], check=False)
        self.created.clear()

    def exec_prefix(self, i: int) -> list[str]:
        """Run a command in node i's network namespace, in our mount namespace."""
        return ["nsenter", f"--net={self.netns_path(i)}", "--"]

    # ---------------------------------------------------------------- faults

    def _nft(self, script: str) -> None:
        run(["ip", "netns", "exec", self.hub, "nft", "-f", "-"], input=script)

    def add_rules(self, table: str, rules: Iterable[str]) -> None:
        """A fresh bridge table with one forward chain holding `rules` (nft syntax)."""
        body = "\n".join(f"    {r}" for r in rules)
        self._nft(
            f"table bridge {table} {{\n  chain forward_f {{\n"
            f"    type filter hook forward priority 0; policy accept;\n{body}\n  }}\n}}\n"
        )
        self._tables.add(table)

    def drop_table(self, table: str) -> None:
        run(["ip", "netns", "exec", self.hub, "nft", "delete", "table", "bridge", table],
            check=False)  # fmt: skip
        self._tables.discard(table)

    def block_rules(self, src: Iterable[int], dst: Iterable[int]) -> list[str]:
        """Rules dropping every frame from the nodes in `src` to those in `dst`."""
        dsts = ", ".join(f'"{self.hub_if(j)}"' for j in dst)
        return [f'iifname "{self.hub_if(i)}" oifname {{ {dsts} }} drop' for i in src]

    def loss_rules(self, i: int, percent: int) -> list[str]:
        """Random loss of `percent`% of frames to and from node i (both directions)."""
        h = self.hub_if(i)
        return [
            f'iifname "{h}" numgen random mod 100 < {percent} drop',
            f'oifname "{h}" numgen random mod 100 < {percent} drop',
        ]

    def limit_bandwidth(self, i: int, rate: str, burst: str = "32kbit") -> None:
        """tbf on both ends of node i's veth: its egress and its ingress."""
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", "100ms"]
        run(["ip", "netns", "exec", self.ns(i), "tc", "qdisc", "add", "dev", NODE_IF, *tbf])
        run(["ip", "netns", "exec", self.hub, "tc", "qdisc", "add", "dev", self.hub_if(i), *tbf])
        self._qdiscs.add(i)

    def clear_bandwidth(self, i: int) -> None:
        run(["ip", "netns", "exec", self.ns(i), "tc", "qdisc", "del", "dev", NODE_IF, "root"],
            check=False)  # fmt: skip
        run(["ip", "netns", "exec", self.hub, "tc", "qdisc", "del", "dev", self.hub_if(i), "root"],
            check=False)  # fmt: skip
        self._qdiscs.discard(i)

    def heal_all(self) -> None:
        for t in list(self._tables):
            self.drop_table(t)
        for i in list(self._qdiscs):
            self.clear_bandwidth(i)
