"""Human-readable figures and tables for the CLI and `swarm top` (one shape for both)."""

from __future__ import annotations

import re
from collections.abc import Sequence

# What must never reach a terminal raw from data: C0 controls (newline and tab too:
# one value stays one cell, one line), DEL, C1 controls (0x9b is a one-byte CSI on
# some terminals) and the Unicode bidi overrides/isolates that reorder what is shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(m: re.Match[str]) -> str:
    c = m.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def term_safe(text: object) -> str:
    """`text` as one line a terminal shows as is: control characters (and bidi
    controls) become visible escapes (ESC -> \\x1b, newline -> \\n). Every
    human-readable CLI output passes what came from data (task names, argv, labels,
    users, node names, reasons) through here; JSON output is left to json.dumps.
    Idempotent: its output has nothing left to escape."""
    s = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_escape_one, s)


def fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{s / 60:.1f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def table_lines(rows: Sequence[Sequence[str]], headers: Sequence[str]) -> list[str]:
    """Left-aligned columns, two spaces apart, no trailing blanks; cells are
    escaped for the terminal (term_safe) before they are measured."""
    rows = [[term_safe(c) for c in r] for r in rows]
    headers = [term_safe(h) for h in headers]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    out = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    for r in rows:
        out.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    return out
