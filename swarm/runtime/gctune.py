"""The agent's garbage collector settings (issue 23).

CPython's cycle collector scans every tracked object of the oldest generation each
time that generation has grown by a quarter. An agent's heap grows with its work: a
burst of 10,000 array elements adds records, handoff entries, placements and
explanations by the million objects, and the full scans that growth set off took
3.7 s of the home's 8.7 s placing them (the longest a single 0.5 s pause of the
whole event loop: gossip and the API wait too). Those scans found almost nothing:
the agent's state is trees of records, not cycles (0 objects collected in all but
the last of them).

So the agent, once started, moves what start-up made (modules, configuration) out of
the collector's sight for good (`gc.freeze()`: it is still freed by reference
counting when dropped) and runs the young generations less often and the oldest far
less often. Young cycles (trio's frames, exceptions with their tracebacks) are still
collected by the frequent young collections; the quarter-growth rule still guards
the oldest one. Measured (`bench/placement.py --mode array`, the home's collector
timed by a callback): 0.4-0.6 s of collection while placing 10,000 elements instead
of 3.7 s, and the burst placed in 4.75-4.9 s instead of 7.7 s (docs/benchmarks.md).
The client and the tests keep Python's defaults.
"""

from __future__ import annotations

import gc

# (young, middle, old): a collection of the young generation every THRESHOLDS[0] net
# allocations of tracked objects (Python: 700), of the middle one every [1] young
# collections (10), of the oldest every [2] middle ones (10), when it grew by 1/4
THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """Freeze what exists now and set the agent's thresholds (call once, after
    start-up, before the event loop runs)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
