"""`swarm.Executor` and the joblib backend on real loopback agents (issue 23), in the
manner of CPython's own concurrent.futures tests: submit, map with timeout and
chunksize, cancel before start (and not once running), exceptions with the remote
traceback, a module the remote lacks, shutdown(wait, cancel_futures), the context
manager; joblib.Parallel(n_jobs=8, backend="swarm") returns what the local backend
does."""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
from pathlib import Path

import pytest

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.integration.test_cluster import all_see, wait_for

LOOP = ["--bind", "127.0.0.1"]


def _two(make_agent: AgentFactory, slots: int = 2) -> list[LocalAgent]:
    a = make_agent("xa", *LOOP, "--slots", str(slots))
    b = make_agent("xb", *LOOP, "--slots", str(slots), "--seeds", f"127.0.0.1:{a.port}")
    wait_for(lambda: all_see([a, b], {"xa", "xb"}), 30, "two agents to see each other")
    return [a, b]


def square(x: int) -> int:
    return x * x


def boom(x: int) -> int:
    raise ValueError(f"no {x}")


def nap(seconds: float) -> str:
    time.sleep(seconds)
    return os.environ.get("SWARM_NODE", "?")


def test_submit_map_exceptions_and_shutdown(make_agent: AgentFactory, short_tmp: Path) -> None:
    from swarm import Executor

    a, _b = _two(make_agent)
    with Executor(str(a.socket)) as ex:
        f = ex.submit(pow, 2, 10)
        assert f.result(timeout=60) == 1024
        g = ex.submit(square, x=7)
        assert g.result(timeout=60) == 49 and g.done() and not g.cancelled()
        # an exception comes back as itself, with the remote traceback in its notes
        e = ex.submit(boom, 3)
        with pytest.raises(ValueError, match="no 3") as info:
            e.result(timeout=60)
        assert any("remote traceback" in n and "boom" in n for n in info.value.__notes__)
        # map: one array, an element per chunk; in order
        assert list(ex.map(square, range(10), chunksize=4)) == [x * x for x in range(10)]
        assert list(ex.map(pow, [2, 3], [5, 2])) == [32, 9]
        assert list(ex.map(square, [])) == []
        # map's timeout: the first result is late
        it = ex.map(nap, [5.0], timeout=0.5)
        with pytest.raises(cf.TimeoutError):
            next(it)
        # callbacks and as_completed / wait
        seen: list[int] = []
        h = ex.submit(square, 3)
        h.add_done_callback(lambda fut: seen.append(fut.result()))
        done, _ = cf.wait([h], timeout=60)
        assert done == {h}
        wait_for(lambda: seen == [9], 10, "the callback")
        assert sorted(
            x.result() for x in cf.as_completed([ex.submit(square, i) for i in range(4)])
        ) == [0, 1, 4, 9]
        # a command
        c = ex.submit_command(["sh", "-c", "exit 0"])
        assert c.result(timeout=60)["state"] == "succeeded"
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(square, 1)


def add(x: int, y: int) -> int:
    return x + y


def test_futures_passed_as_arguments_become_dependencies(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    """A future of the Executor as an argument: the task waits for its parent's task
    (--after ok:) and reads the parent's result where it runs, on either node; a
    failed parent fails the child with a dependency failure."""
    from swarm import Executor
    from swarm.client import Client

    a, _b = _two(make_agent)
    with Executor(str(a.socket)) as ex:
        slow = ex.submit(nap, 2.0)
        x = ex.submit(square, 5)
        total = ex.submit(add, x, y=ex.submit(square, 6))  # 25 + 36
        both = ex.submit(lambda n, m: f"{n}+{m}", slow, total)
        assert total.result(timeout=60) == 61
        assert both.result(timeout=60).endswith("+61")
        with Client(str(a.socket)) as c:  # it waited for its parents
            tasks = {t["spec"]["name"]: t for t in c.list(all=True)}
        assert tasks["add"]["spec"]["after"] and tasks["<lambda>"]["spec"]["after"]
        # a parent already done goes in as its value: no dependency
        assert ex.submit(add, x, 1).result(timeout=60) == 26
        # a failed parent fails the child
        child = ex.submit(add, ex.submit(boom, 1), 1)
        with pytest.raises(Exception, match=r"dependency|parent|boom|failed"):
            child.result(timeout=60)


def test_cancel_before_start_not_once_running_and_shutdown_cancel_futures(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    from swarm import Executor

    a, _b = _two(make_agent, slots=1)
    ex = Executor(str(a.socket))
    busy = [ex.submit(nap, 4.0) for _ in range(2)]  # both slots taken
    wait_for(lambda: all(f.running() for f in busy), 30, "two calls to run")
    assert not busy[0].cancel()  # running: cannot be cancelled (concurrent.futures)
    waiting = ex.submit(nap, 0.1)
    time.sleep(0.5)
    assert not waiting.running() and waiting.cancel() and waiting.cancelled()
    more = [ex.submit(nap, 0.1) for _ in range(3)]
    ex.shutdown(wait=True, cancel_futures=True)
    assert all(f.done() for f in busy + more)
    assert {f.result() for f in busy} <= {"xa", "xb"}
    assert any(f.cancelled() for f in more)


def test_a_module_the_remote_lacks_is_its_exception_and_big_calls_are_refused(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    import types

    from swarm import Executor

    a, _b = _two(make_agent)
    mod = types.ModuleType("not_on_the_fleet")
    exec("def f():\n    return 1\n", mod.__dict__)
    mod.f.__module__ = "not_on_the_fleet"  # pickled by reference: the remote must import it
    import sys

    sys.modules["not_on_the_fleet"] = mod
    try:
        with Executor(str(a.socket)) as ex:
            f = ex.submit(mod.f)
            with pytest.raises(ModuleNotFoundError, match="not_on_the_fleet"):
                f.result(timeout=60)
            with pytest.raises(ValueError, match="more than 262,144"):
                ex.submit(len, b"x" * 400_000)
    finally:
        del sys.modules["not_on_the_fleet"]


def test_joblib_parallel_on_the_fleet_matches_the_local_backend(
    make_agent: AgentFactory, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import joblib

    import swarm.joblib_backend  # noqa: F401  (registers "swarm")

    a, _b = _two(make_agent, slots=4)
    monkeypatch.setenv("SWARM_SOCKET", str(a.socket))
    local = joblib.Parallel(n_jobs=2, backend="threading")(
        joblib.delayed(square)(i) for i in range(40)
    )
    with joblib.parallel_config(backend="swarm"):
        remote = joblib.Parallel(n_jobs=8)(joblib.delayed(square)(i) for i in range(40))
    assert remote == local
