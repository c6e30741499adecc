"""`python -m chaos.run --suite full|smoke` or `--scenario NAME --seed S`.

Runs scenarios one after another (never two at once: the machine has 2 cores),
writes report.md and report.json under --out, and exits 1 if any invariant broke.
Agents run in network namespaces when root (else on loopback, with the network
faults left out and said so in the report).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from . import netns, report
from .cluster import code_version, snapshot_code
from .scenario import Runner, ScenarioResult
from .schedule import Scenario
from .suites import SUITES, find

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "chaos" / "reports"


def log(msg: str) -> None:
    print(f"chaos {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def pick_mode(requested: str) -> tuple[str, str]:
    if requested == "loopback":
        return "loopback", "loopback requested"
    ok, why = netns.namespaces_usable()
    if ok:
        return "netns", ""
    if requested == "netns":
        raise SystemExit(f"chaos: network namespaces unavailable: {why}")
    return "loopback", why


def run_scenarios(
    scenarios: Sequence[Scenario],
    seed: int,
    *,
    mode: str = "auto",
    env: dict[str, str] | None = None,
    keep: bool = False,
) -> tuple[list[ScenarioResult], dict[str, object]]:
    """Run each scenario in turn; returns the results and the report's metadata."""
    chosen, why = pick_mode(mode)
    if why and chosen == "loopback":
        log(f"loopback mode: {why}; only process faults and the transport shim apply")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.monotonic()
    results: list[ScenarioResult] = []
    code = Path(tempfile.mkdtemp(prefix=f"{netns.PREFIX}-code-", dir="/tmp"))
    try:
        snapshot_code(code)
        version = code_version(REPO)
        log(f"agents run a snapshot of swarm/ ({version}) from {code}")
        for k, sc in enumerate(scenarios):
            results.append(_one(sc, seed + k, chosen, why, env, keep, code))
    finally:
        shutil.rmtree(code, ignore_errors=True)
    meta: dict[str, object] = {
        "suite": None,
        "mode": chosen,
        "mode_reason": why,
        "seed": seed,
        "started": started,
        "wall_s": round(time.monotonic() - t0, 1),
        "host_cpus": os.cpu_count(),
        "code": version,
    }
    return results, meta


def _one(
    sc: Scenario,
    sc_seed: int,
    chosen: str,
    why: str,
    env: dict[str, str] | None,
    keep: bool,
    code: Path,
) -> ScenarioResult:
    run_id = secrets.token_hex(3)
    root = Path(tempfile.mkdtemp(prefix=f"{netns.PREFIX}-{run_id}-", dir="/tmp"))
    log(f"{sc.name}: seed {sc_seed}, {sc.nodes} nodes, {chosen}, dir {root}")
    res = Runner(sc, sc_seed, root, run_id=run_id, mode=chosen, env=env, code=code, log=log).run()
    if chosen == "loopback" and why:
        res.notes.append(f"loopback mode: {why}")
    status = "passed" if res.passed else "FAILED " + ", ".join(res.violated or [res.error])
    log(
        f"{sc.name}: {status}: acked {res.acked}, completed {res.completed}, "
        f"lost {res.lost}, dup {res.dup_exec}, {res.wall_s:.0f}s"
    )
    if keep or not res.passed:
        log(f"{sc.name}: agent dirs kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return res


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__)
    ap.add_argument("--suite", choices=sorted(SUITES), default=None)
    ap.add_argument("--scenario", action="append", default=[], help="run only these (repeat)")
    ap.add_argument("--seed", type=int, default=None, help="default: a fixed seed per suite")
    ap.add_argument("--mode", choices=("auto", "netns", "loopback"), default="auto")
    ap.add_argument("--out", type=Path, default=None, help="report dir (chaos/reports/<time>)")
    ap.add_argument("--docs", type=Path, default=None, help="also update this markdown file")
    ap.add_argument("--keep", action="store_true", help="keep agent dirs of passing scenarios")
    args = ap.parse_args(argv)
    if args.scenario:
        try:
            scenarios = [find(n) for n in args.scenario]
        except KeyError as e:
            known = sorted({sc.name for suite in SUITES.values() for sc in suite})
            ap.error(f"--scenario: no scenario named {e.args[0]!r} (known: {', '.join(known)})")
    else:
        scenarios = list(SUITES[args.suite or "smoke"])
    seed = args.seed if args.seed is not None else 1000
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        results, meta = run_scenarios(scenarios, seed, mode=args.mode, keep=args.keep)
    except KeyboardInterrupt:
        log("interrupted; cluster torn down")
        return 130
    meta["suite"] = args.suite or ("custom" if args.scenario else "smoke")
    out = args.out or DEFAULT_OUT / time.strftime("%Y%m%d-%H%M%S")
    md, js = report.write(out, results, meta)
    if args.docs is not None:
        report.update_docs(args.docs, results, meta)
    print(report.markdown(results, meta))
    log(f"report: {md} and {js}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
