"""The least a runner's start of a task costs, from Python, with no agent around it
(issue 23: what a faster start path could save at best).

One process repeats a runner's per-task start sequence, `--inflight` tasks at a time:
the task's cgroup directories (cpu and memory, cgroup v1, as the agent makes them),
two log files, the shim's status directory and report pipe, the starting thread's
join of the groups, Popen of swarm-shim running the task (default `true`), the
thread's way back; then the shim's report, the wait, the exit file, and the removals.
No journal, no protocol, no event loop. Prints, per round:

- starts per second (one thread: the ceiling of a runner that did only this);
- the starter's CPU per task (user + system, this process);
- the CPU of its children per task (the shims and the tasks: not the agent's CPU).

`--modes` (interleaved, round after round, as the VM drifts): `full`; `no-cgroups`
(as where the agent has none); `no-shim` (Popen of the task itself, as without a C
compiler). Writes bench/results/start_floor.json. Needs root for the groups.

    python bench/start_floor.py [--tasks 1500] [--rounds 3] [--inflight 16]
        [--modes full,no-cgroups,no-shim]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.runtime import isolation as iso
from swarm.runtime import shim as shimmod
from swarm.runtime.procstart import write_control

HERE = Path(__file__).resolve().parent
CG = Path("/sys/fs/cgroup")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "SWARM_TASK_ID": "t" * 24}


def own_groups() -> list[Path] | None:
    """This process's own cpu and memory groups (v1), where the task groups go; None
    where there are none to use (no v1 hierarchies, not root)."""
    _, v1 = iso.own_cgroups(Path("/proc/self/cgroup").read_text())
    out = []
    for ctrl in ("cpu", "memory"):
        if ctrl not in v1 or not (CG / ctrl / "tasks").exists():
            return None
        d = CG / ctrl / v1[ctrl].lstrip("/")
        if not os.access(d, os.W_OK):
            return None
        out.append(d)
    return out


class Starter:
    def __init__(self, root: Path, argv: list[str], cgroups: bool, shim: Path | None) -> None:
        self.root, self.argv, self.shim = root, argv, shim
        self.homes = (own_groups() or []) if cgroups else []
        self.parents = [h / f"swarm-floor-{os.getpid()}" for h in self.homes]
        for p in self.parents:
            p.mkdir(exist_ok=True)
        (root / "logs").mkdir()
        (root / "st").mkdir()

    def start(self, i: int) -> tuple[Any, ...]:
        tid = f"t{i}"
        groups = [p / tid for p in self.parents]
        for g in groups:
            g.mkdir()
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        out = os.open(self.root / "logs" / f"{tid}.out", flags, 0o666)
        err = os.open(self.root / "logs" / f"{tid}.err", flags, 0o666)
        sd = self.root / "st" / tid
        argv: list[str] = self.argv
        kwargs: dict[str, Any] = {}
        r = w = -1
        if self.shim is not None:
            sd.mkdir(mode=0o700)
            r, w = os.pipe2(os.O_CLOEXEC)
            argv = shimmod.argv(self.shim, w, sd, self.argv)
            kwargs = {"pass_fds": (w,)}
        me = str(threading.get_native_id())
        for g in groups:
            write_control(g / "tasks", me)
        try:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=ENV,
                cwd="/",
                start_new_session=True,
                close_fds=True,
                umask=0o022,
                **kwargs,
            )
        finally:
            for h in self.homes:
                write_control(h / "tasks", me)
        for fd in (w, out, err):
            if fd >= 0:
                os.close(fd)
        return p, r, groups, sd, tid

    def finish(
        self, p: subprocess.Popen[bytes], r: int, groups: list[Path], sd: Path, tid: str
    ) -> None:
        if r >= 0:
            os.read(r, shimmod.MAX_REPORT)
            os.close(r)
        p.wait()
        if self.shim is not None:
            shimmod.read_exit(sd)
            os.unlink(sd / shimmod.EXIT_FILE)
            sd.rmdir()
        for g in groups:
            g.rmdir()
        for ext in ("out", "err"):
            os.unlink(self.root / "logs" / f"{tid}.{ext}")

    def close(self) -> None:
        for p in self.parents:
            p.rmdir()


def one_round(s: Starter, n: int, inflight: int) -> dict[str, float]:
    pending: list[tuple[Any, ...]] = []
    t0 = time.perf_counter()
    me0 = resource.getrusage(resource.RUSAGE_SELF)
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for i in range(n):
        pending.append(s.start(i))
        if len(pending) >= inflight:
            s.finish(*pending.pop(0))
    while pending:
        s.finish(*pending.pop(0))
    wall = time.perf_counter() - t0
    me1 = resource.getrusage(resource.RUSAGE_SELF)
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)

    def ms(a: resource.struct_rusage, b: resource.struct_rusage) -> float:
        return (b.ru_utime - a.ru_utime + b.ru_stime - a.ru_stime) / n * 1000

    return {"starts_per_s": n / wall, "starter_ms": ms(me0, me1), "children_ms": ms(kids0, kids1)}


MODES = ("full", "no-cgroups", "no-shim")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inflight", type=int, default=16, help="tasks started, not yet reaped")
    ap.add_argument("--task", default="true", help="the task's command")
    ap.add_argument("--modes", default=",".join(MODES), help="interleaved: " + ", ".join(MODES))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "start_floor.json")
    args = ap.parse_args()
    modes = [x.strip() for x in args.modes.split(",") if x.strip()]
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"--modes: unknown mode {mode!r} (known: {', '.join(MODES)})")
    if own_groups() is None and any(m != "no-cgroups" for m in modes):
        print("no writable cgroup v1 cpu and memory hierarchies here: no-cgroups only")
        modes = ["no-cgroups"]
    shim = shimmod.build(Path(tempfile.mkdtemp(prefix="swfloor-bin-")) / "private")
    rows = []
    with tempfile.TemporaryDirectory(prefix="swfloor-", dir="/var/tmp") as tmp:
        for k in range(args.rounds):
            for j, mode in enumerate(modes):
                root = Path(tmp) / f"{k}-{j}"
                root.mkdir()
                s = Starter(
                    root,
                    args.task.split(),
                    cgroups=mode != "no-cgroups",
                    shim=None if mode == "no-shim" else shim,
                )
                try:
                    row = {"round": k + 1, "mode": mode, **one_round(s, args.tasks, args.inflight)}
                finally:
                    s.close()
                rows.append(row)
                print(
                    f"round {k + 1} {mode:>10}: {row['starts_per_s']:.0f} starts/s;"
                    f" starter CPU {row['starter_ms']:.3f} ms/task;"
                    f" shims and tasks {row['children_ms']:.3f} ms/task",
                    flush=True,
                )
    out = {
        "rows": rows,
        "config": {"tasks": args.tasks, "inflight": args.inflight, "task": args.task},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
