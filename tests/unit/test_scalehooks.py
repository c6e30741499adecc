"""run_hook: one attempt of an operator's scale hook (issue 25)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from swarm.runtime import scalehooks
from swarm.runtime.scalehooks import MAX_OUTPUT, HookResult, hook_env, run_hook


def _running(pid: int) -> bool:
    """Is `pid` a live process? A zombie is not (its new parent may be an init that
    never reaps, as in some containers)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


async def _gone(pids: list[int], within: float = 1.0) -> bool:
    with trio.move_on_after(within):
        while any(_running(p) for p in pids):
            await trio.sleep(0.02)
        return True
    return False


async def _pid(path: Path) -> int:
    """The pid the hook writes to `path`, once it has written it."""
    with trio.fail_after(5):
        while not (path.exists() and path.read_text().endswith("\n")):
            await trio.sleep(0.01)
    return int(path.read_text())


def _reaped(pid: int) -> bool:
    """Has our child `pid` been waited for (no zombie left behind)?"""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    assert done == 0, f"{pid} had exited but nobody had reaped it"
    return False


# The shell writes its pid (the hook's process group) to $SH, its background child
# its own pid to $GC, then both sleep.
GROUP = """echo $$ > "$SH"; sh -c 'echo $$ > "$GC"; exec sleep 100' & sleep 100"""


