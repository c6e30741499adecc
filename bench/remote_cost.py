"""What one remote task costs the agents, with and without copies (issue 23).

A home agent (4 slots, label role=home) and `--workers` runner agents (16 slots each,
label role=worker) on loopback; `--tasks` tasks (default `true`) are submitted one by
one by 8 client threads at the home with the constraint role=worker, so every task is
placed remotely. Prints, for each `--replicas` setting given (the home's
`--replicas`; 2 makes one copy per task at another node, 1 none):

- submissions per second (8 clients, each waiting for its answer), and tasks ended
  per second (from the first submission until the home knew every end);
- the agents' CPU (user + system of the agent processes, not the tasks') per task,
  at the home and at the runners together, from the first submission until every
  task ended;
- the CPU of the runners' reaped children per task: the tasks' supervisors
  (swarm-shim) and the tasks themselves; not agent CPU, shown so that work moved from
  an agent into its shims is seen (stop 49 tried moving the cgroup joins there);
- the copies' messages (hold, runner, release) the home sent per task, and the
  batches (RPCs) they went in;
- journal operations and commits per task, at the home and at the runners together.

Settings are run in the order given, then again in reverse (`--rounds 2`), so the VM's
drift falls on each. Writes bench/results/remote_cost.json.

Where the agents' files live changes the runners' kernel time. This VM's disk is ext4
without a journal, where each inode allocation (two log files per task) steps over the
inodes freed in the last 1-6 minutes (`recently_deleted`, fs/ext4/ialloc.c): the
earlier runs' clean-up and test suites then add up to ~1 ms per task. `--fs ext4` (or
`ext4-nojournal`, this VM's kind) runs each setting on a new loop-mounted file system
of that kind (root, mkfs.ext4), made in `--dir` and removed after: the figure then
depends on the code, not on what the disk did before.

    python bench/remote_cost.py [--tasks 2000] [--workers 2] [--replicas 2,1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.client import Client
from swarm.localcluster import LocalAgent

HERE = Path(__file__).resolve().parent
BASE = ["--insecure", "--no-mdns", "--bind", "127.0.0.1", "--port", "0", "--profile", "lan"]
CLIENTS = 8


def _cpu(a: LocalAgent) -> float:
    assert a.proc is not None
    t = psutil.Process(a.proc.pid).cpu_times()
    return t.user + t.system


def _journal(a: LocalAgent) -> tuple[int, int]:
    """The agent's journal operations and commits so far (`swarm info`)."""
    with a.client() as c:
        info = c.info()
    return int(info["journal_ops"]), int(info["journal_commits"])


def _children(a: LocalAgent) -> float:
    """CPU of the agent's reaped children: each task's supervisor (swarm-shim) with the
    task itself, which the shim reaps (not agent CPU; shows what moved out of it)."""
    assert a.proc is not None
    t = psutil.Process(a.proc.pid).cpu_times()
    return t.children_user + t.children_system


def _sys(a: LocalAgent) -> float:
    """The kernel's share of `_cpu` (fork/exec, cgroup files, sockets, the journal)."""
    assert a.proc is not None
    return psutil.Process(a.proc.pid).cpu_times().system


