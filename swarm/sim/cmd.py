"""`swarm sim NAME`: run one experiment, or all of them and the docs page."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from .experiments import EXPERIMENTS, INTRO, QUICK_NODES, QUICK_TASKS, Params, run
from .report import Outcome, doc_page

NAMES = (*EXPERIMENTS, "all")


def run_command(
    name: str,
    *,
    nodes: int | None = None,
    seed: int = 1,
    tasks: int | None = None,
    out: str | Path = "sim-out",
    doc: str | Path | None = None,
    quick: bool = False,
) -> int:
    """Exit status: 0 when every check of the experiments held, 1 when one did not,
    2 for a usage error. `quick`: the reproducibility test's sizes (QUICK_NODES,
    QUICK_TASKS); only the CSVs are kept in `out`."""
    if name not in NAMES:
        print(f"swarm sim: unknown experiment {name!r}; one of {', '.join(NAMES)}", file=sys.stderr)
        return 2
    if (nodes is not None and nodes < 1) or (tasks is not None and tasks < 1):
        print("swarm sim: --nodes and --tasks must be >= 1", file=sys.stderr)
        return 2
    if doc is not None and name != "all":
        print("swarm sim: --doc only goes with 'all'", file=sys.stderr)
        return 2
    if quick and (nodes is not None or tasks is not None or doc is not None):
        print("swarm sim: --quick sets its own sizes and writes no page", file=sys.stderr)
        return 2
    if quick:
        return _quick(name, seed, Path(out))
    outdir = Path(out)
    names = list(EXPERIMENTS) if name == "all" else [name]
    outcomes: list[Outcome] = []
    t0 = time.perf_counter()
    for n in names:
        print(f"swarm sim: {n} ...", file=sys.stderr, flush=True)
        o = run(n, Params(out=outdir, nodes=nodes, tasks=tasks, seed=seed))
        outcomes.append(o)
        for claim, ok in o.checks.items():
            print(f"  [{'ok' if ok else 'FAILED'}] {claim}", file=sys.stderr)
        print(f"  {o.seconds:.1f} s -> {outdir / (n + '.md')}", file=sys.stderr)
    if doc is not None:
        docpath = Path(doc)
        try:
            rel = outdir.resolve().relative_to(docpath.resolve().parent).as_posix()
        except ValueError:
            rel = outdir.resolve().as_posix()
        docpath.parent.mkdir(parents=True, exist_ok=True)
        page = doc_page(outcomes, rel, INTRO)
        extra = outdir / "sim_vs_agents.md"  # real agents: bench/sim_vs_agents.py --md
        if name == "all" and extra.exists():
            page += "\n" + extra.read_text(encoding="utf-8").replace("](", f"]({rel}/")
        docpath.write_text(page, encoding="utf-8")
        print(f"swarm sim: wrote {docpath}", file=sys.stderr)
    print(f"swarm sim: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0 if all(ok for o in outcomes for ok in o.checks.values()) else 1


def _quick(name: str, seed: int, out: Path) -> int:
    """Run at the reproducibility test's sizes in a scratch directory and keep only
    the CSVs (tests/unit/test_experiments_reproduce.py compares them byte for byte)."""
    names = list(EXPERIMENTS) if name == "all" else [name]
    out.mkdir(parents=True, exist_ok=True)
    for n in names:
        print(f"swarm sim: {n} (quick) ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            o = run(n, Params(out=Path(tmp), nodes=QUICK_NODES, tasks=QUICK_TASKS, seed=seed))
            for stem, _ in o.tables:
                shutil.copyfile(Path(tmp) / f"{stem}.csv", out / f"{stem}.csv")
        print(f"  {o.seconds:.1f} s -> {out}/", file=sys.stderr)
    return 0
