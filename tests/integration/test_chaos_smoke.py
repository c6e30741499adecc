"""`make chaos-smoke` as part of `make test`: real agents (in network namespaces when
root, else on loopback) under kill -9 and an isolated node, with drains; every
invariant must hold, checked from the agents' own journals, logs and CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos import invariants as inv

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_chaos_smoke_suite_passes(tmp_path: Path) -> None:
    out = tmp_path / "report"
    p = subprocess.run(
        [sys.executable, "-m", "chaos.run", "--suite", "smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads((out / "report.json").read_text())
    (sc,) = report["scenarios"]
    detail = "\n".join([*sc["violations"], sc["error"], p.stdout[-3000:], p.stderr[-3000:]])
    assert p.returncode == 0 and report["passed"], detail
    # the run did something worth checking
    assert sc["acked"] >= 40, detail
    assert sc["completed"] == sc["acked"] and sc["lost"] == 0
    assert sc["faults"], "the nemesis injected nothing"
    assert sc["drains"] >= 2, "no drain reached a journal"
    assert sc["final_converge_s"] is not None
    md = (out / "report.md").read_text()
    assert "smoke" in md and "all hold" in md
    assert set(inv.ALL) <= set(md.split("`"))
