"""One thread of its own for a blocking call the loop must not wait on: the journal's
fsync after each commit under load (journal.py; issue 23).

`trio.to_thread.run_sync` costs ~90-110 us of CPU per round trip on the development
VM (its thread cache, a cancel scope and context copy per call, and the wake-up
through trio's run_sync_soon): a third of a journal commit's ~300 us, paid by every
commit written while the loop is busy. Here the one thread waits on a queue, and its
answer wakes the loop through an eventfd the loop waits on: ~35-45 us (bench: two
interleaved pairs, 34/36 against 89/109 us of CPU per round trip). One call at a
time, as the journal's single writer makes them. The thread ends after IDLE_EXIT
seconds without a call (as trio's own workers do), so an idle journal holds none.

A call is never abandoned: the wait is shielded from cancellation, as the journal's
`abandon_on_cancel=False` was, since the thread goes on with the call anyway and a
caller must not believe a write synced that was not. Without os.eventfd (not Linux),
each call is `trio.to_thread.run_sync`.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")

IDLE_EXIT = 10.0  # seconds the thread waits for a call before it ends


class SyncThread:
    """A worker thread for one caller at a time, started at its first call."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._done: outcome.Outcome[Any] | None = None
        self._efd: int | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the thread's start and end against a new call
        self._busy = False
        self.calls = 0

    async def run(self, fn: Callable[[], T]) -> T:
        """`fn()` in the thread; its value, or its exception raised here."""
        if not hasattr(os, "eventfd"):
            return await trio.to_thread.run_sync(fn, abandon_on_cancel=False)
        if self._busy:
            raise RuntimeError(f"{self.name}: one call at a time")
        self._busy = True
        try:
            efd = self._put(fn)
            self.calls += 1
            with trio.CancelScope(shield=True):
                while True:
                    try:
                        os.eventfd_read(efd)
                        break
                    except BlockingIOError:
                        await trio.lowlevel.wait_readable(efd)
            done, self._done = self._done, None
        finally:
            self._busy = False
        assert done is not None
        return done.unwrap()  # type: ignore[no-any-return]

    def _put(self, fn: Callable[[], Any]) -> int:
        if self._efd is None:
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, args=(self._efd,), name=self.name, daemon=True
                )
                self._thread.start()
            self._jobs.put(fn)
        return self._efd

    def _work(self, efd: int) -> None:
        while True:
            try:
                fn = self._jobs.get(timeout=IDLE_EXIT)
            except queue.Empty:
                with self._lock:  # a call queued meanwhile keeps this thread
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            if fn is None:
                return
            self._done = outcome.capture(fn)
            os.eventfd_write(efd, 1)

    def close(self) -> None:
        """Stop the thread (after the call in progress, if any) and free the eventfd."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._jobs.put(None)
        if thread is not None:
            thread.join()
        if self._efd is not None:
            try:
                trio.lowlevel.notify_closing(self._efd)
            except RuntimeError:  # not in trio: nobody can be waiting on it
                pass
            os.close(self._efd)
            self._efd = None
