"""`swarm.Executor`: a `concurrent.futures.Executor` whose calls run on the fleet (issue 23).

    from swarm import Executor
    with Executor() as ex:                       # the local agent's socket
        f = ex.submit(pow, 2, 10)                # a task: python -m swarm.pyrun
        print(f.result())                        # 1024
        print(list(ex.map(abs, range(-5, 5), chunksize=4)))  # one array of 3 elements

Each `submit(fn, *args, **kwargs)` becomes one task that runs `python -m swarm.pyrun`
with the call pickled by cloudpickle (as dask and loky do) in its environment; its
result, or its exception with the remote traceback (in the exception's notes), comes
back through the agent: the last line of the task's output, read with `swarm logs`.
`map(fn, *iterables, chunksize=K)` becomes one array (`--array 0-N`), an element per
chunk of K calls. A future of this Executor passed as an argument (`ex.submit(g,
ex.submit(f, x))`) becomes a dependency: the task waits (`--after ok:`) for the
future's task and reads its result where it runs; a future already resolved goes in
as its value, and a parent that fails fails the child with a dependency failure.
`submit_command(argv)` runs a command; its future's result is the task's final
record, and a command that did not succeed raises `CommandFailed`.

What the remote side needs: the same Python environment (the same `sys.executable`
path, the modules the pickled call refers to, cloudpickle). A module it lacks is that
module's `ModuleNotFoundError` on the future, not a hang. A pickled call larger than
`MAX_CALL` bytes is refused at once (pass large data through files).

Semantics are `concurrent.futures`': a future cancels only while pending (its task
not started: the task is cancelled too); `shutdown(wait, cancel_futures)`; the
context manager shuts down with wait. A future whose task was cancelled elsewhere,
lost, or ended without a result raises `RemoteTaskError` naming the task's end.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import os
import pickle
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .client import Client, ClientError, RequestFailed
from .pyrun import CALL_ENV, RESULT_MARK, FutureRef, encode

MAX_CALL = 256 * 1024  # bytes of one pickled call (it travels in the task's environment)
FINAL = frozenset({"succeeded", "failed", "cancelled", "lost"})


class RemoteTaskError(Exception):
    """The task ended without a result (cancelled, lost, killed, or not Python)."""


class CommandFailed(Exception):
    """A `submit_command` task did not succeed; `task` is its final record."""

    def __init__(self, task: dict[str, Any]) -> None:
        super().__init__(
            f"task {task['spec']['id']} {task['state']}: {task.get('reason') or ''}".rstrip(": ")
        )
        self.task = task


class _Watch:
    """One submitted task and the future(s) it answers."""

    def __init__(self, future: cf.Future[Any], kind: str) -> None:
        self.future = future
        self.kind = kind  # "call" | "command"
        self.cancel_sent = False


class Executor(cf.Executor):
    def __init__(
        self,
        socket: str | None = None,
        *,
        python: str | None = None,
        poll: float = 0.1,
        **options: Any,
    ) -> None:
        """`socket`: the agent's (default: the local one, as `swarm` finds it);
        `options`: what `Client.submit` takes for every task (priority, group, gpu,
        constraints, ...)."""
        self._socket = socket
        self._python = python or sys.executable
        self._poll = poll
        self._options = options
        self._lock = threading.Lock()
        self._watches: dict[str, _Watch] = {}
        # each call's task, for futures passed as arguments (kept while the future is)
        self._calls: weakref.WeakKeyDictionary[cf.Future[Any], str] = weakref.WeakKeyDictionary()
        self._client = Client(socket) if socket else Client()
        self._shut = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch_loop, name="swarm-executor", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ submitting

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        self._open()
        parents: list[str] = []
        args = tuple(self._arg(a, parents) for a in args)
        kwargs = {k: self._arg(v, parents) for k, v in kwargs.items()}
        payload = self._pack((fn, args, kwargs))
        name = getattr(fn, "__name__", "call")
        after = {"after": ["ok:" + ",".join(dict.fromkeys(parents))]} if parents else {}
        tid = self._submit_task(payload, name=str(name)[:200], **after)
        return self._register(tid, "call")

    def _arg(self, value: Any, parents: list[str]) -> Any:
        """An argument as it travels: a future of ours becomes its value when it has
        one, else a reference to its task (a dependency)."""
        if not isinstance(value, cf.Future):
            return value
        if value.done() and not value.cancelled() and value.exception() is None:
            return value.result()
        tid = self._calls.get(value)
        if tid is None:
            raise ValueError(
                "swarm.Executor: a future passed as an argument must come from this "
                "executor's submit or map"
            )
        parents.append(tid)
        return FutureRef(tid)

    def submit_command(self, argv: Iterable[str], **options: Any) -> cf.Future[Any]:
        self._open()
        with self._lock:
            tid = self._client.submit(list(argv), **{**self._options, **options})
        return self._register(tid, "command")

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
        """As `Executor.map`; the calls go as one array, an element per chunk."""
        self._open()
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1")
        calls = list(zip(*iterables, strict=False))
        if not calls:
            return iter(())
        chunks = [calls[i : i + chunksize] for i in range(0, len(calls), chunksize)]
        payload = self._pack(("map", fn, chunks))
        name = str(getattr(fn, "__name__", "map"))[:200]
        aid = self._submit_task(payload, name=name, array=f"0-{len(chunks) - 1}")
        base, sep, owner = aid.partition("~")
        futures = [self._register(f"{base}_{k}{sep}{owner}", "call") for k in range(len(chunks))]
        end = None if timeout is None else time.monotonic() + timeout

        def results() -> Iterator[Any]:
            try:
                for f in futures:
                    left = None if end is None else max(0.0, end - time.monotonic())
                    yield from f.result(left)
            finally:
                for f in futures:
                    f.cancel()

        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            watches = list(self._watches.values())
        if cancel_futures:
            for w in watches:
                if w.future.cancel():
                    _notify_cancelled(w.future)
        if wait:
            cf.wait([w.future for w in watches])
            self._stop.set()
            self._thread.join()
            self._client.close()

    # ------------------------------------------------------------------ helpers

    def _open(self) -> None:
        if self._shut:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def _pack(self, call: Any) -> str:
        try:
            text = encode(call)
        except Exception as e:
            raise TypeError(f"swarm.Executor: the call cannot be pickled: {e}") from e
        if len(text) * 3 // 4 > MAX_CALL:
            raise ValueError(
                f"swarm.Executor: the pickled call is {len(text) * 3 // 4:,} bytes, more "
                f"than {MAX_CALL:,}: pass large data through files"
            )
        return text

    def _submit_task(self, payload: str, **extra: Any) -> str:
        env = {CALL_ENV: payload}
        if "PATH" in os.environ:
            env["PATH"] = os.environ["PATH"]
        opts = {**self._options, **extra}
        with self._lock:
            return self._client.submit([self._python, "-m", "swarm.pyrun"], env=env, **opts)

    def _register(self, tid: str, kind: str) -> cf.Future[Any]:
        f: cf.Future[Any] = cf.Future()
        with self._lock:
            self._watches[tid] = _Watch(f, kind)
            if kind == "call":
                self._calls[f] = tid
        return f

    # ------------------------------------------------------------------ watching

    def _watch_loop(self) -> None:
        client = Client(self._socket) if self._socket else Client()
        try:
            while not self._stop.is_set():
                with self._lock:
                    items = list(self._watches.items())
                for tid, w in items:
                    try:
                        self._look(client, tid, w)
                    except (ClientError, OSError) as e:
                        if isinstance(e, RequestFailed) and e.code == "not_found":
                            continue  # an element not created yet
                        client.close()
                        client = Client(self._socket) if self._socket else Client()
                self._stop.wait(self._poll)
        finally:
            client.close()

    def _look(self, client: Client, tid: str, w: _Watch) -> None:
        f = w.future
        task = client.status(tid)
        state = task["state"]
        if f.cancelled():
            _notify_cancelled(f)
            if state not in FINAL and not w.cancel_sent:
                # in a thread of its own: a cancel can take its agent a while (a task
                # in flight to another node), and the other futures must not wait
                w.cancel_sent = True
                threading.Thread(target=self._cancel, args=(tid,), daemon=True).start()
            self._done(tid)
            return
        if state == "running" and not f.running() and not f.set_running_or_notify_cancel():
            return
        if state not in FINAL:
            return
        if not f.running() and not f.set_running_or_notify_cancel():
            self._done(tid)
            return
        if w.kind == "command":
            if state == "succeeded":
                f.set_result(task)
            else:
                f.set_exception(CommandFailed(task))
        else:
            self._deliver(client, tid, task, f)
        self._done(tid)

    def _deliver(self, client: Client, tid: str, task: dict[str, Any], f: cf.Future[Any]) -> None:
        out = _output(client, tid)
        if out is None:
            # its output (which carries the result) went with its runner's record:
            # an answer, not a retry that would never end
            why = f"task {tid} {task['state']}: its output is no longer kept where it ran"
            f.set_exception(RemoteTaskError(why))
            return
        line = next((ln for ln in reversed(out.splitlines()) if ln.startswith(RESULT_MARK)), None)
        if line is None:
            why = f"task {tid} {task['state']} without a result"
            if task.get("reason"):
                why += f": {task['reason']}"
            err = (_output(client, tid, stderr=True) or "")[-2000:]
            f.set_exception(RemoteTaskError(why + (f"\n{err}" if err else "")))
            return
        try:
            outcome = pickle.loads(base64.b64decode(line[len(RESULT_MARK) :]))
        except Exception as e:  # the result needs a module this Python lacks
            f.set_exception(e)
            return
        if outcome[0] == "ok":
            f.set_result(outcome[1])
            return
        exc, tb = outcome[1], outcome[2]
        if not isinstance(exc, BaseException):
            exc = RemoteTaskError(f"task {tid}: {tb}")
        else:
            exc.add_note(f"remote traceback (task {tid}):\n{tb}")
        f.set_exception(exc)

    def _cancel(self, tid: str) -> None:
        try:
            with Client(self._socket, timeout=60) if self._socket else Client(timeout=60) as c:
                c.cancel(tid)
        except (ClientError, OSError):
            pass  # it ended meanwhile, or the agent is gone: nothing left to stop

    def _done(self, tid: str) -> None:
        with self._lock:
            self._watches.pop(tid, None)


def _notify_cancelled(f: cf.Future[Any]) -> None:
    """A future cancelled while pending counts as done for `wait` and `as_completed`
    only once its executor says so (CANCELLED_AND_NOTIFIED), as a pool's worker does."""
    try:
        f.set_running_or_notify_cancel()
    except RuntimeError:
        pass  # notified already


def _output(client: Client, tid: str, stderr: bool = False) -> str | None:
    """A task's stdout (or stderr) as text; None when its runner no longer keeps it
    (other failures raise: the watch loop reconnects and looks again)."""
    try:
        return b"".join(client.logs(tid, stderr=stderr)).decode("utf-8", "replace")
    except RequestFailed as e:
        if e.code != "gone":
            raise
        return None