def one(
    root: Path, tasks: int, workers: int, replicas: int, argv: list[str], clients: int = CLIENTS
) -> dict[str, Any]:
    args = [*BASE, "--log-level", "warning"]
    home = LocalAgent(
        root, "home", [*args, "--slots", "4", "--labels", "role=home", "--replicas", str(replicas)]
    ).start()
    seed = ["--seeds", f"127.0.0.1:{home.port}"]
    runners = [
        LocalAgent(root, f"w{i}", [*args, "--slots", "16", "--labels", "role=worker", *seed])
        for i in range(workers)
    ]
    for r in runners:
        r.start()
    try:
        with home.client() as c:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                nodes = c.call("nodes")["nodes"]
                if sum(1 for n in nodes if n["state"] == "alive" and n["load"]) == workers + 1:
                    break
                time.sleep(0.2)
            else:
                raise SystemExit("cluster did not converge")
        time.sleep(2)  # the members' first reports and replica choices settle
        j0 = [_journal(a) for a in (home, *runners)]
        home0, run0 = _cpu(home), sum(_cpu(r) for r in runners)
        hsys0, rsys0 = _sys(home), sum(_sys(r) for r in runners)
        kids0 = sum(_children(r) for r in runners)
        ids: list[str] = []

        def submit(k: int) -> None:
            with Client(home.socket, timeout=120) as c:
                for _ in range(k):
                    ids.append(c.submit(argv, cwd="/", constraints=["role=worker"]))

        threads = [
            threading.Thread(target=submit, args=(tasks // clients,)) for _ in range(clients)
        ]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        submitted = time.time() - t0
        with Client(home.socket, timeout=600) as c:
            records = [c.wait(i, timeout=600) for i in ids]
        ended = time.time() - t0  # the last task's end known at its home (or a bit after)
        with home.client() as c:
            counted = c.info()["coordinator"]
        ran: dict[str, int] = {}
        for r in runners:
            with r.client() as c:
                for key, v in c.info()["coordinator"].items():
                    ran[key] = ran.get(key, 0) + v
        j1 = [_journal(a) for a in (home, *runners)]
        n = len(ids)
        ok = sum(1 for r in records if r["state"] == "succeeded")
        remote = sum(1 for r in records if r["node"] != "home")
        return {
            "replicas": replicas,
            "clients": clients,
            "tasks": n,
            "succeeded": ok,
            "remote": remote,
            "submitted_per_s": n / submitted,
            # the whole burst through: the cluster's rate of completing tasks
            "ended_per_s": n / ended,
            "home_cpu_ms_per_task": (_cpu(home) - home0) / n * 1000,
            "runners_cpu_ms_per_task": (sum(_cpu(r) for r in runners) - run0) / n * 1000,
            "home_sys_ms_per_task": (_sys(home) - hsys0) / n * 1000,
            "runners_sys_ms_per_task": (sum(_sys(r) for r in runners) - rsys0) / n * 1000,
            # the shims and the tasks at the runners (reaped by the end: every task ended)
            "children_cpu_ms_per_task": (sum(_children(r) for r in runners) - kids0) / n * 1000,
            # the copies' traffic (issue 23): messages and batches from the home
            "replica_msgs_per_task": counted.get("replica_msgs", 0) / n,
            "replica_rpcs_per_task": counted.get("replica_rpcs", 0) / n,
            # handoff RPCs (batches of offers, commits, reports...) sent per task: the
            # home's, then the runners' together (their reports to the home)
            "handoff_rpcs_per_task": [
                counted.get("handoff_rpcs", 0) / n,
                ran.get("handoff_rpcs", 0) / n,
            ],
            # journal operations and commits (transactions) per task: the home's, then
            # the runners' together
            "journal_ops_per_task": [
                (j1[0][0] - j0[0][0]) / n,
                sum(b[0] - a[0] for a, b in zip(j0[1:], j1[1:], strict=True)) / n,
            ],
            "journal_commits_per_task": [
                (j1[0][1] - j0[0][1]) / n,
                sum(b[1] - a[1] for a, b in zip(j0[1:], j1[1:], strict=True)) / n,
            ],
        }
    finally:
        for a in [home, *runners]:
            a.stop()


FS_KINDS = ("dir", "ext4", "ext4-nojournal")


@contextlib.contextmanager
def fresh_fs(kind: str, under: Path) -> Any:
    """A directory for one run: `under` itself ("dir"), or the root of a new ext4 file
    system (4 GiB sparse image in `under`, loop-mounted), unmounted and removed after."""
    if kind == "dir":
        yield under
        return
    if os.geteuid() != 0:
        raise SystemExit(f"--fs {kind} needs root (mount)")
    with tempfile.TemporaryDirectory(prefix="swrc-fs-", dir=under) as tmp:
        image, mnt = Path(tmp) / "fs.img", Path(tmp) / "mnt"
        mnt.mkdir()
        with image.open("wb") as f:
            f.truncate(4 << 30)
        features = ["-O", "^has_journal"] if kind == "ext4-nojournal" else []
        subprocess.run(["mkfs.ext4", "-q", "-F", *features, str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--replicas", default="2,1", help="the home's --replicas settings")
    ap.add_argument("--rounds", type=int, default=2, help="passes (every other one reversed)")
    ap.add_argument("--task", default="true", help="the task's command")
    ap.add_argument("--clients", type=int, default=CLIENTS, help="client threads submitting")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "remote_cost.json")
    ap.add_argument("--dir", default="/tmp", help="where the agents' data directories go")
    ap.add_argument(
        "--fs",
        choices=FS_KINDS,
        default="dir",
        help="the agents' files in --dir itself, or on a new file system per run (root)",
    )
    args = ap.parse_args()
    settings = [int(x) for x in args.replicas.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="swrc-", dir=args.dir) as tmp:
        for r in range(args.rounds):
            for k, rep in enumerate(settings if r % 2 == 0 else settings[::-1]):
                with fresh_fs(args.fs, Path(tmp)) as where:
                    row = one(
                        where / f"r{r}-{k}",
                        args.tasks,
                        args.workers,
                        rep,
                        args.task.split(),
                        args.clients,
                    )
                rows.append(row)
                print(
                    f"replicas {rep}: {row['submitted_per_s']:.0f} submitted/s"
                    f" ({args.clients} clients), {row['ended_per_s']:.0f} ended/s;"
                    f" agent CPU per task: home {row['home_cpu_ms_per_task']:.2f} ms"
                    f" (kernel {row['home_sys_ms_per_task']:.2f}),"
                    f" runners {row['runners_cpu_ms_per_task']:.2f} ms"
                    f" (kernel {row['runners_sys_ms_per_task']:.2f});"
                    f" shims + tasks {row['children_cpu_ms_per_task']:.2f} ms;"
                    f" copy messages {row['replica_msgs_per_task']:.2f} per task"
                    f" in {row['replica_rpcs_per_task']:.2f} batches;"
                    " handoff RPCs per task: home"
                    f" {row['handoff_rpcs_per_task'][0]:.2f}, runners"
                    f" {row['handoff_rpcs_per_task'][1]:.2f};"
                    " journal ops (commits) per task: home"
                    f" {row['journal_ops_per_task'][0]:.2f}"
                    f" ({row['journal_commits_per_task'][0]:.2f}), runners"
                    f" {row['journal_ops_per_task'][1]:.2f}"
                    f" ({row['journal_commits_per_task'][1]:.2f});"
                    f" {row['remote']}/{row['tasks']} remote, {row['succeeded']} succeeded",
                    flush=True,
                )
    out = {
        "rows": rows,
        "config": {
            "tasks": args.tasks,
            "workers": args.workers,
            "task": args.task,
            "clients": args.clients,
            "fs": args.fs,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
