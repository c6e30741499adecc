"""An elastic pool as the agent sees it (pure; issue 25): its rules read from
`[scale.POOL]` tables, and its view built from gossiped load reports.

`policy/autoscale.py` decides from a `PoolView`; this module says which nodes are in
the pool (a selector over node labels, the grammar of `--constraint`), sums their
reports into the view, and turns one node's report into what removing it would cost
(`NodeWork`). The hook commands are the operator's: they come from the root-owned
agent.toml only, never from a peer or a submitter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ..model import LoadReport, NodeId
from . import autoscale as asc
from .constraints import Constraint, ConstraintError, parse_constraints, unmet

POOL_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_POOLS = 16
MAX_COMMAND = 4096

_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

# `[scale.POOL]` key -> (ScaleConfig field or PoolSpec field, kind)
_SCALE_KEYS: Mapping[str, tuple[str, str]] = {
    "min-nodes": ("min_nodes", "int"),
    "max-nodes": ("max_nodes", "int"),
    "target-utilisation": ("target_utilisation", "float"),
    "tolerance": ("tolerance", "float"),
    "scale-out-window": ("scale_out_window", "duration"),
    "scale-in-window": ("scale_in_window", "duration"),
    "out-cooldown": ("out_cooldown", "duration"),
    "in-cooldown": ("in_cooldown", "duration"),
    "max-step": ("max_step", "int"),
    "max-view-age": ("max_view_age", "duration"),
    "slots-per-node": ("slots_per_node", "float"),
    "scale-in-utilisation": ("scale_in_utilisation", "float"),
}
_POOL_KEYS: Mapping[str, tuple[str, str]] = {
    "selector": ("selector_text", "list"),
    "scale-out-command": ("out_command", "command"),
    "scale-in-command": ("in_command", "command"),
    "hook-timeout": ("hook_timeout", "duration"),
    "hook-retries": ("hook_retries", "int"),
    "hook-backoff": ("hook_backoff", "duration"),
    "drain-grace": ("drain_grace", "duration"),
    "boot-timeout": ("boot_timeout", "duration"),
    "lease-ttl": ("lease_ttl", "duration"),
}


class PoolConfigError(ValueError):
    """A `[scale.POOL]` table that cannot be used; the message names the key."""


@attrs.frozen
class PoolSpec:
    """One pool: the decision's rules plus what the agent needs to act on them."""

    scale: asc.ScaleConfig
    out_command: str
    in_command: str
    selector_text: tuple[str, ...] = ()  # constraints on node labels; () = every node
    selector: tuple[Constraint, ...] = ()
    hook_timeout: float = 300.0  # s: one attempt of a hook
    hook_retries: int = 3  # retries of one action's hook after its first attempt
    hook_backoff: float = 10.0  # s before the first retry; doubles for each further one
    drain_grace: float = 600.0  # s a drained node's running tasks get before removal
    boot_timeout: float = 600.0  # s a launched node counts as booting until it joins
    lease_ttl: float = 15.0  # s: the actor's lease (renewed every third of it)

    @property
    def name(self) -> str:
        return self.scale.pool

    @property
    def key(self) -> str:
        """The actor seat's key and the gossip key of this pool's lease."""
        return f"scale.{self.name}"

    def retry_delay(self, attempt: int) -> float:
        """Seconds before retry `attempt` (1 for the first retry): backoff, doubled."""
        return float(self.hook_backoff * 2 ** max(0, min(attempt - 1, 10)))

    def holds(self, labels: Mapping[str, str]) -> bool:
        """Is a node with these labels in the pool?"""
        return unmet(self.selector, labels) is None


def _duration(where: str, v: Any) -> float:
    if isinstance(v, bool):
        raise PoolConfigError(f"{where}: expected a duration such as 30, '30s' or '5m'")
    if isinstance(v, int | float):
        value = float(v)
    elif isinstance(v, str) and v.strip():
        t = v.strip().lower()
        unit = _DURATION_UNITS.get(t[-1])
        try:
            value = float(t[:-1] if unit else t) * (unit or 1.0)
        except ValueError:
            raise PoolConfigError(
                f"{where}: expected a duration such as 30, '30s' or '5m', got {v!r:.40}"
            ) from None
    else:
        raise PoolConfigError(f"{where}: expected a duration such as 30, '30s' or '5m'")
    if not (math.isfinite(value) and value >= 0):
        raise PoolConfigError(f"{where}: must be a finite duration >= 0, got {v!r:.40}")
    return value


def _value(where: str, kind: str, v: Any) -> Any:
    if kind == "duration":
        return _duration(where, v)
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise PoolConfigError(f"{where}: expected an integer, got {v!r:.40}")
        return v
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise PoolConfigError(f"{where}: expected a number, got {v!r:.40}")
        return float(v)
    if kind == "list":
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise PoolConfigError(f"{where}: expected a list of constraints such as ['pool=gpu']")
        return tuple(v)
    # a command: the operator's shell line
    if not isinstance(v, str) or not v.strip():
        raise PoolConfigError(f"{where}: expected a non-empty command line")
    if len(v) > MAX_COMMAND or "\0" in v:
        raise PoolConfigError(f"{where}: longer than {MAX_COMMAND} characters or has a NUL")
    return v


