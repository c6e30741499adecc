"""How a fleet is shared (pure; issue 20): priority classes, accounting groups, who may
use which, elastic quotas, and the knobs of preemption and fair share.

Parsed once from the agent's configuration (`[priorities]`, `[groups.NAME]`, and a few
scalar keys); every error names its key, so a bad file stops the agent with one line.
The same value is used by the node's decisions and by the simulator.

Priority classes are names with numeric values, as in Kubernetes and Nomad: a higher
value starts first and may preempt a lower one at least `preempt_min_gap` below it. A
task carries its numeric value (so nodes with different class tables still agree on
the order) and its class name (for display).

Groups: a task's accounting group defaults to its submitter's primary Unix group. A
configured group may list `members` (then only they, and root, may use it); a group
with no table may be used by its Unix members. `max-priority` bounds the class a
group's members may ask for (default `high`; `system` needs root). `quota-max` caps
what the group runs cluster-wide (slots, approximately: see policy/quota.py);
`quota-min` is what it may reclaim by preempting work borrowed above other groups'
mins. Groups form a tree through `parent`; the children's mins must fit in the
parent's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..model import DEFAULT_PRIORITY, GROUP_RULE, MAX_PRIORITY, valid_group_name

DEFAULT_CLASSES: tuple[tuple[str, int], ...] = (
    ("low", 10),
    ("normal", 50),
    ("high", 100),
    ("system", 1000),
)
DEFAULT_CLASS = "normal"
ROOT_ONLY_CLASS = "system"


class SharingError(ValueError):
    """A configuration error, naming its key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@attrs.frozen
class Group:
    name: str
    members: frozenset[str] | None = None  # None: its Unix members may use it
    max_priority: int = 100
    quota_max: float | None = None  # slots, cluster-wide
    quota_min: float = 0.0
    parent: str | None = None
    weight: float = 1.0


@attrs.frozen
class Sharing:
    classes: tuple[tuple[str, int], ...] = DEFAULT_CLASSES
    default_class: str = DEFAULT_CLASS
    groups: tuple[Group, ...] = ()
    preempt: bool = True
    preempt_min_gap: int = 1  # in priority value
    preempt_per_minute: int = 30  # per node; a bound so preemption cannot thrash
    half_life: float = 86_400.0  # fair-share usage decay (HTCondor's default: a day)
    quota_floor: float = 0.0  # slots a node may always start for a capped group it has demand for
    quota_lag: float = 2.0  # s: a node counts its own queued demand as it was this long ago

    def value_of(self, name: str) -> int | None:
        return dict(self.classes).get(name)

    def name_of(self, value: int) -> str:
        """The class a value belongs to (the highest class at or below it)."""
        best = None
        for name, v in sorted(self.classes, key=lambda c: c[1]):
            if v <= value:
                best = name
        return best if best is not None and self.value_of(best) == value else str(value)

    @property
    def default_priority(self) -> int:
        v = self.value_of(self.default_class)
        return DEFAULT_PRIORITY if v is None else v

    def group(self, name: str) -> Group | None:
        return next((g for g in self.groups if g.name == name), None)

    def may_use_group(
        self, user: str | None, uid: int, group: str, unix_groups: frozenset[str]
    ) -> str | None:
        """Why this user may not use this group (None: they may)."""
        if uid == 0:
            return None
        g = self.group(group)
        if g is not None and g.members is not None:
            return None if user in g.members else f"user {user} is not a member of group {group}"
        if group in unix_groups:
            return None
        return f"user {user} is not a member of group {group}"

    def may_use_priority(self, uid: int, group: str, value: int) -> str | None:
        """Why this priority is not allowed for this user and group (None: it is)."""
        if uid == 0:
            return None
        system = self.value_of(ROOT_ONLY_CLASS)
        g = self.group(group)
        cap = g.max_priority if g is not None else dict(self.classes).get("high", 100)
        if system is not None and value >= system:
            return f"priority {self.name_of(value)} is for root only"
        if value > cap:
            return f"group {group} may use priorities up to {self.name_of(cap)}"
        return None

    def weights(self) -> dict[str, float]:
        return {"group:" + g.name: g.weight for g in self.groups if g.weight != 1.0}


