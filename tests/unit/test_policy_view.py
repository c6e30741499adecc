"""LoadView bookkeeping and uniform bounded sampling."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.model import LoadReport
from swarm.policy.view import LoadView, PeerEntry, PeerInfo, charged, sample_peers


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=120))
def test_load_view_matches_a_dict(ops: list[tuple[bool, int]]) -> None:
    v = LoadView()
    ref: dict[str, PeerEntry] = {}
    for put, i in ops:
        name = f"n{i}"
        if put:
            e = PeerEntry(LoadReport(name, i), float(i))
            v.put(name, e)
            ref[name] = e
        else:
            v.remove(name)
            ref.pop(name, None)
        assert len(v) == len(ref)
        assert dict(v.items()) == ref
        assert sorted(v.key_at(k) for k in range(len(v))) == sorted(ref)


def _view(n: int) -> LoadView:
    return LoadView({f"n{i}": PeerEntry(LoadReport(f"n{i}", 1), 0.0) for i in range(n)})


def _even(node: str, entry: PeerInfo) -> str | None:
    return None if int(node[1:]) % 2 == 0 else "odd"


def test_rejection_sampling_is_uniform_over_eligible() -> None:
    v = _view(200)
    rng = random.Random(5)
    counts: Counter[str] = Counter()
    for _ in range(20_000):
        s = sample_peers(v, 2, rng, _even, scan_below=0)
        assert len(s.chosen) == 2 and len(set(s.chosen)) == 2
        assert all(int(x[1:]) % 2 == 0 for x in s.chosen)
        counts.update(s.chosen)
    assert len(counts) == 100
    mean = 40_000 / 100
    assert max(counts.values()) < 1.25 * mean and min(counts.values()) > 0.75 * mean


def test_small_views_are_scanned_and_find_rare_peers() -> None:
    v = _view(50)

    def only_n7(node: str, entry: PeerInfo) -> str | None:
        return None if node == "n7" else "no"

    s = sample_peers(v, 2, random.Random(0), only_n7, skip="n3")
    assert s.chosen == ("n7",) and s.scanned
    assert len(s.rejected) == 48  # n3 skipped
    assert s.examined == 49


def test_large_views_stop_after_bounded_attempts() -> None:
    v = _view(10_000)
    calls = 0

    def none(node: str, entry: PeerInfo) -> str | None:
        nonlocal calls
        calls += 1
        return "no"

    s = sample_peers(v, 2, random.Random(0), none, max_attempts=40)
    assert s.chosen == () and not s.scanned
    assert calls <= 40 and s.examined == calls


def test_sampling_is_deterministic_given_the_rng() -> None:
    v = _view(1000)
    a = sample_peers(v, 3, random.Random(42), _even)
    b = sample_peers(v, 3, random.Random(42), _even)
    assert a == b


def test_plain_mapping_views_work_too() -> None:
    d = dict(_view(300).items())
    s = sample_peers(d, 2, random.Random(1), _even)
    assert len(s.chosen) == 2


def test_a_burst_of_placements_spreads_over_equal_peers_when_offers_are_charged() -> None:
    """Issue 23: a home placing many tasks at once on one stale view piles them onto
    whichever peer looked least loaded; charging each offer to its target's entry
    (until the peer's next report) spreads them like a fresh view would."""
    from swarm.model import TaskSpec
    from swarm.policy import placement as pl

    local = LoadReport("home", 1024, queued=1000, weight_sum=1000.0, slots=8)
    peers = {f"p{i}": LoadReport(f"p{i}", 1, weight_sum=float(i), slots=8) for i in range(4)}
    rng = random.Random(1)
    for charge in (False, True):
        v = LoadView({n: PeerEntry(r, 0.0) for n, r in peers.items()})
        got: Counter[str] = Counter()
        for k in range(400):
            p = pl.place(TaskSpec(id=f"t{k}", argv=("true",)), local, v, rng, 0.0, d=4)
            assert p.target is not None
            got[p.target] += 1
            if charge:
                v.put(p.target, charged(v[p.target], 1.0))
        if charge:  # filled by projected load: 400 + 0+1+2+3 spread evenly
            assert all(abs(got[f"p{i}"] + i - 101.5) <= 1 for i in range(4)), got
        else:
            assert got == {"p0": 400}  # all on the peer that looked least loaded
