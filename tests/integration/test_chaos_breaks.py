"""A chaos suite that cannot fail proves nothing: deliberately broken agents
(swarm/testbreak.py, SWARM_TEST_MODE=1 SWARM_TEST_BREAK=...) must make the canary
scenario fail and name the broken invariant; the same scenario on the real build must
pass (so that a failure is the break's doing, not the canary's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaos import invariants as inv

REPO = Path(__file__).resolve().parents[2]


def canary(tmp: Path, brk: str | None, suite: str = "canary") -> tuple[int, dict[str, Any], str]:
    env = dict(os.environ)
    env.pop("SWARM_TEST_BREAK", None)
    env.pop("SWARM_TEST_MODE", None)
    if brk is not None:
        env.update(SWARM_TEST_MODE="1", SWARM_TEST_BREAK=brk)
    p = subprocess.run(
        [sys.executable, "-m", "chaos.run", "--suite", suite, "--out", str(tmp / "r")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (sc,) = json.loads((tmp / "r" / "report.json").read_text())["scenarios"]
    return p.returncode, sc, p.stdout[-4000:] + p.stderr[-4000:]


@pytest.mark.slow
def test_the_canary_passes_on_the_real_build(tmp_path: Path) -> None:
    rc, sc, out = canary(tmp_path, None)
    assert rc == 0 and sc["passed"], out
    assert sc["acked"] >= 30 and sc["lost"] == 0


@pytest.mark.slow
def test_the_labelled_canary_passes_on_the_real_build(tmp_path: Path) -> None:
    rc, sc, out = canary(tmp_path, None, "canary-labels")
    assert rc == 0 and sc["passed"], out
    assert sc["acked"] >= 20 and sc["lost"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("brk", "invariant", "suite"),
    [
        ("drop-acked", inv.ACKED, "canary"),
        ("ignore-drain", inv.DRAIN, "canary"),
        ("oversubscribe", inv.RESERVE, "canary"),
        ("ignore-constraints", inv.CONSTRAINT, "canary-labels"),
    ],
)
def test_a_broken_build_fails_naming_the_invariant(
    tmp_path: Path, brk: str, invariant: str, suite: str
) -> None:
    rc, sc, out = canary(tmp_path, brk, suite)
    assert rc == 1 and not sc["passed"], out
    assert not sc["error"], out
    assert invariant in sc["violated"], (sc["violated"], out)
    assert any(v.startswith(invariant) for v in sc["violations"])
    if brk == "drop-acked":
        assert sc["lost"] > 0
