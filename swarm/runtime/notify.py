"""sd_notify for `Type=notify` units: READY, STATUS, WATCHDOG and STOPPING.

systemd's protocol is one datagram of newline-separated `KEY=VALUE` lines to the
AF_UNIX socket named by $NOTIFY_SOCKET (a leading `@` means the abstract namespace).
We speak it directly instead of linking libsystemd: it is a dozen lines, and the agent
must run unchanged where there is no systemd at all (then every call is a no-op).

Sending never blocks and never raises: a notification that cannot be delivered is
counted in `failures` (systemd will notice a missing READY or WATCHDOG by itself,
which is the point of those messages).

The watchdog is pinged from a trio task, so a ping proves the event loop still turns:
a loop stuck in a blocking call misses its pings and systemd restarts the agent.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping

import trio

from .clock import Clock

ENV_SOCKET = "NOTIFY_SOCKET"
ENV_WATCHDOG_USEC = "WATCHDOG_USEC"
ENV_WATCHDOG_PID = "WATCHDOG_PID"
MAX_STATUS = 1024  # systemd truncates long STATUS= lines anyway; keep datagrams small


def socket_address(value: str | None) -> str | bytes | None:
    """The address to send to, from $NOTIFY_SOCKET (None: not under systemd)."""
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # vsock and other forms are not used for services on a host


def watchdog_interval(env: Mapping[str, str], pid: int | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half systemd's timeout), or None if off.

    systemd sets WATCHDOG_PID when the watchdog is meant for one process; a child
    that inherited the environment must not ping for its parent.
    """
    usec = env.get(ENV_WATCHDOG_USEC)
    if not usec:
        return None
    want_pid = env.get(ENV_WATCHDOG_PID)
    if want_pid and want_pid != str(os.getpid() if pid is None else pid):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return value / 1e6 / 2


class Notifier:
    """Sends sd_notify messages; a no-op when $NOTIFY_SOCKET is unset."""

    def __init__(self, env: Mapping[str, str] | None = None, clock: Clock | None = None) -> None:
        env = os.environ if env is None else env
        self.clock = clock or Clock.system()
        self.address = socket_address(env.get(ENV_SOCKET))
        self.watchdog = watchdog_interval(env)
        self.sent = 0
        self.failures = 0
        self.last_error = ""
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """Send one datagram with these `KEY=VALUE` fields; False if not delivered."""
        if self.address is None or not fields:
            return False
        data = "\n".join(_clean(f) for f in fields).encode("utf-8", "replace")
        try:
            if self._sock is None:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                s.setblocking(False)
                self._sock = s
            self._sock.sendto(data, self.address)
        except OSError as e:
            self.failures += 1
            self.last_error = e.strerror or str(e)
            return False
        self.sent += 1
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *((f"STATUS={status}",) if status else ()))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def ping(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1", *((f"STATUS={status}",) if status else ()))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def run(
        self,
        *,
        joined: Callable[[], bool],
        join_wait: float,
        status: Callable[[], str],
        status_interval: float = 5.0,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """READY once joined (or `join_wait` seconds passed), then STATUS and WATCHDOG
        pings until cancelled. Call it after the socket listens."""
        task_status.started()
        if not self.enabled:
            return
        last_ping = self.clock.now()
        with trio.move_on_after(join_wait):
            while not joined():
                await trio.sleep(0.05)
                if self.watchdog is not None and self.clock.now() - last_ping >= self.watchdog:
                    self.ping()  # a long join-wait must not trip the watchdog
                    last_ping = self.clock.now()
        self.ready(status())
        period = status_interval if self.watchdog is None else min(status_interval, self.watchdog)
        next_status = self.clock.now() + status_interval
        while True:
            await trio.sleep(period)
            if self.watchdog is not None:
                self.ping()
            if self.clock.now() >= next_status:
                self.status(status())
                next_status = self.clock.now() + status_interval


def _clean(field: str) -> str:
    """One line per field: a newline inside STATUS would start a bogus assignment."""
    return field.replace("\n", " ")[:MAX_STATUS]
