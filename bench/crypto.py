"""Packet sealing cost: seal/open per second by payload size, one core.

Prints a table and writes bench/results/crypto.json. `open` includes the replay
window and freshness checks; "reject" is the cost of dropping a forged packet (a
valid key hint, wrong tag), the price of a flood of garbage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.crypto import CryptoError, Keyring, Sealer

HERE = Path(__file__).resolve().parent
NOW = 1_800_000_000.0


def rate(fn: Callable[[], object], min_time: float) -> float:
    n = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(100):
            fn()
        n += 100
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return n / dt


def measure(ring: Keyring, size: int, min_time: float) -> dict[str, float]:
    a = Sealer(ring, "bench")
    b = Sealer(ring, "bench")
    payload = os.urandom(size)
    seal_rate = rate(lambda: a.seal(payload, NOW), min_time)
    packets = [a.seal(payload, NOW) for _ in range(int(seal_rate * min_time) + 1000)]
    it = iter(packets)
    open_rate = rate(lambda: b.open(next(it), NOW), min_time * 0.8)
    forged = bytearray(packets[0])
    forged[-1] ^= 1
    forged_b = bytes(forged)

    def reject() -> None:
        try:
            b.open(forged_b, NOW)
        except CryptoError:
            pass

    reject_rate = rate(reject, min_time)
    return {
        "payload_bytes": size,
        "seal_per_s": round(seal_rate),
        "open_per_s": round(open_rate),
        "reject_per_s": round(reject_rate),
        "seal_MB_s": round(seal_rate * size / 1e6, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--time", type=float, default=0.5, help="seconds per measurement")
    args = ap.parse_args()
    ring = Keyring.from_keys([os.urandom(32), os.urandom(32)])
    rows = [measure(ring, size, args.time) for size in (64, 1400, 65536)]
    print(f"{'bytes':>7} {'seal/s':>10} {'open/s':>10} {'reject/s':>10} {'seal MB/s':>10}")
    for r in rows:
        print(
            f"{r['payload_bytes']:>7} {r['seal_per_s']:>10} {r['open_per_s']:>10}"
            f" {r['reject_per_s']:>10} {r['seal_MB_s']:>10}"
        )
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "crypto.json").write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
