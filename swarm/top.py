"""`swarm top`: a live terminal view of the cluster's nodes and this node's recent tasks.

Plain ANSI redraws (no curses): the frame is built by a pure function from the
agent's `info`, `nodes` and `list` replies, so it can be tested without a terminal,
and `--once` prints exactly one frame (for scripts and for bug reports).

The view reads only what any member of the socket group may read: the nodes' stale
load reports (with their age: a node's line is what it last said, not the truth now)
and the tasks the caller may see (its own; root sees all).
"""

from __future__ import annotations

import os
import select
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from .client import AgentUnreachable, Client, ClientError
from .fmt import fmt_age, fmt_bytes, table_lines, term_safe

BAR = 16
CSI = "\x1b["


def load_index(ld: dict[str, Any]) -> float | None:
    """The fleet load index as `swarm nodes` shows it (None: draining)."""
    cap = (ld.get("shares") or 0) - (ld.get("reserved_shares") or 0)
    if cap <= 0:
        return None
    return 1024 * float(ld.get("weight_sum") or 0.0) / cap


def load_bar(running: int, queued: int, slots: int, width: int = BAR) -> str:
    """`[####++....]`: running tasks (#) and queued ones (+) against the slots."""
    slots = max(1, slots)
    run = min(width, round(width * running / slots))
    que = min(width - run, round(width * queued / slots))
    return "[" + "#" * run + "+" * que + "." * (width - run - que) + "]"


def node_rows(nodes: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for n in nodes:
        ld = n.get("load") or {}
        if ld:
            idx = load_index(ld)
            load = "drain" if idx is None else f"{idx:.2f}"
            bar = load_bar(int(ld.get("running", 0)), int(ld.get("queued", 0)), ld.get("slots", 1))
        else:
            load, bar = "-", "[" + " " * BAR + "]"
        rows.append(
            [
                str(n.get("node", "?")) + (" *" if n.get("self") else ""),
                str(n.get("state", "?")),
                bar,
                load,
                "-" if not ld else f"{ld.get('running', 0)}/{ld.get('slots', 0)}",
                "-" if not ld else str(ld.get("queued", 0)),
                "-" if not ld else str(ld.get("shares", "-")),
                "-" if not ld else f"{100 * float(ld.get('cpu_util', 0.0)):.0f}%",
                "-" if not ld else fmt_bytes(float(ld.get("mem_available", 0))),
                "-" if not ld else str(ld.get("isolation", "none")),
                fmt_age(n.get("load_age")),
            ]
        )
    return rows


NODE_HEADERS = ["NODE", "STATE", "LOAD", "INDEX", "RUN", "QUEUE", "SHARES", "CPU", "MEM FREE"]
NODE_HEADERS += ["ISOLATION", "REPORT AGE"]
TASK_HEADERS = ["ID", "USER", "STATE", "NODE", "RUNTIME", "AGE", "COMMAND"]


def task_rows(tasks: list[dict[str, Any]], now: float) -> list[list[str]]:
    rows = []
    for t in sorted(tasks, key=lambda t: float(t.get("created_at") or 0.0), reverse=True):
        spec = t.get("spec") or {}
        started = t.get("started_at")
        runtime = None
        if started is not None:
            runtime = float(t.get("finished_at") or now) - float(started)
        state = str(t.get("state", "?"))
        if t.get("signal") is not None:
            state += f" sig{t['signal']}"
        elif t.get("exit_code") not in (None, 0):
            state += f" {t['exit_code']}"
        rows.append(
            [
                str(spec.get("id", "?")),
                str(spec.get("user") or spec.get("uid") or "-"),
                state,
                str(t.get("node") or "-"),
                fmt_age(runtime),
                fmt_age(now - float(t.get("created_at") or now)),
                " ".join(str(a) for a in spec.get("argv") or ()),
            ]
        )
    return rows


def render(
    info: dict[str, Any] | None,
    nodes: list[dict[str, Any]],
    tasks: list[dict[str, Any]],
    *,
    width: int,
    height: int,
    now: float,
    error: str | None = None,
) -> list[str]:
    """One frame, at most `height` lines of at most `width` characters."""
    width = max(20, width)
    lines: list[str] = []
    clock = time.strftime("%H:%M:%S", time.localtime(now))
    if info is not None:
        alive = sum(1 for n in nodes if n.get("state") == "alive")
        title = (
            f"swarm top  node {info.get('node', '?')}  {alive}/{len(nodes)} nodes alive  "
            f"{info.get('running', 0)} running  {info.get('queued', 0)} queued  "
            f"up {fmt_age(info.get('uptime'))}"
        )
    else:
        title = "swarm top"
    lines.append(title.ljust(max(0, width - len(clock) - 1)) + " " + clock)
    if error:
        lines.append(f"! {error}")
    lines.append("")
    lines.extend(table_lines(node_rows(nodes), NODE_HEADERS))
    lines.append("")
    room = max(0, height - len(lines) - 2)
    rows = task_rows(tasks, now)
    lines.append(f"RECENT TASKS ({len(rows)})")
    lines.extend(table_lines(rows[:room], TASK_HEADERS))
    # tables escape their cells; the title (node name) and error lines are data too
    return [term_safe(ln)[:width] for ln in lines[: max(1, height)]]


Fetch = Callable[[int], tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]]


