"""Migration pause and state transfer throughput between two real agents on loopback.

For state sizes of 1 MB, 100 MB and 1 GB, a checkpointing task
(tests/programs/ckpt_sum.py with --state-bytes) runs on an overloaded node; a drained
idle node is undrained, the agent decides to move the task there, and the task
checkpoints, its state streams over the encrypted transport (a fresh cluster key),
and it resumes on the target. Measured per size:

- transfer: bytes / seconds of the state stream, from the first frame to the target's
  answer after it verified, fsynced and installed the state;
- pause (agent): from the checkpoint signal at the source to the task's process
  starting on the target (the migration record's pause_s);
- pause (task): what the task itself saw, from receiving the signal to computing
  again on the target (includes writing its checkpoint and starting Python);
- cp: copying the same bytes with `cp` followed by `sync` of the copy, in the same
  run, and the ratio of the transfer time to it.

Prints a table and writes bench/results/migration.json. Sizes can be chosen with
--sizes (bytes, comma-separated); --reps repeats the small sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarm.localcluster import LocalAgent  # noqa: E402

HERE = Path(__file__).resolve().parent
CKPT = ROOT / "tests" / "programs" / "ckpt_sum.py"
SIZES = (1_000_000, 100_000_000, 1_000_000_000)
AGENT_ARGS = ["--no-mdns", "--port", "0", "--profile", "local", "--bind", "127.0.0.1"]


def wait_for(cond: Any, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def status(a: LocalAgent, tid: str) -> dict[str, Any]:
    with a.client() as c:
        return c.call("status", id=tid)


def peer_shares(a: LocalAgent, peer: str) -> int | None:
    with a.client() as c:
        for n in c.call("nodes")["nodes"]:
            if n["node"] == peer and n.get("load"):
                return int(n["load"]["shares"])
    return None


def cp_time(work: Path, nbytes: int) -> float:
    """Seconds to `cp` a file of nbytes and `sync` the copy (the target fsyncs too)."""
    src, dst = work / "cp-src.bin", work / "cp-dst.bin"
    with open(src, "wb") as fh:
        left, piece = nbytes, os.urandom(1 << 20)
        while left > 0:
            fh.write(piece[: min(left, len(piece))])
            left -= len(piece)
    subprocess.run(["sync", str(src)], check=True)
    t0 = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    subprocess.run(["sync", str(dst)], check=True)
    secs = time.perf_counter() - t0
    src.unlink()
    dst.unlink()
    return secs


def one_move(p1: LocalAgent, p2: LocalAgent, nbytes: int) -> dict[str, Any]:
    argv = [sys.executable, str(CKPT), "--n", "100000000", "--sleep", "0.05"]
    argv += ["--state-bytes", str(nbytes)]
    with p1.client() as c:
        tid = c.submit(argv, cwd="/", migrate="checkpoint", expected_runtime=3600.0)
    wait_for(lambda: "state ready" in p1.cli("logs", tid).stdout, 300, "the task's state")
    assert status(p1, tid)["task"]["node"] == p1.name
    p2.cli("undrain")

    def resumed() -> bool:
        return any(m.get("pause_s") is not None for m in status(p1, tid)["migrations"])

    wait_for(resumed, 600, "the task to resume on the target")
    rec = next(m for m in status(p1, tid)["migrations"] if m.get("pause_s") is not None)
    wait_for(lambda: "resumed on" in p1.cli("logs", tid).stdout, 60, "the task's own report")
    out = p1.cli("logs", tid).stdout
    task_pause = float(out.split("resumed on ")[1].split("pause=")[1].split()[0])
    with p1.client() as c:
        c.cancel(tid)
    p2.cli("drain")
    wait_for(lambda: peer_shares(p1, p2.name) == 0, 30, "the drain to be seen")
    assert rec["outcome"] == "moved" and rec["to"] == p2.name, rec
    return {
        "bytes": rec["bytes"],
        "transfer_s": rec["transfer_s"],
        "bytes_per_s": rec["bytes"] / rec["transfer_s"],
        "pause_s": rec["pause_s"],
        "task_pause_s": task_pause,
        "stop_s": rec.get("stop_s"),
        "handover_s": rec.get("handover_s"),
    }


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(float(r[key]) for r in runs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--reps", type=int, default=3, help="repetitions of sizes under 500 MB")
    ap.add_argument("--keep", action="store_true", help="keep the agents' logs (info level)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="sw-mig-"))
    key = work / "cluster.key"
    subprocess.run([sys.executable, "-m", "swarm", "keygen", "-o", str(key)], check=True)
    level = "info" if args.keep else "warning"
    common = [*AGENT_ARGS, "--keyring", str(key), "--slots", "64", "--log-level", level]
    p1 = LocalAgent(work, "p1", common).start()
    agents = [p1]
    results: list[dict[str, Any]] = []
    try:
        p2 = LocalAgent(work, "p2", [*common, "--seeds", f"127.0.0.1:{p1.port}"]).start()
        agents.append(p2)
        wait_for(lambda: peer_shares(p1, "p2") is not None, 60, "p2 to join")
        p2.cli("drain")
        wait_for(lambda: peer_shares(p1, "p2") == 0, 30, "the drain to be seen")
        with p1.client() as c:  # overload: 40 running sleeps on 64 slots
            for _ in range(40):
                c.submit(["sleep", "3600"], cwd="/")
        wait_for(lambda: p1.client().info()["running"] >= 40, 60, "the load")
        for nbytes in sizes:
            reps = args.reps if nbytes < 500_000_000 else 1
            runs = [one_move(p1, p2, nbytes) for _ in range(reps)]
            cps = [cp_time(work, nbytes) for _ in range(reps)]
            transfer = median_of(runs, "transfer_s")
            row = {
                "state_bytes": nbytes,
                "reps": reps,
                "transfer_s": transfer,
                "transfer_MBps": nbytes / transfer / 1e6,
                "pause_s": median_of(runs, "pause_s"),
                "task_pause_s": median_of(runs, "task_pause_s"),
                "handover_s": median_of(runs, "handover_s"),
                "cp_s": statistics.median(cps),
                "cp_MBps": nbytes / statistics.median(cps) / 1e6,
                "transfer_over_cp": transfer / statistics.median(cps),
                "runs": runs,
            }
            results.append(row)
            print(
                f"{nbytes / 1e6:>8.0f} MB  transfer {row['transfer_s']:7.3f}s "
                f"({row['transfer_MBps']:7.1f} MB/s)  pause {row['pause_s']:6.3f}s "
                f"(task saw {row['task_pause_s']:6.3f}s)  cp {row['cp_s']:6.3f}s "
                f"({row['cp_MBps']:7.1f} MB/s)  transfer/cp {row['transfer_over_cp']:5.2f}x",
                flush=True,
            )
    finally:
        for a in agents:
            a.stop()
    out = {
        "bench": "migration",
        "transport": "loopback, encrypted (AES-GCM cluster key)",
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "results": results,
    }
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "migration.json").write_text(json.dumps(out, indent=2) + "\n")
    if args.keep:
        print(f"agents' directories and logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {HERE / 'results' / 'migration.json'}")


if __name__ == "__main__":
    main()
