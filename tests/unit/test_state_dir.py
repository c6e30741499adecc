"""The agent's state dir and task-log dir modes (issue #17, item 9): made private,
and tightened when an older agent left them looser
(swarm.runtime.startup.private_state_dir)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from swarm.runtime import startup


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize(("euid", "mode"), [(0, 0o711), (1000, 0o700)])
def test_made_private_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, euid: int, mode: int
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    state = tmp_path / "a" / "state"
    old = os.umask(0o022)
    try:
        assert startup.private_state_dir(state, state / "logs") == []
    finally:
        os.umask(old)
    assert _mode(state) == mode and _mode(state / "logs") == 0o700


def test_an_older_agents_loose_dirs_are_tightened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    state, logs = tmp_path / "state", tmp_path / "state" / "logs"
    logs.mkdir(parents=True)
    state.chmod(0o755)
    logs.chmod(0o755)
    changed = startup.private_state_dir(state, logs)
    assert changed == [("0755", str(state), 0o711), ("0755", str(logs), 0o700)]
    assert _mode(state) == 0o711 and _mode(logs) == 0o700
    state.chmod(0o700)  # stricter than needed: left alone
    assert startup.private_state_dir(state, logs) == []
    assert _mode(state) == 0o700