def fetcher(path: str | os.PathLike[str] | None, timeout: float = 5.0) -> Fetch:
    def fetch(limit: int) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        with Client(path, timeout=timeout) as c:
            info = c.info()
            nodes = c.call("nodes")["nodes"]
            tasks = c.list(all=True, limit=limit)
        return info, nodes, tasks

    return fetch


def frame(fetch: Fetch, width: int, height: int) -> tuple[list[str], str | None]:
    """Fetch and render; an unreachable agent gives an empty frame with the error."""
    try:
        info, nodes, tasks = fetch(max(10, height))
    except (AgentUnreachable, ClientError, OSError) as e:
        return render(None, [], [], width=width, height=height, now=time.time(), error=str(e)), str(
            e
        )
    return render(info, nodes, tasks, width=width, height=height, now=time.time()), None


def run(
    fetch: Fetch,
    *,
    once: bool = False,
    interval: float = 1.0,
    out: TextIO | None = None,
    keys: TextIO | None = None,
) -> int:
    """`--once`: print one frame (exit 69 if the agent is unreachable). Otherwise redraw
    every `interval` seconds until q or Ctrl-C."""
    out = out or sys.stdout
    keys = sys.stdin if keys is None else keys
    if once:
        size = shutil.get_terminal_size((120, 40))
        lines, err = frame(fetch, size.columns, size.lines if out.isatty() else 1000)
        out.write("\n".join(lines) + "\n")
        out.flush()
        return 69 if err else 0
    restore = _cbreak(keys)
    out.write(CSI + "?1049h" + CSI + "?25l")  # alternate screen, hide the cursor
    try:
        while True:
            size = shutil.get_terminal_size((120, 40))
            lines, _ = frame(fetch, size.columns, size.lines)
            out.write(CSI + "H" + (CSI + "K\n").join(lines) + CSI + "K" + CSI + "J")
            out.flush()
            if _wait_quit(keys, interval):
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        out.write(CSI + "?25h" + CSI + "?1049l")
        out.flush()
        restore()


def _cbreak(keys: TextIO) -> Callable[[], None]:
    """Single keypresses without echo, when stdin is a terminal."""
    try:
        import termios
        import tty

        fd = keys.fileno()
        if not os.isatty(fd):
            return lambda: None
        old = termios.tcgetattr(fd)
        tty.setcbreak(fd)
    except (ImportError, OSError, ValueError):
        return lambda: None

    def restore() -> None:
        try:
            termios.tcsetattr(fd, termios.TCSADRAIN, old)
        except OSError:
            pass

    return restore


def _wait_quit(keys: TextIO, timeout: float) -> bool:
    """Sleep up to `timeout`; True if q (or Q) was pressed."""
    try:
        fd = keys.fileno()
        if not os.isatty(fd):
            time.sleep(timeout)
            return False
    except (OSError, ValueError):
        time.sleep(timeout)
        return False
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            ch = os.read(fd, 32)
            if not ch or b"q" in ch.lower():
                return True
    return False