def _num(key: str, v: Any, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SharingError(key, f"must be a number, got {v!r:.40}")
    if not lo <= v <= hi:
        raise SharingError(key, f"must be {lo:g} to {hi:g}, got {v!r}")
    return float(v)


def parse(
    priorities: Mapping[str, Any] | None,
    groups: Mapping[str, Any] | None,
    *,
    default_class: str = DEFAULT_CLASS,
    preempt: bool = True,
    preempt_min_gap: int = 1,
    preempt_per_minute: int = 30,
    half_life: float = 86_400.0,
    quota_floor: float = 0.0,
    quota_lag: float = 2.0,
) -> Sharing:
    """The sharing policy from the config's tables; SharingError names a bad key."""
    classes = DEFAULT_CLASSES
    if priorities:
        if not isinstance(priorities, Mapping):
            raise SharingError("priorities", "must be a table of class = value")
        out: list[tuple[str, int]] = []
        for name, v in priorities.items():
            key = f"priorities.{name}"
            if not valid_group_name(str(name)):
                raise SharingError(key, f"invalid class name: a name {GROUP_RULE}")
            if isinstance(v, bool) or not isinstance(v, int):
                raise SharingError(key, f"must be an integer, got {v!r:.40}")
            if not -MAX_PRIORITY <= v <= MAX_PRIORITY:
                raise SharingError(key, f"must be -{MAX_PRIORITY} to {MAX_PRIORITY}")
            out.append((str(name), v))
        values = [v for _, v in out]
        if len(set(values)) != len(values):
            raise SharingError("priorities", "two classes have the same value")
        classes = tuple(sorted(out, key=lambda c: c[1]))
    if default_class not in dict(classes):
        raise SharingError("default-priority", f"no class named {default_class!r:.40}")
    if preempt_min_gap < 1:
        raise SharingError("preempt-min-gap", "must be 1 or more")
    if preempt_per_minute < 0:
        raise SharingError("preempt-per-minute", "must be 0 or more")
    if half_life <= 0:
        raise SharingError("fair-share-half-life", "must be greater than 0")
    if quota_floor < 0:
        raise SharingError("quota-floor", "must be 0 or more")
    if quota_lag < 0:
        raise SharingError("quota-lag", "must be 0 or more")
    parsed: list[Group] = []
    for name, table in (groups or {}).items():
        parsed.append(_group(str(name), table, dict(classes)))
    _check_tree(parsed)
    return Sharing(
        classes=classes,
        default_class=default_class,
        groups=tuple(sorted(parsed, key=lambda g: g.name)),
        preempt=preempt,
        preempt_min_gap=preempt_min_gap,
        preempt_per_minute=preempt_per_minute,
        half_life=half_life,
        quota_floor=quota_floor,
        quota_lag=quota_lag,
    )


_GROUP_KEYS = {"members", "max-priority", "quota-max", "quota-min", "parent", "weight"}


def _group(name: str, table: Any, classes: Mapping[str, int]) -> Group:
    key = f"groups.{name}"
    if not valid_group_name(name):
        raise SharingError(key, f"invalid group name: a name {GROUP_RULE}")
    if not isinstance(table, Mapping):
        raise SharingError(key, "must be a table")
    for k in table:
        if k.replace("_", "-") not in _GROUP_KEYS:
            raise SharingError(f"{key}.{k}", "unknown key")
    t = {k.replace("_", "-"): v for k, v in table.items()}
    members = t.get("members")
    if members is not None:
        if not isinstance(members, list) or not all(isinstance(u, str) for u in members):
            raise SharingError(f"{key}.members", "must be a list of user names")
        members = frozenset(members)
    cap = classes.get("high", max(classes.values()))
    if "max-priority" in t:
        mp = t["max-priority"]
        if mp not in classes:
            raise SharingError(f"{key}.max-priority", f"no class named {mp!r:.40}")
        cap = classes[mp]
    qmax = None if "quota-max" not in t else _slots(f"{key}.quota-max", t["quota-max"])
    qmin = 0.0 if "quota-min" not in t else _slots(f"{key}.quota-min", t["quota-min"])
    if qmax is not None and qmin > qmax:
        raise SharingError(f"{key}.quota-min", f"{qmin:g} is above quota-max {qmax:g}")
    parent = t.get("parent")
    if parent is not None and not isinstance(parent, str):
        raise SharingError(f"{key}.parent", "must be a group name")
    weight = _num(f"{key}.weight", t.get("weight", 1.0), 1e-6, 1e6)
    return Group(name, members, cap, qmax, qmin, parent, weight)


def _slots(key: str, v: Any) -> float:
    """A quota: a number of slots, or a table {slots = N}."""
    if isinstance(v, Mapping):
        unknown = set(v) - {"slots"}
        if unknown:
            raise SharingError(f"{key}.{sorted(unknown)[0]}", "only slots are capped for now")
        v = v.get("slots", 0)
    return _num(key, v, 0, 1e9)


def _check_tree(groups: list[Group]) -> None:
    by = {g.name: g for g in groups}
    for g in groups:
        if g.parent is not None and g.parent not in by:
            raise SharingError(f"groups.{g.name}.parent", f"no group named {g.parent!r:.40}")
        seen = {g.name}
        p = g.parent
        while p is not None:
            if p in seen:
                raise SharingError(f"groups.{g.name}.parent", "groups form a cycle")
            seen.add(p)
            p = by[p].parent
    for g in groups:
        kids = [c for c in groups if c.parent == g.name]
        if not kids:
            continue
        mins = sum(c.quota_min for c in kids)
        bound = g.quota_min if g.quota_min > 0 else g.quota_max
        if bound is not None and mins > bound:
            raise SharingError(
                f"groups.{g.name}.quota-min",
                f"its children's mins ({mins:g}) exceed the parent's ({bound:g})",
            )
