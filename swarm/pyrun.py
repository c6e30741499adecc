"""The remote half of `swarm.Executor` (issue 23): run one pickled call, print its outcome.

A task submitted by the Executor runs `python -m swarm.pyrun`. The call comes in the
environment (`PYFLEET_CALL`: base64 of a cloudpickle of `(fn, args, kwargs)`, or of
`("map", fn, chunks)` for an array element, which takes the chunk of its
`SWARM_ARRAY_INDEX`). Its outcome goes to stdout as the last line, `RESULT_MARK`
followed by base64 of a pickle of `("ok", value)` or `("err", exception, traceback)`;
the Executor reads it back through the agent (`swarm logs`). The exit status is 0 for
a result, 1 for an exception, 2 when the call could not even be read (a module the
remote Python lacks is reported as that exception, with its traceback).

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
            value = fn(*args, **kwargs)
    except BaseException as e:  # the user's exception, whatever it is, goes back
        _emit(("err", e, traceback.format_exc()))
        return 1
    _emit(("ok", value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
