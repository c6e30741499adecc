"""The supervisors' status directories are reused once their task's end is on disk."""

from __future__ import annotations

from pathlib import Path

from swarm import model as m
from swarm.runtime import shim as shimmod
from swarm.runtime.statusdirs import StatusDirs


def test_a_directory_given_back_is_emptied_and_taken_again(tmp_path: Path) -> None:
    pool = StatusDirs(tmp_path)
    d, ready = pool.take()
    assert not ready and d.parent == tmp_path and not d.exists()
    d.mkdir()
    (d / shimmod.EXIT_FILE).write_text("exit 0\n")
    (d / shimmod.LEASE_FILE).write_text("1\n")
    assert pool.give_back(d, leased=True)  # an --at-most-once task's: its lease goes too
    assert list(d.iterdir()) == []
    assert pool.take() == (d, True) and pool.reused == 1
    (d / shimmod.EXIT_FILE).write_text("exit 0\n")
    assert pool.give_back(d) and list(d.iterdir()) == []
    assert pool.take() == (d, True)
    # the pool is empty again: a new, different name
    e, ready = pool.take()
    assert not ready and e != d


def test_names_are_never_task_ids_nor_another_runs(tmp_path: Path) -> None:
    a, b = StatusDirs(tmp_path), StatusDirs(tmp_path)
    names = {a.take()[0].name for _ in range(50)} | {b.take()[0].name for _ in range(50)}
    assert len(names) == 100
    assert not any(m.valid_task_id(n) for n in names)


def test_what_is_not_ours_or_never_made_stays_out_of_the_pool(tmp_path: Path) -> None:
    pool = StatusDirs(tmp_path)
    legacy = tmp_path / "t0123456789abcdef"  # named after its task (older agents)
    legacy.mkdir()
    (legacy / shimmod.EXIT_FILE).write_text("x")
    assert not pool.give_back(legacy) and (legacy / shimmod.EXIT_FILE).exists()
    assert not pool.give_back(tmp_path / "elsewhere" / "_x")
    never_made, _ = pool.take()  # a start that failed before its directory was made
    assert not pool.give_back(never_made) and pool.free == []


def test_sweep_removes_the_pool_directories_no_row_names(tmp_path: Path) -> None:
    pool = StatusDirs(tmp_path)
    kept, stray = tmp_path / "_old-1", tmp_path / "_old-2"
    legacy = tmp_path / "t0123456789abcdef"
    for d in (kept, stray, legacy):
        d.mkdir()
        (d / shimmod.EXIT_FILE).write_text("x")
    assert pool.sweep([kept]) == 1
    assert kept.exists() and not stray.exists() and legacy.exists()
    assert StatusDirs(tmp_path / "missing").sweep([]) == 0
