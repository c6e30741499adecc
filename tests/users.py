"""Run a function as another user: fork this test process, drop privileges in the
child, send the result back pickled (exec'ing the CLI as another user would need a
Python that user can read)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any


class ChildError(Exception):
    """What `fn` raised in the child, as "Type: message"."""


def as_user(uid: int, gid: int, groups: list[int], fn: Callable[[], Any]) -> Any:
    """Run `fn` in a child process with these credentials; return its result (or
    raise ChildError with what it raised)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            os.chdir("/")
            out: tuple[str, Any] = ("ok", fn())
        except BaseException as e:
            out = ("err", f"{type(e).__name__}: {e}")
        try:
            data = pickle.dumps(out)
        except Exception as e:
            data = pickle.dumps(("err", f"unpicklable result: {e!r}"))
        os.write(w, data)
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "err":
        raise ChildError(value)
    return value
