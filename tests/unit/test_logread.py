"""`read_log`: a log that went with its record says so (`missing`), an empty one does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from swarm import model as m
from swarm.runtime.logread import read_log


class _Table:
    node = m.NodeId("n1")


def _task(state: m.TaskState, started: bool, node: str = "n1") -> m.Task:
    spec = m.TaskSpec(id=m.TaskId("t1"), argv=("true",))
    return m.Task(spec=spec, state=state, started_at=1.0 if started else None, node=node)


def _read(path: Path, task: m.Task | None, follow: bool = False) -> list[dict[str, Any]]:
    async def current() -> m.Task | None:
        return task

    async def main() -> list[dict[str, Any]]:
        return [p async for p in read_log(path, 0, follow, current, _Table())]  # type: ignore[arg-type]

    return trio.run(main)


def test_a_log_that_is_there_streams_and_is_not_missing(tmp_path: Path) -> None:
    log = tmp_path / "t1.out"
    log.write_bytes(b"hello\n")
    parts = _read(log, _task(m.TaskState.SUCCEEDED, True))
    assert parts[0]["data"] == b"hello\n" and not parts[-1].get("missing")
    log.write_bytes(b"")  # ran and wrote nothing: empty, not missing
    assert _read(log, _task(m.TaskState.SUCCEEDED, True)) == [
        {"more": False, "offset": 0, "eof": True}
    ]


def test_no_file_for_a_task_that_ran_here_and_ended_or_is_forgotten_is_missing(
    tmp_path: Path,
) -> None:
    gone = tmp_path / "t1.out"
    for task in (None, _task(m.TaskState.FAILED, True)):
        for follow in (False, True):
            assert _read(gone, task, follow)[-1] == {
                "more": False,
                "offset": 0,
                "eof": True,
                "missing": True,
            }


def test_no_file_for_a_task_not_started_or_gone_elsewhere_is_not_missing(tmp_path: Path) -> None:
    gone = tmp_path / "t1.out"
    for task in (
        _task(m.TaskState.QUEUED, False),  # not started yet
        _task(m.TaskState.CANCELLED, False),  # cancelled before it started
        _task(m.TaskState.SUCCEEDED, True, node="n2"),  # ran at another node
    ):
        assert not _read(gone, task)[-1].get("missing"), task
