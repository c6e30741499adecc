"""Cost of the pure placement and transfer decisions at simulator scale.

Prints a table and writes bench/results/policy.json: microseconds per call of
- `place` (d=2) over a LoadView of N peers, and over a plain dict of N peers (which
  must copy its keys per call: the reason LoadView exists);
- `place` with a reservation that fits almost nowhere (bounded rejection sampling);
- `cluster_load` (64-peer sample) and one `TransferPolicy.step` that starts a round;
plus the max-load figure of balls-into-bins with d=1 and d=2 (fresh reports).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.model import LoadReport, TaskSpec
from swarm.policy.placement import Needs, place
from swarm.policy.transfer import QueuedTask, TransferPolicy, cluster_load
from swarm.policy.view import LoadView, PeerEntry

HERE = Path(__file__).resolve().parent


def per_call_us(fn: Callable[[], object], min_time: float = 0.5) -> float:
    n = 0
    t0 = time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_time and n >= 20:
            return dt / n * 1e6


def build(n: int, rng: random.Random) -> LoadView:
    v = LoadView()
    for i in range(n):
        v.upsert(
            LoadReport(
                f"n{i}",
                1,
                shares=rng.choice([1024, 2048]),
                reserved_shares=rng.choice([0, 0, 512]),
                weight_sum=float(rng.randrange(8)),
                queued=rng.randrange(3),
            ),
            0.0,
        )
    return v


def balls(n: int, d: int, seed: int) -> int:
    rng = random.Random(seed)
    v = LoadView({f"n{i}": PeerEntry(LoadReport(f"n{i}", 1), 0.0) for i in range(n)})
    counts = [0] * n
    origin = LoadReport("origin", 1, shares=0)
    for j in range(n):
        p = place(TaskSpec(id=f"t{j}", argv=("x",)), origin, v, rng, 0.0, d=d)
        assert p.target is not None
        k = int(p.target[1:])
        counts[k] += 1
        v.upsert(LoadReport(p.target, 1, weight_sum=float(counts[k])), 0.0)
    return max(counts)


def measure(n: int, rng: random.Random) -> dict[str, float]:
    v = build(n, rng)
    d = dict(v.items())
    spec = TaskSpec(id="t", argv=("x",))
    rare = TaskSpec(id="r", argv=("x",), reserve_shares=2000)
    local = LoadReport("me", 1, weight_sum=3.0)
    q = [QueuedTask(f"q{i}", Needs(), float(i), -1e9) for i in range(4)]
    heavy = LoadReport("me", 1, weight_sum=40.0, queued=4)
    return {
        "peers": n,
        "place_loadview_us": per_call_us(lambda: place(spec, local, v, rng, 0.0)),
        "place_dict_us": per_call_us(lambda: place(spec, local, d, rng, 0.0)),
        "place_rare_reservation_us": per_call_us(lambda: place(rare, local, v, rng, 0.0)),
        "cluster_load_us": per_call_us(lambda: cluster_load(local, v, rng)),
        # a fresh policy per call, so every call computes the level and starts a round
        "transfer_step_us": per_call_us(lambda: TransferPolicy("me").step(0.0, heavy, q, v, rng)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="*", default=[100, 1000, 10_000])
    args = ap.parse_args()
    rng = random.Random(1)
    rows = []
    print(
        f"{'peers':>7} {'place LoadView':>15} {'place dict':>11} {'rare resv':>10}"
        f" {'cluster_load':>13} {'step':>8}   (us/call)"
    )
    for n in args.nodes:
        row = measure(n, rng)
        rows.append(row)
        print(
            f"{n:>7} {row['place_loadview_us']:>15.1f} {row['place_dict_us']:>11.1f}"
            f" {row['place_rare_reservation_us']:>10.1f} {row['cluster_load_us']:>13.1f}"
            f" {row['transfer_step_us']:>8.1f}"
        )
    bb = {f"d{d}": [balls(2000, d, s) for s in range(1, 6)] for d in (1, 2)}
    print(f"balls-into-bins n=m=2000, max load over 5 seeds: d=1 {bb['d1']}  d=2 {bb['d2']}")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    results = {"rows": rows, "balls_into_bins_n2000_max": bb}
    (out / "policy.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {out / 'policy.json'}")


if __name__ == "__main__":
    main()
