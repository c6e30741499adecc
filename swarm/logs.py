"""One line per event on stderr, logfmt or JSON; journald adds the time and the unit.

A structured event log (not free text) so operators can grep `task=t1234` and the
chaos suite can scan for tracebacks and invariant breaks.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any, TextIO

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class EventLog:
    def __init__(
        self,
        stream: TextIO | None = None,
        fmt: str = "logfmt",
        level: str = "info",
        node: str = "",
        with_time: bool = True,
    ) -> None:
        self.stream = stream or sys.stderr
        self.fmt = fmt
        self.threshold = LEVELS.get(level, 20)
        self.node = node
        self.with_time = with_time

    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        if LEVELS[level] < self.threshold:
            return
        rec: dict[str, Any] = {}
        if self.with_time:
            rec["ts"] = f"{time.time():.3f}"
        rec["level"] = level
        rec["event"] = event
        if self.node:
            rec["node"] = self.node
        rec.update(fields)
        if self.fmt == "json":
            line = json.dumps(rec, default=str)
        else:
            line = " ".join(f"{k}={_logfmt_value(v)}" for k, v in rec.items())
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not take the agent down

    def debug(self, event: str, **fields: Any) -> None:
        self._emit("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)

    def exception(self, event: str, exc: BaseException, **fields: Any) -> None:
        """An unexpected error that the agent survived: one line, with the stack folded."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self._emit("error", event, {**fields, "error": repr(exc), "stack": tb.replace("\n", "\\n")})


def _logfmt_value(v: Any) -> str:
    s = str(v) if not isinstance(v, float) else f"{v:.6g}"
    if s == "" or any(c in s for c in ' ="\n\t'):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


NULL_LOG = EventLog(stream=open("/dev/null", "w"), level="error")  # noqa: SIM115
