"""Task log files made ahead of need (swarm/runtime/logfiles.py): a start renames a
spare into place, never clobbers a file that exists, and spares survive a restart."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from swarm.runtime.logfiles import SPARE_DIR, LogFiles


async def _filled(lf: LogFiles) -> None:
    async with trio.open_nursery() as n:
        n.start_soon(lf.keep_filled)
        with trio.fail_after(5):
            while len(lf.spares) < lf.keep:
                await trio.sleep(0.01)
        n.cancel_scope.cancel()


async def test_start_renames_spares_into_place_and_refills(tmp_path: Path) -> None:
    lf = LogFiles(tmp_path, keep=4)
    await _filled(lf)
    assert lf.created == 4 and len(os.listdir(tmp_path / SPARE_DIR)) == 4
    out, err = lf.open_pair(tmp_path / "t1.out", tmp_path / "t1.err")
    os.write(out, b"hello\n")
    os.close(out)
    os.close(err)
    assert lf.used == 2
    assert (tmp_path / "t1.out").read_bytes() == b"hello\n"
    assert (tmp_path / "t1.err").read_bytes() == b""
    assert len(os.listdir(tmp_path / SPARE_DIR)) == 2  # two were taken
    os.close(lf.open(tmp_path / "t2.out"))
    await _filled(lf)  # half or less: the refiller tops it up
    assert lf.created == 7 and lf.used == 3


async def test_existing_file_is_appended_not_replaced(tmp_path: Path) -> None:
    lf = LogFiles(tmp_path, keep=4)
    await _filled(lf)
    (tmp_path / "t1.out").write_bytes(b"first attempt\n")
    fd = lf.open(tmp_path / "t1.out")
    os.write(fd, b"second attempt\n")
    os.close(fd)
    assert (tmp_path / "t1.out").read_bytes() == b"first attempt\nsecond attempt\n"
    assert lf.used == 0 and len(lf.spares) == 4


async def test_without_spares_files_are_created(tmp_path: Path) -> None:
    lf = LogFiles(tmp_path, keep=4)  # refiller never ran
    out, err = lf.open_pair(tmp_path / "t1.out", tmp_path / "t1.err")
    os.close(out)
    os.close(err)
    assert (tmp_path / "t1.out").exists() and (tmp_path / "t1.err").exists()
    assert lf.used == 0


async def test_outside_the_log_dir_no_spare_is_used(tmp_path: Path) -> None:
    lf = LogFiles(tmp_path / "logs", keep=2)
    await _filled(lf)
    os.close(lf.open(tmp_path / "elsewhere.out"))
    assert lf.used == 0 and len(lf.spares) == 2


async def test_restart_adopts_empty_spares_and_drops_anything_else(tmp_path: Path) -> None:
    lf = LogFiles(tmp_path, keep=4)
    await _filled(lf)
    spare = tmp_path / SPARE_DIR
    (spare / "junk").write_bytes(b"not empty")
    (spare / "adir").mkdir()
    again = LogFiles(tmp_path, keep=4)
    assert sorted(n for n, _ in again.spares) == sorted(n for n, _ in lf.spares)
    assert not (spare / "junk").exists()
    # spare names of the new run never collide with the adopted ones
    await _filled(again)
    names = [n for n, _ in again.spares]
    assert len(set(names)) == len(names) == 4
    # an adopted spare is as good as a new one
    fd = again.open(tmp_path / "t9.out")
    os.write(fd, b"x")
    os.close(fd)
    assert (tmp_path / "t9.out").read_bytes() == b"x" and again.used == 1
