"""Start real agent processes on this machine: for the demo, the tests and the benches.

Each agent gets its own directory (state, socket, log). Processes are real
(`python -m swarm agent`), so everything goes through the real socket, journal and
CLI; nothing here reaches into an agent's memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .client import AgentUnreachable, Client, ClientError


def agent_argv(python: str, name: str, state_dir: Path, socket: Path) -> list[str]:
    """`python -m swarm agent` with a node's identity and paths: the head of every
    agent command line the demo, tests, benches and chaos harness start."""
    return [
        python,
        "-m",
        "swarm",
        "agent",
        "--node-id",
        name,
        "--state-dir",
        str(state_dir),
        "--socket",
        str(socket),
    ]


class LocalAgent:
    def __init__(
        self,
        root: Path,
        name: str,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket = self.dir / "sock"
        self.state_dir = self.dir / "state"
        self.log_path = self.dir / "agent.log"
        self.args = list(args)
        self.env = dict(os.environ if env is None else env)
        self.env.pop("SWARM_CONFIG", None)
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    def command(self) -> list[str]:
        return [
            *agent_argv(self.python, self.name, self.state_dir, self.socket),
            # local clusters (tests, demo, benches) are driven by whoever started them:
            # as root, that is root; later args may still say --no-allow-root-tasks
            *(["--allow-root-tasks"] if os.geteuid() == 0 else []),
            *self.args,
        ]

    def start(self, wait: bool = True, timeout: float = 30.0) -> LocalAgent:
        logf = open(self.log_path, "ab")  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                env=self.env,
                start_new_session=True,
            )
        finally:
            logf.close()
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"agent {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                with Client(self.socket, timeout=5) as c:
                    info = c.info()
                    if info.get("port"):
                        self.port = int(info["port"])
                    return info
            except (AgentUnreachable, ClientError, OSError) as e:
                last = str(e)
            time.sleep(0.05)
        raise TimeoutError(
            f"agent {self.name} not ready after {timeout}s ({last}):\n{self.log_tail()}"
        )

    def client(self, timeout: float | None = 60) -> Client:
        return Client(self.socket, timeout=timeout)

    def cli(
        self, *args: str, timeout: float = 120, input: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.python, "-m", "swarm", "--socket", str(self.socket), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            input=None if input is None else input.decode(),
        )

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not stop in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
