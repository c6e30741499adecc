"""Every experiment reproduces (issue 24): at the quick sizes (`swarm sim NAME
--quick`), each experiment's CSVs come out byte for byte as committed in
docs/experiments/quick/. A change to a random stream, a policy or a simulator that
moves any figure fails here until `make experiments` regenerates the docs and the
quick CSVs together, so a committed figure always comes from the code at HEAD."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.sim.experiments import EXPERIMENTS, QUICK_NODES, QUICK_TASKS, Params, run

QUICK = Path(__file__).resolve().parents[2] / "docs" / "experiments" / "quick"
HOW = (
    "regenerate with `make experiments` (or `swarm sim NAME --quick --out docs/experiments/quick`)"
)


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_the_quick_run_reproduces_the_committed_csvs(name: str, tmp_path: Path) -> None:
    o = run(name, Params(out=tmp_path, nodes=QUICK_NODES, tasks=QUICK_TASKS, seed=1))
    assert o.tables, name
    for stem, _ in o.tables:
        committed = QUICK / f"{stem}.csv"
        assert committed.exists(), f"{committed} is missing: {HOW}"
        fresh = (tmp_path / f"{stem}.csv").read_bytes()
        assert fresh == committed.read_bytes(), f"{stem}.csv no longer reproduces at HEAD: {HOW}"


def test_no_committed_quick_csv_is_left_over() -> None:
    """Each committed quick CSV is one some experiment writes (none stale)."""
    stems = {p.stem for p in QUICK.glob("*.csv")}
    assert stems, f"no quick CSVs in {QUICK}: {HOW}"
    # the stems an experiment writes are its name or start with it (load_detail, ...),
    # but for staleness's second table, named after what it measures
    orphans = {s for s in stems if not any(s.startswith(n) for n in EXPERIMENTS)} - {"gossip_age"}
    assert not orphans, f"stale quick CSVs {sorted(orphans)}: {HOW}"