@pytest.fixture
def group(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The env for GROUP; at the end, whatever is left of it is killed (when a test
    failed with its hook alive)."""
    env = {"SH": str(tmp_path / "sh.pid"), "GC": str(tmp_path / "gc.pid")}
    yield env
    for name in ("SH", "GC"):
        try:
            pid = int(Path(env[name]).read_text())
        except (OSError, ValueError):
            continue
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


async def test_ok() -> None:
    res = await run_hook("echo hello; echo oops >&2", {}, 5)
    assert res.ok and res.rc == 0 and res.error == ""
    assert res.output == "hello\noops\n"
    assert res.duration >= 0


async def test_exit_status() -> None:
    res = await run_hook("echo failing; exit 3", {}, 5)
    assert res == HookResult(False, 3, "failing\n", res.duration, "exit status 3")


async def test_killed_by_signal() -> None:
    res = await run_hook("kill -USR1 $$", {}, 5)
    assert not res.ok and res.rc == -signal.SIGUSR1 and res.error == "killed by SIGUSR1"


async def test_duration_from_injected_clock() -> None:
    ticks = iter([100.0, 107.5])
    res = await run_hook("true", {}, 5, now=lambda: next(ticks))
    assert res.ok and res.duration == 7.5


async def test_output_tail_bounded() -> None:
    # 1 MB of lines, then the one that matters
    cmd = "yes 0123456789abcdef | head -n 60000; echo the-last-line"
    res = await run_hook(cmd, {}, 10)
    assert res.ok
    assert res.output.startswith("…")
    assert len(res.output.encode()) <= MAX_OUTPUT + len("…".encode())
    assert res.output.endswith("\nthe-last-line\n")


async def test_output_cut_inside_a_character() -> None:
    # "é" is 2 bytes: a cut in the middle of one is not shown as a broken character
    res = await run_hook(
        "head -c 10000 /dev/zero | tr '\\0' y; "
        f"awk 'BEGIN {{ for (i = 0; i < {MAX_OUTPUT // 2}; i++) printf \"é\" }}'; printf x",
        {},
        5,
    )
    assert res.ok and res.output == "…" + "é" * (MAX_OUTPUT // 2 - 1) + "x"
    res = await run_hook("printf 'a\\377b'", {}, 5)
    assert res.output == "a\ufffdb"


async def test_env_values_verbatim_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker}); `touch {marker}`; rm -rf /nonexistent-x | ' \" \\ *\n;"
    out = tmp_path / "seen"
    res = await run_hook(
        'printf %s "$SWARM_NODES" > "$OUT"; echo $POOL',
        {"SWARM_NODES": evil, "OUT": str(out), "POOL": "gpu*"},
        5,
        cwd=str(tmp_path),
    )
    assert res.ok, res
    assert out.read_text() == evil
    assert res.output == "gpu*\n"  # no file matched the glob in the empty cwd
    assert not marker.exists()


async def test_agent_env_not_leaked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_SECRET_TEST", "s3cret")
    monkeypatch.setenv("HOME", "/home/agent")
    res = await run_hook("env", {"POOL": "p1"}, 5)
    assert res.ok
    seen = dict(line.split("=", 1) for line in res.output.splitlines() if "=" in line)
    assert "SWARM_SECRET_TEST" not in seen and "s3cret" not in res.output
    assert seen["POOL"] == "p1"
    assert seen["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert seen["LANG"] == "C.UTF-8" and seen["HOME"] == "/home/agent"
    assert set(seen) <= {"POOL", "PATH", "LANG", "HOME", "PWD", "OLDPWD", "SHLVL", "_"}


async def test_stdin_is_devnull() -> None:
    res = await run_hook("cat; echo end", {}, 5)
    assert res.ok and res.output == "end\n"


async def test_timeout_kills_the_group(group: dict[str, str]) -> None:
    with trio.fail_after(2.5):
        res = await run_hook(GROUP, group, 0.5)
    assert not res.ok and res.rc is None and res.error == "timed out after 0.5 s"
    assert res.duration >= 0.5
    shell, grandchild = int(Path(group["SH"]).read_text()), await _pid(Path(group["GC"]))
    assert _reaped(shell)  # waited for before run_hook returned
    assert await _gone([grandchild])


async def test_timeout_sigkill_when_term_ignored(
    group: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scalehooks, "KILL_GRACE", 0.3)
    # an ignored SIGTERM is inherited by the children, through exec
    with trio.fail_after(2):
        res = await run_hook("trap '' TERM; " + GROUP, group, 0.5)
    assert res.error == "timed out after 0.5 s" and res.duration >= 0.8
    shell, grandchild = int(Path(group["SH"]).read_text()), await _pid(Path(group["GC"]))
    assert _reaped(shell)  # waited for before run_hook returned
    assert await _gone([grandchild])


@pytest.mark.parametrize("trap", ["", "trap '' TERM; "])
async def test_cancellation_kills_the_group(
    group: dict[str, str], trap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with SIGTERM ignored, the SIGKILL after the grace shows the cleanup is shielded
    monkeypatch.setattr(scalehooks, "KILL_GRACE", 0.3)
    results: list[HookResult] = []

    async def attempt() -> None:
        results.append(await run_hook(trap + GROUP, group, 60))

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt)
            shell, grandchild = await _pid(Path(group["SH"])), await _pid(Path(group["GC"]))
            assert _running(shell) and _running(grandchild)
            nursery.cancel_scope.cancel()
    assert results == []  # Cancelled went on, no result
    assert _reaped(shell)  # waited for before Cancelled went on
    assert await _gone([grandchild])


async def test_background_process_does_not_hold_the_result(group: dict[str, str]) -> None:
    # a background process keeps the output pipe open after the shell has exited
    res = await run_hook(
        """echo $$ > "$SH"; sh -c 'echo $$ > "$GC"; exec sleep 30' & echo done""", group, 5
    )
    assert res.ok and res.output == "done\n"
    assert res.duration < 3
    assert _running(await _pid(Path(group["GC"])))  # left alone, killed by the fixture


async def test_bad_env() -> None:
    for env in (
        {"nodes": "x"},
        {"1X": "x"},
        {"A-B": "x"},
        {"": "x"},
        {"PATH": "/tmp"},
        {"LD_PRELOAD": "/tmp/x.so"},
        {"BASH_ENV": "/tmp/x"},
        {"NODES": "a\0b"},
    ):
        key = next(iter(env)) or "''"
        with pytest.raises(ValueError, match=key):
            await run_hook("true", env, 5)
    assert hook_env({"SWARM_POOL": "p", "_X1": ""})["_X1"] == ""


async def test_bad_timeout() -> None:
    for t in (0, -1, float("nan")):
        with pytest.raises(ValueError):
            await run_hook("true", {}, t)


async def test_missing_cwd(tmp_path: Path) -> None:
    res = await run_hook("true", {}, 5, cwd=str(tmp_path / "gone"))
    assert not res.ok and res.rc is None and res.output == ""
    assert res.error.startswith("could not start: [Errno 2]")
    assert "gone" in res.error