def parse_pool(name: str, table: Any) -> PoolSpec:
    """One `[scale.NAME]` table; every error names `scale.NAME.key`."""
    where = f"scale.{name}"
    if not isinstance(name, str) or not POOL_NAME.match(name):
        raise PoolConfigError(
            f"{where}: a pool name is 1-63 of a-z 0-9 _ . - (starting with a letter or digit)"
        )
    if not isinstance(table, Mapping):
        raise PoolConfigError(f"{where}: must be a table ([scale.{name}])")
    scale: dict[str, Any] = {"pool": name}
    pool: dict[str, Any] = {}
    for key, v in table.items():
        if key in _SCALE_KEYS:
            field, kind = _SCALE_KEYS[key]
            scale[field] = _value(f"{where}.{key}", kind, v)
        elif key in _POOL_KEYS:
            field, kind = _POOL_KEYS[key]
            pool[field] = _value(f"{where}.{key}", kind, v)
        else:
            known = ", ".join(sorted([*_SCALE_KEYS, *_POOL_KEYS]))
            raise PoolConfigError(f"{where}.{key}: unknown key (known: {known})")
    for key, field in (("scale-out-command", "out_command"), ("scale-in-command", "in_command")):
        if field not in pool:
            raise PoolConfigError(f"{where}.{key}: required (the command that adds or removes)")
    if scale.get("slots_per_node") == 0:
        scale["slots_per_node"] = None  # 0: the pool's mean, as documented
    try:
        cfg = asc.ScaleConfig(**scale)
    except ValueError as e:
        field, _, msg = str(e).partition(": ")
        key = next((k for k, (f, _) in _SCALE_KEYS.items() if f == field), field)
        raise PoolConfigError(f"{where}.{key}: {msg}") from None
    try:
        pool["selector"] = parse_constraints(pool.get("selector_text", ()), "selector")
    except ConstraintError as e:
        raise PoolConfigError(f"{where}.selector: {e}") from None
    for key, field, lo in (
        ("hook-timeout", "hook_timeout", 0.001),
        ("lease-ttl", "lease_ttl", 0.05),
    ):
        if field in pool and pool[field] < lo:
            raise PoolConfigError(f"{where}.{key}: must be at least {lo:g} s")
    if pool.get("lease_ttl", 15.0) > 3600:
        raise PoolConfigError(f"{where}.lease-ttl: must be at most 3600 s")
    if not 0 <= pool.get("hook_retries", 0) <= 100:
        raise PoolConfigError(f"{where}.hook-retries: must be 0-100")
    return PoolSpec(scale=cfg, **pool)


def parse_pools(tables: Any) -> tuple[PoolSpec, ...]:
    """The agent's `scale` option: `[scale.NAME]` tables, each a pool."""
    if tables is None:
        return ()
    if not isinstance(tables, Mapping):
        raise PoolConfigError("scale: must be a set of [scale.NAME] tables")
    if len(tables) > MAX_POOLS:
        raise PoolConfigError(f"scale: at most {MAX_POOLS} pools, got {len(tables)}")
    return tuple(parse_pool(name, t) for name, t in sorted(tables.items()))


# ------------------------------------------------------------------- the view


@attrs.frozen
class Member:
    """A live member with its newest report (None: not heard yet) and the report's age."""

    node: NodeId
    report: LoadReport | None
    age: float = 0.0


def in_pool(spec: PoolSpec, mb: Member) -> bool:
    return mb.report is not None and spec.holds(dict(mb.report.labels))


def pool_view(
    spec: PoolSpec,
    members: Iterable[Member],
    *,
    draining: Iterable[NodeId] = (),
    booting: int = 0,
) -> asc.PoolView:
    """The pool's `PoolView`: nodes that take work and their slots; the demand of every
    pool node (running work on a draining node still needs a place or its end);
    `draining` the scale-in victims still in the pool; the oldest report's age.

    A node an operator drained (shares 0) and that is not a victim is neither capacity
    nor draining: the pool sizes itself without it. Members with no report yet are left
    out (their labels are unknown)."""
    victims = set(draining)
    nodes = 0
    n_draining = 0
    slots = running = queued = 0.0
    age = 0.0
    for mb in members:
        if not in_pool(spec, mb):
            continue
        r = mb.report
        assert r is not None
        age = max(age, mb.age)
        running += r.running
        queued += r.queued
        if mb.node in victims:
            n_draining += 1
        elif not r.draining:
            nodes += 1
            slots += r.slots
    return asc.PoolView(
        nodes=nodes,
        slots=slots,
        running=running,
        queued=queued,
        age=age,
        draining=n_draining,
        booting=booting,
    )


def node_work(r: LoadReport, age: float = 0.0, *, pinned: bool = False) -> asc.NodeWork:
    """What removing this node loses, from its report `age` seconds old: the figures
    grew since (each running task by a second a second; the report is re-gossiped
    unchanged while only they change)."""
    age = max(0.0, age)
    return asc.NodeWork(
        node=r.node,
        task_seconds=r.task_seconds + r.running * age,
        queued=r.queued,
        unmovable_seconds=r.unmovable_seconds + (age if r.unmovable_seconds > 0 else 0.0),
        pinned=pinned,
    )
