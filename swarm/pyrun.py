"""The remote half of `swarm.Executor` (issue 23): run one pickled call, print its outcome.

A task submitted by the Executor runs `python -m swarm.pyrun`. The call comes in the
environment (`PYFLEET_CALL`: base64 of a cloudpickle of `(fn, args, kwargs)`, or of
`("map", fn, chunks)` for an array element, which takes the chunk of its
`SWARM_ARRAY_INDEX`). Its outcome goes to stdout as the last line, `RESULT_MARK`
followed by base64 of a pickle of `("ok", value)` or `("err", exception, traceback)`;
the Executor reads it back through the agent (`swarm logs`). The exit status is 0 for
a result, 1 for an exception, 2 when the call could not even be read (a module the
remote Python lacks is reported as that exception, with its traceback).

A future passed as an argument arrives as a `FutureRef`: the task was submitted with
`--after ok:` its task, so that task has succeeded by now, and its result is read
back here the same way, through the agent that runs this task ($SWARM_SOCKET).

Nothing here is run by the agent itself: it is the user's own command, as the user.
"""

from __future__ import annotations

import base64
import os
import pickle
import sys
import traceback
from typing import Any

RESULT_MARK = "SWARM-PY-RESULT "
CALL_ENV = "PYFLEET_CALL"


class FutureRef:
    """An argument that is the result of another Executor task (issue 23)."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id

    def __repr__(self) -> str:
        return f"FutureRef({self.task_id!r})"


def decode_outcome(output: bytes) -> tuple[Any, ...] | None:
    """The outcome a task printed (its last result line), or None when it printed none."""
    mark = RESULT_MARK.encode()
    for line in reversed(output.splitlines()):
        if line.startswith(mark):
            return tuple(pickle.loads(base64.b64decode(line[len(mark) :])))
    return None


def result_of(task_id: str) -> Any:
    """A parent task's result (its exception raised here, with its own notes)."""
    from .client import Client

    with Client() as c:
        out = b"".join(c.logs(task_id))
    outcome = decode_outcome(out)
    if outcome is None:
        raise RuntimeError(f"task {task_id} printed no result")
    if outcome[0] == "ok":
        return outcome[1]
    exc = outcome[1]
    if isinstance(exc, BaseException):
        raise exc
    raise RuntimeError(f"task {task_id} failed: {outcome[2]}")


def _resolve(value: Any) -> Any:
    return result_of(value.task_id) if isinstance(value, FutureRef) else value


def encode(obj: Any) -> str:
    import cloudpickle

    return base64.b64encode(cloudpickle.dumps(obj)).decode("ascii")


def _emit(outcome: tuple[Any, ...]) -> None:
    try:
        line = encode(outcome)
    except Exception as e:  # the value or the exception does not pickle
        line = encode(("err", None, f"the outcome could not be pickled: {e!r}"))
    sys.stdout.flush()
    sys.stdout.write("\n" + RESULT_MARK + line + "\n")
    sys.stdout.flush()


def main() -> int:
    raw = os.environ.get(CALL_ENV, "")
    try:
        call = pickle.loads(base64.b64decode(raw))
    except Exception as e:
        _emit(("err", e, traceback.format_exc()))
        return 2
    try:
        if isinstance(call, tuple) and len(call) == 3 and call[0] == "map":
            _, fn, chunks = call
            chunk = chunks[int(os.environ.get("SWARM_ARRAY_INDEX", "0"))]
            value: Any = [fn(*args) for args in chunk]
        else:
            fn, args, kwargs = call
            args = tuple(_resolve(a) for a in args)
            kwargs = {k: _resolve(v) for k, v in kwargs.items()}
            value = fn(*args, **kwargs)
    except BaseException as e:  # the user's exception, whatever it is, goes back
        _emit(("err", e, traceback.format_exc()))
        return 1
    _emit(("ok", value))
    return 0


if __name__ == "__main__":
    # run as swarm.pyrun, not __main__: a FutureRef in the call was pickled as
    # swarm.pyrun.FutureRef, and isinstance must see that class
    from swarm import pyrun

    sys.exit(pyrun.main())
