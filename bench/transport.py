"""Transport figures on loopback, sealed and plain: UDP datagrams/s delivered,
TCP request/response latency (p50/p99, a new connection per request as the agent
does), and stream throughput with 256 KiB frames (checkpoint copy).

Prints a table and writes bench/results/transport.json. Both ends run in one
process (one core for both), so these are lower bounds for two hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.crypto import Keyring, Sealer
from swarm.runtime.net import FramedStream, Transport, TransportConfig, open_transport

HERE = Path(__file__).resolve().parent


async def udp_rate(a: Transport, b: Transport, n: int) -> float:
    payload = os.urandom(1200)
    got = 0
    done = trio.Event()

    def on_packet(src: Any, p: bytes, reliable: bool) -> None:
        nonlocal got
        got += 1
        if got == n:
            done.set()

    b.on_packet = on_packet
    t0 = time.perf_counter()
    for i in range(n):
        await a.send_packet(b.advertise, payload)
        if i % 64 == 0:
            await trio.sleep(0)  # let the receiver drain (same thread)
    with trio.move_on_after(10):
        await done.wait()
    return got / (time.perf_counter() - t0)


async def request_latency(a: Transport, b: Transport, n: int) -> list[float]:
    async def echo(stream: FramedStream, peer: Any) -> None:
        await stream.send(await stream.receive())

    b.serve(echo)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await a.request(b.advertise, {"i": i, "x": b"y" * 200}, timeout=10)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


async def stream_rate(a: Transport, b: Transport, total: int) -> float:
    chunk = os.urandom(256 * 1024)

    async def sink(stream: FramedStream, peer: Any) -> None:
        n = 0
        async for obj in stream:
            n += len(obj)
        await trio.sleep(0)

    b.serve(sink)
    t0 = time.perf_counter()
    async with await a.open_stream(b.advertise) as s:
        sent = 0
        while sent < total:
            await s.send(chunk)
            sent += len(chunk)
    return total / (time.perf_counter() - t0) / 1e6


async def run(secure: bool, args: argparse.Namespace) -> dict[str, Any]:
    ring = Keyring.from_keys([os.urandom(32)])
    cfg = TransportConfig(cluster="bench", bind_host="127.0.0.1")

    def sealer() -> Sealer | None:
        return Sealer(ring, "bench") if secure else None

    async with open_transport(cfg, sealer()) as a, open_transport(cfg, sealer()) as b:
        udp = await udp_rate(a, b, args.packets)
        lat = await request_latency(a, b, args.requests)
        mbs = await stream_rate(a, b, args.stream_mb * 1024 * 1024)
        drops = {k: v for k, v in b.counters.items() if k.startswith("dropped_") and v}
    q = statistics.quantiles(lat, n=100)
    return {
        "mode": "sealed" if secure else "plain",
        "udp_datagrams_per_s": round(udp),
        "request_ms_p50": round(q[49], 3),
        "request_ms_p99": round(q[98], 3),
        "stream_MB_s": round(mbs, 1),
        "receiver_drops": drops,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--packets", type=int, default=20000)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--stream-mb", type=int, default=64)
    args = ap.parse_args()
    rows = [trio.run(run, True, args), trio.run(run, False, args)]
    print(f"{'mode':>7} {'udp/s':>8} {'req p50 ms':>11} {'req p99 ms':>11} {'stream MB/s':>12}")
    for r in rows:
        print(
            f"{r['mode']:>7} {r['udp_datagrams_per_s']:>8} {r['request_ms_p50']:>11}"
            f" {r['request_ms_p99']:>11} {r['stream_MB_s']:>12}  drops={r['receiver_drops']}"
        )
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "transport.json").write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
