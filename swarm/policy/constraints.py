"""Where a task may run: node labels, hard constraints over them, soft preferences.

A node's labels are short strings (`rack=r1`, `arch=x86_64`, `mem=64G`): static ones
from its configuration plus facts its agent discovers, carried in its load report. A
task states hard constraints (`--constraint`) that placement, the target's re-check
and transfer all test with `unmet`, and soft preferences (`--prefer`) that only score.

Constraint grammar (one per `--constraint`, a label key on the left):

    key=value   key==value   key!=value        equality / inequality
    key in a,b,c             key notin a,b,c   set membership
    key~regex                                  regex search (`^...$` to anchor; restricted)
    key<v  key<=v  key>v  key>=v               sizes (64G, 512M, 3) or versions (6.1.0)
    key                      !key              the label exists / does not

A missing label fails every test but `!=`, `notin` and `!key` (as Nomad's `!=`).
Sizes compare as numbers with binary suffixes (K, M, G, T, P; 64G = 64 GiB; a
fraction needs a suffix: 1.5T); values that are not both sizes compare as versions
(their runs of digits, left to right), so os.version 9.10 is above 9.4.

Security: a constraint is a submitter's data and the agent evaluates it, so a regex
is restricted to keep matching cheap on any label (at most 64 characters): no groups,
no backslash escapes, no counted repeats, at most two repeats (`*`, `+`, `?`; each
`?` doubles the paths a backtracking search may try), so a search costs at most
about 64**3 steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import attrs

MAX_LABELS = 24  # labels one node advertises (static and discovered together)
MAX_KEY = 63
MAX_VALUE = 64
LABELS_BYTES = 384  # their total characters: a load report must fit a gossip datagram
MAX_CONSTRAINTS = 16  # per task, hard and soft each
MAX_CONSTRAINT_LEN = 200
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}")
_VALUE = re.compile(r"[A-Za-z0-9_.:\-+/@,]{0,64}")
KEY_RULE = "starts with a letter or digit and holds at most 63 letters, digits, '_', '.', '-', '/'"
VALUE_RULE = "at most 64 letters, digits and '_.:-+/@,'"
_OPS = ("==", "!=", "<=", ">=", "=", "<", ">", "~")
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGTP]?)(?:i?B)?", re.IGNORECASE)


_JOB = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,127}")
JOB_RULE = "starts with a letter, digit or '_' and holds at most 128 letters, digits, '_.:-'"


def valid_job_name(name: str) -> bool:
    return bool(_JOB.fullmatch(name))


def valid_label_key(key: str) -> bool:
    return bool(_KEY.fullmatch(key))


class ConstraintError(ValueError):
    """A constraint or label that cannot be understood; the text names it and why."""


@attrs.frozen
class Constraint:
    """One parsed test of a node's labels. `text` is what the user wrote."""

    key: str
    op: str  # = != in notin ~ < <= > >= exists absent
    values: tuple[str, ...]
    text: str
    _regex: re.Pattern[str] | None = attrs.field(default=None, eq=False, repr=False)

    def unmet(self, labels: Mapping[str, str]) -> str | None:
        """None when `labels` satisfy this constraint, else a short reason."""
        have = labels.get(self.key)
        op = self.op
        if op == "exists":
            return None if have is not None else f"no label {self.key}"
        if op == "absent":
            return None if have is None else f"{self.key}={have} (must be absent)"
        if op == "!=":
            return None if have != self.values[0] else f"{self.key}={have}"
        if op == "notin":
            return None if have not in self.values else f"{self.key}={have}"
        if have is None:
            return f"no label {self.key}"
        if op == "=":
            ok = have == self.values[0]
        elif op == "in":
            ok = have in self.values
        elif op == "~":
            assert self._regex is not None
            ok = self._regex.search(have) is not None
        else:
            cmp = compare(have, self.values[0])
            if cmp is None:
                return f"{self.key}={have} (not comparable with {self.values[0]})"
            ok = {"<": cmp < 0, "<=": cmp <= 0, ">": cmp > 0, ">=": cmp >= 0}[op]
        return None if ok else f"{self.key}={have}"


def parse_constraint(text: str) -> Constraint:
    """One constraint from its text, or ConstraintError naming what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ConstraintError("empty constraint")
    if len(text) > MAX_CONSTRAINT_LEN:
        raise ConstraintError(f"constraint longer than {MAX_CONSTRAINT_LEN} characters")
    s = text.strip()
    words = s.split()
    if len(words) == 3 and words[1] in ("in", "notin"):
        key, op, rest = words
        values = tuple(v for v in rest.split(",") if v)
        if not values:
            raise ConstraintError(f"{text!r}: '{op}' needs values: key {op} a,b,c")
        for v in values:
            _check_value(v, text)
        return Constraint(_check_key(key, text), op, values, s)
    if s.startswith("!") and _KEY.fullmatch(s[1:]):
        return Constraint(s[1:], "absent", (), s)
    if _KEY.fullmatch(s):
        return Constraint(s, "exists", (), s)
    m = re.match(r"([^=!<>~\s]+)\s*(==|!=|<=|>=|=|<|>|~)\s*(.*)", s)
    if m is None:
        raise ConstraintError(
            f"{text!r}: expected key=value, key!=value, key in a,b, key~regex,"
            " key>=value (also <, <=, >), key or !key"
        )
    key, op, value = _check_key(m.group(1), text), m.group(2), m.group(3)
    if op == "==":
        op = "="
    if op == "~":
        return Constraint(key, op, (value,), s, _safe_regex(value, text))
    _check_value(value, text)
    if op in ("<", "<=", ">", ">=") and not re.search(r"[0-9]", value):
        raise ConstraintError(
            f"{text!r}: '{op}' compares sizes or versions: {value!r} has no digit"
        )
    return Constraint(key, op, (value,), s)


def parse_constraints(texts: Iterable[str], what: str = "constraint") -> tuple[Constraint, ...]:
    out = tuple(parse_constraint(t) for t in texts)
    if len(out) > MAX_CONSTRAINTS:
        raise ConstraintError(f"more than {MAX_CONSTRAINTS} {what}s")
    return out


def unmet(constraints: Sequence[Constraint], labels: Mapping[str, str]) -> str | None:
    """None when every constraint holds on `labels`, else the first failure's reason."""
    for c in constraints:
        why = c.unmet(labels)
        if why is not None:
            return f"constraint {c.text}: {why}"
    return None


