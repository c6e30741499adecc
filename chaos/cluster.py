"""Real agent processes for a chaos run, each in its own network namespace (or, without
root, on loopback), each with its own state dir, socket and log.

The harness only starts, signals and asks agents things through their public
interfaces (the Unix socket, the CLI, the journal file on disk); it never reaches into
an agent. Teardown is idempotent and runs on every exit path (`with ChaosCluster(...)`),
including failures and Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from swarm.client import AgentUnreachable, Client, ClientError
from swarm.localcluster import agent_argv

from . import netns

PORT = 7946
INSECURE = ("--insecure",)  # unless the cluster shares a key file (`keyring`)
BASE_ARGS = (
    "--no-mdns",
    "--profile",
    "local",
    "--kill-grace",
    "1",
    "--join-wait",
    "0",
    "--allow-root-tasks",  # the harness runs as root (namespaces need it)
)


@attrs.define
class AgentExit:
    """A process of an agent ended: when, how, and whether the harness caused it."""

    at: float
    code: int
    expected: bool


class ChaosAgent:
    def __init__(
        self,
        name: str,
        index: int,
        root: Path,
        *,
        exec_prefix: Sequence[str],
        bind: str,
        port: int,
        args: Sequence[str],
        env: dict[str, str],
        cwd: Path | None = None,
        keyring: Path | None = None,
    ) -> None:
        self.name = name
        self.keyring = keyring
        self.cwd = cwd
        self.index = index
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.dir / "state"
        self.state_dir.mkdir(exist_ok=True)
        self.socket = self.dir / "sock"
        self.log_path = self.dir / "agent.log"
        self.exec_prefix = list(exec_prefix)
        self.bind = bind
        self.port = port
        self.seeds: list[str] = []
        self.args = list(args)
        self.env = env
        self.shim: str | None = None  # transport fault spec for the next start
        self.proc: subprocess.Popen[bytes] | None = None
        self.expect_exit = False
        self.paused = False
        self.lost = False  # gone for good (faults.Lose): never started again
        self.exits: list[AgentExit] = []
        self.starts = 0
        self.tmpfs: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.bind}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            *self.exec_prefix,
            *agent_argv(sys.executable, self.name, self.state_dir, self.socket),
            "--bind",
            self.bind,
            "--advertise",
            self.bind,
            "--port",
            str(self.port),
            *BASE_ARGS,
            *(INSECURE if self.keyring is None else ("--keyring", str(self.keyring))),
            *self.args,
        ]
        if self.seeds:
            cmd += ["--seeds", ",".join(self.seeds)]
        if self.shim:
            cmd += ["--faults", self.shim]
        return cmd

    # -------------------------------------------------------------- process

    def start(self) -> None:
        self.reap()
        if self.alive():
            raise RuntimeError(f"{self.name} is already running")
        with open(self.log_path, "ab") as logf:
            logf.write(f"# chaos: start {time.time():.3f} {' '.join(self.command())}\n".encode())
            logf.flush()
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        self.expect_exit = False
        self.paused = False
        self.starts += 1

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                self.reap()
                raise RuntimeError(f"agent {self.name} exited at start:\n{self.log_tail()}")
            try:
                with Client(self.socket, timeout=5) as c:
                    c.info()
                    return
            except (AgentUnreachable, ClientError, OSError) as e:
                last = str(e)
            time.sleep(0.1)
        raise TimeoutError(f"agent {self.name} not ready in {timeout}s ({last})")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reap(self) -> None:
        """Record the exit of a process that ended (once)."""
        if self.proc is not None and self.proc.poll() is not None:
            self.exits.append(AgentExit(time.time(), self.proc.returncode, self.expect_exit))
            self.proc = None

    def kill9(self) -> None:
        self.reap()  # an exit before this one was not ours
        if self.proc is None:
            return
        self.expect_exit = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.paused = False
        self.reap()

    def terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM (after SIGCONT if frozen), SIGKILL if it does not stop in time."""
        self.reap()  # an exit before this one was not ours
        if self.proc is None:
            return
        self.expect_exit = True
        with contextlib.suppress(ProcessLookupError):
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
                self.paused = False
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.reap()

    def died(self) -> bool:
        """The process ended without the harness ending it."""
        self.reap()
        return any(not x.expected for x in self.exits)

    def send_term(self) -> None:
        """SIGTERM without waiting (see `terminate`), to stop many agents at once."""
        self.reap()
        if self.proc is None:
            return
        self.expect_exit = True
        with contextlib.suppress(ProcessLookupError):
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
                self.paused = False
            self.proc.send_signal(signal.SIGTERM)

    def pause(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    # ------------------------------------------------------------ interfaces

    def client(self, timeout: float = 5.0) -> Client:
        return Client(self.socket, timeout=timeout)

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """The real `swarm` CLI against this agent's socket."""
        return subprocess.run(
            [sys.executable, "-m", "swarm", "--socket", str(self.socket), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.cwd,
        )

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def label_args(labels: Mapping[int, Mapping[str, str]]) -> dict[int, list[str]]:
    """Node index -> its `--labels k=v,...` (per_node_args of ChaosCluster)."""
    return {
        i: ["--labels", ",".join(f"{k}={v}" for k, v in sorted(kv.items()))]
        for i, kv in labels.items()
        if kv
    }


def _free_port() -> int:
    """A port free for both UDP and TCP on loopback right now."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.bind(("127.0.0.1", 0))
            port = int(t.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                try:
                    u.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port


class ChaosCluster:
    """N agents; `mode` is "netns" (root: the LAN of chaos.netns) or "loopback"."""

    def __init__(
        self,
        n: int,
        root: Path,
        *,
        run_id: str,
        mode: str,
        args: Sequence[str] = (),
        per_node_args: dict[int, list[str]] | None = None,
        env: dict[str, str] | None = None,
        shim: str | None = None,
        tmpfs_nodes: dict[int, int] | None = None,
        code: Path | None = None,
        keyring: Path | None = None,
        log: Callable[[str], None] = lambda s: None,
    ) -> None:
        """`code`: a directory holding the `swarm` package the agents run (a snapshot
        taken when the suite started); default: whatever `python -m swarm` finds.
        `keyring`: a cluster key file every agent uses (encryption on); default
        --insecure."""
        if mode not in ("netns", "loopback"):
            raise ValueError(f"mode {mode!r}")
        self.n = n
        self.root = root
        self.run_id = run_id
        self.mode = mode
        self.log = log
        self.lan: netns.Lan | None = netns.Lan(run_id, n) if mode == "netns" else None
        self.tmpfs_nodes = dict(tmpfs_nodes or {})
        base_env = dict(os.environ if env is None else env)
        base_env["PYTHONUNBUFFERED"] = "1"
        base_env.pop("SWARM_CONFIG", None)
        if code is not None:
            base_env["PYTHONPATH"] = os.pathsep.join(
                [str(code), *filter(None, [base_env.get("PYTHONPATH")])]
            )
        self.agents: list[ChaosAgent] = []
        for i in range(1, n + 1):
            if self.lan is not None:
                prefix, bind, port = self.lan.exec_prefix(i), self.lan.addr(i), PORT
            else:
                prefix, bind, port = [], "127.0.0.1", _free_port()
            a = ChaosAgent(
                f"n{i}",
                i,
                root,
                exec_prefix=prefix,
                bind=bind,
                port=port,
                args=[*args, *(per_node_args or {}).get(i, [])],
                env=dict(base_env),
                cwd=code,
                keyring=keyring,
            )
            a.shim = shim
            self.agents.append(a)
        for a in self.agents:
            a.seeds = [b.endpoint for b in self.agents if b is not a]
        self.helpers: list[subprocess.Popen[bytes]] = []  # e.g. CPU hogs
        self._claimed = False

    def __enter__(self) -> ChaosCluster:
        try:
            self.start()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def by_name(self, name: str) -> ChaosAgent:
        for a in self.agents:
            if a.name == name:
                return a
        raise KeyError(name)

    # -------------------------------------------------------------- set-up

    def start(self) -> None:
        if self.lan is not None:
            swept = netns.sweep_leftovers()
            if swept:
                self.log(f"swept leftovers of earlier runs: {', '.join(swept)}")
            netns.claim_run(self.run_id)
            self._claimed = True
            self.lan.create()
        for i, mb in self.tmpfs_nodes.items():
            a = self.agents[i - 1]
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(a.state_dir)],
                check=True,
                capture_output=True,
            )
            a.tmpfs = a.state_dir
        for a in self.agents:
            a.start()
        for a in self.agents:
            a.wait_ready()

    def stop_all(self, timeout: float = 20.0) -> None:
        """SIGTERM every agent at once, then wait for each (SIGKILL after `timeout`)."""
        for a in self.agents:
            a.send_term()
        for a in self.agents:
            a.terminate(timeout=timeout)

    def teardown(self) -> None:
        with contextlib.suppress(Exception):
            self.stop_all(timeout=15)
        for a in self.agents:
            try:
                a.terminate(timeout=15)
            except Exception as e:  # keep tearing down the rest
                self.log(f"teardown: {a.name}: {e}")
        for p in self.helpers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.wait(5)
        self.helpers.clear()
        for a in self.agents:
            if a.tmpfs is not None:
                subprocess.run(["umount", "-l", str(a.tmpfs)], capture_output=True)
                a.tmpfs = None
        if self.lan is not None:
            self.lan.destroy()
        if self._claimed:
            netns.release_run(self.run_id)
            self._claimed = False

    def spawn_helper(self, index: int, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """A process in node `index`'s network namespace (e.g. a CPU hog); killed at teardown."""
        prefix = self.lan.exec_prefix(index) if self.lan is not None else []
        p = subprocess.Popen(
            [*prefix, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.helpers.append(p)
        return p

    # ------------------------------------------------------------ membership

    def views(self, agents: Sequence[ChaosAgent] | None = None) -> dict[str, dict[str, str]]:
        """Each reachable agent's membership view: node -> state (from `nodes`)."""
        out: dict[str, dict[str, str]] = {}
        for a in agents if agents is not None else self.agents:
            if not a.alive() or a.paused:
                continue
            try:
                with a.client(timeout=3) as c:
                    nodes = c.call("nodes")["nodes"]
            except (ClientError, OSError):
                continue
            out[a.name] = {str(x["node"]): str(x["state"]) for x in nodes}
        return out

    def live(self) -> list[ChaosAgent]:
        return [a for a in self.agents if a.alive() and not a.paused]

    def kept(self) -> list[ChaosAgent]:
        """The agents not lost for good (faults.Lose)."""
        return [a for a in self.agents if not a.lost]

    def agree(self) -> bool:
        """Every live agent sees exactly the live agents as alive."""
        live = self.live()
        names = {a.name for a in live}
        views = self.views(live)
        if set(views) != names:
            return False
        return all({k for k, v in vw.items() if v == "alive"} == names for vw in views.values())

    def wait_agree(self, timeout: float, poll: float = 0.5) -> float | None:
        """Seconds until `agree()`, or None when it did not happen within `timeout`."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.agree():
                return time.monotonic() - t0
            time.sleep(poll)
        return None

    def info(self, a: ChaosAgent) -> dict[str, Any] | None:
        try:
            with a.client(timeout=5) as c:
                return c.info()
        except (ClientError, OSError):
            return None


def snapshot_code(dest: Path) -> Path:
    """Copy the `swarm` package the harness imports into dest/swarm and return dest:
    agents started (and restarted) during a run all run this one build, even while the
    working tree changes under them."""
    import swarm

    src = Path(swarm.__file__).resolve().parent
    shutil.copytree(src, dest / "swarm", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def code_version(repo: Path) -> str:
    """`git describe` of the tree the snapshot came from, and how dirty swarm/ was."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", "swarm"],
            capture_output=True, text=True, timeout=10,
        ).stdout.splitlines()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}" + (f" + {len(dirty)} changed files in swarm/" if dirty else "")
