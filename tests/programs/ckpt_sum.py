"""A CPU-bound task that checkpoints when asked and resumes from its checkpoint.

It computes sum(i*i for i in range(n)) mod 2**61 - 1 in blocks. On the checkpoint
signal (SIGUSR1 unless --signal says otherwise) it finishes the current block,
writes its progress to $SWARM_STATE_DIR/progress.json (atomically), and exits with
the checkpoint code (85): "checkpointed, move me". On start it resumes from that
file when there is one, so the result is the same however often it moved.

Output (stdout): "run R on NODE from i=I" at every start, "resumed ... pause=S" after
a checkpoint (S: seconds from receiving the signal to computing again, across
hosts), and finally "result=V runs=R nodes=N1,N2,...".

--state-bytes N keeps an extra N-byte file in the state dir (written once) to stand
for a large state; --sleep S sleeps S seconds per block (cheap tests on busy
machines); --ckpt-delay S makes writing a checkpoint take S seconds longer.
Run with --expect N to print the expected result only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

MOD = (1 << 61) - 1
CKPT_EXIT = 85


def expected(n: int) -> int:
    return ((n - 1) * n * (2 * n - 1) // 6) % MOD


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2_000_000)
    p.add_argument("--block", type=int, default=20_000)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--state-bytes", type=int, default=0)
    p.add_argument("--ckpt-delay", type=float, default=0.0)
    p.add_argument("--signal", default="SIGUSR1")
    p.add_argument("--exit-code", type=int, default=CKPT_EXIT)
    p.add_argument("--tag", default="")  # lets a test find its processes
    p.add_argument("--expect", action="store_true")
    a = p.parse_args(argv)
    if a.expect:
        print(expected(a.n))
        return 0
    state_dir = os.environ.get("SWARM_STATE_DIR")
    node = os.environ.get("SWARM_NODE", "?")
    if not state_dir:
        print("no SWARM_STATE_DIR (submit with --migrate checkpoint)", file=sys.stderr)
        return 2
    path = os.path.join(state_dir, "progress.json")
    st: dict[str, Any] = {"next": 0, "acc": 0, "runs": 0, "nodes": [], "signalled_at": None}
    if os.path.exists(path):
        with open(path) as fh:
            st.update(json.load(fh))
    st["runs"] += 1
    st["nodes"].append(node)
    print(f"run {st['runs']} on {node} from i={st['next']}", flush=True)
    if st["signalled_at"] is not None:
        print(f"resumed on {node} pause={time.time() - st['signalled_at']:.4f}", flush=True)
        st["signalled_at"] = None
    if a.state_bytes:
        blob = os.path.join(state_dir, "blob.bin")
        if not os.path.exists(blob) or os.path.getsize(blob) != a.state_bytes:
            with open(blob, "wb") as fh:
                left = a.state_bytes
                piece = os.urandom(1 << 20)
                while left > 0:
                    fh.write(piece[: min(left, len(piece))])
                    left -= len(piece)
        print(f"state ready: {a.state_bytes} bytes", flush=True)
    asked: list[float] = []
    signal.signal(getattr(signal, a.signal), lambda signum, frame: asked.append(time.time()))
    i, acc = st["next"], st["acc"]
    while i < a.n:
        end = min(a.n, i + a.block)
        acc = (acc + sum(k * k for k in range(i, end))) % MOD
        i = end
        if asked:
            time.sleep(a.ckpt_delay)
            st.update(next=i, acc=acc, signalled_at=asked[0])
            tmp = path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(st, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            print(f"checkpointed at i={i} on {node}", flush=True)
            return int(a.exit_code)
        if a.sleep:
            time.sleep(a.sleep)
    print(f"result={acc} runs={st['runs']} nodes={','.join(st['nodes'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