def matched(prefs: Sequence[Constraint], labels: Mapping[str, str]) -> int:
    """How many soft preferences `labels` satisfy."""
    return sum(1 for p in prefs if p.unmet(labels) is None)


def _check_key(key: str, text: str) -> str:
    if not _KEY.fullmatch(key):
        raise ConstraintError(f"{text!r}: label key {key!r:.40}: a key {KEY_RULE}")
    return key


def _check_value(value: str, text: str) -> None:
    if not _VALUE.fullmatch(value):
        raise ConstraintError(f"{text!r}: value {value!r:.40}: a value is {VALUE_RULE}")


def _safe_regex(pattern: str, text: str) -> re.Pattern[str]:
    """Compile a submitter's regex only if matching it stays cheap (module docstring)."""
    if not pattern:
        raise ConstraintError(f"{text!r}: empty regex")
    if len(pattern) > 100:
        raise ConstraintError(f"{text!r}: regex longer than 100 characters")
    bad = set(pattern) & set("()\\{}")
    if bad:
        raise ConstraintError(
            f"{text!r}: regex may not use {''.join(sorted(bad))!r}"
            " (allowed: literals, '.', '|', '[...]', '^', '$', and at most two '*', '+' or '?')"
        )
    if sum(pattern.count(c) for c in "*+?") > 2:
        raise ConstraintError(f"{text!r}: regex has more than two '*', '+' or '?'")
    if re.search(r"[*+?][*+?]", pattern):
        raise ConstraintError(f"{text!r}: regex has a repeated repeat")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ConstraintError(f"{text!r}: bad regex: {e}") from None


# ----------------------------------------------------------------- comparison


def size_value(text: str) -> float | None:
    """`64G` -> 64 * 2**30, `3` -> 3, `1.5T`; None when `text` is not a size (`9.10`
    without a suffix is a version: as a decimal it would sort below `9.4`)."""
    m = _SIZE.fullmatch(text.strip())
    if m is None or ("." in m.group(1) and not m.group(2)):
        return None
    return float(m.group(1)) * _SUFFIX[m.group(2).upper()]


def version_key(text: str) -> tuple[int, ...]:
    """The runs of digits of a version, left to right: `6.1.0-18-amd64` -> (6, 1, 0, 18)."""
    return tuple(int(x) for x in re.findall(r"[0-9]+", text)[:8])


def compare(have: str, want: str) -> int | None:
    """-1, 0 or 1 comparing a label with a constraint's value: as sizes when both are
    sizes, else as versions; None when either has no digits."""
    a, b = size_value(have), size_value(want)
    if a is not None and b is not None:
        return (a > b) - (a < b)
    va, vb = version_key(have), version_key(want)
    if not va or not vb:
        return None
    return (va > vb) - (va < vb)


# --------------------------------------------------------------------- labels


def check_labels(labels: Mapping[str, str], what: str = "labels") -> dict[str, str]:
    """Labels as a node may advertise them, or ConstraintError naming the bad one."""
    out: dict[str, str] = {}
    for k, v in labels.items():
        if not isinstance(k, str) or not _KEY.fullmatch(k):
            raise ConstraintError(f"{what}: key {k!r:.40}: a key {KEY_RULE}")
        if not isinstance(v, str) or not _VALUE.fullmatch(v):
            raise ConstraintError(f"{what}: {k}: value {v!r:.40}: a value is {VALUE_RULE}")
        out[k] = v
    if len(out) > MAX_LABELS:
        raise ConstraintError(f"{what}: more than {MAX_LABELS} labels")
    if labels_size(out) > LABELS_BYTES:
        raise ConstraintError(f"{what}: more than {LABELS_BYTES} characters in all")
    return out


def labels_size(labels: Mapping[str, str]) -> int:
    return sum(len(k) + len(v) + 2 for k, v in labels.items())


def merge_labels(discovered: Mapping[str, str], static: Mapping[str, str]) -> dict[str, str]:
    """A node's labels: what it discovered, overridden by what its operator set; then
    cut to the bounds (static labels first, then discovered ones in key order), so a
    host with odd facts still advertises within LABELS_BYTES."""
    out: dict[str, str] = {}
    size = 0
    for k, v in [*sorted(static.items()), *sorted(discovered.items())]:
        if k in out or not _KEY.fullmatch(k):
            continue
        v = v if _VALUE.fullmatch(v) else re.sub(r"[^A-Za-z0-9_.:\-+/@,]", "-", v)[:MAX_VALUE]
        cost = len(k) + len(v) + 2
        if len(out) >= MAX_LABELS or size + cost > LABELS_BYTES:
            continue
        out[k] = v
        size += cost
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------- spread


def spread_values(counts: Mapping[str, int], values: Iterable[str]) -> frozenset[str]:
    """The label values a spread task should go to: those of `values` (the values live
    nodes have) with the fewest of its job's tasks so far (`counts`)."""
    vals = set(values)
    if not vals:
        return frozenset()
    low = min(counts.get(v, 0) for v in vals)
    return frozenset(v for v in vals if counts.get(v, 0) == low)
