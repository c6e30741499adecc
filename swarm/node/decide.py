"""Placement and admission as plain functions of what they read (pure).

`NodeState` holds these inputs for one node (its fresh report, the view of its peers,
its ledger, Flex state and GPUs); the simulator (`swarm.sim`) holds them for thousands
of nodes without a NodeState each. Both decide through the functions here and in
`gate.py`, so a figure the simulator measures is a figure of the agent's own rules.

- `choose`: where a task goes, by the node's placement rule (function form of
  `Placing.choose`): two choices on the stale view (`policy.placement.place`) or the
  benchmarks' random baseline (`place_random`).
- `admission_refusal`: why a node would not take a task now, on its fresh state
  (function form of `LoadState.admission_refusal`, whose core is `admit_here`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence

from .. import model as m
from ..policy import load as loadpol
from ..policy import placement as pl
from ..policy import shares as sh
from ..policy.view import LoadView

TWO_CHOICE = "two-choice"  # Settings.placement_rule: power of d choices
RANDOM = "random"  # ... the benchmarks' baseline: a uniformly random eligible node

FREE_FLEX = loadpol.FlexState(p=1.0)  # Flex with nothing measured: no over-commit
NO_USAGE = loadpol.Usage()
NO_CAPACITY = loadpol.Capacity()  # capacity 0: CPU and memory not checked


def choose(
    rule: str,
    d: int,
    spec: m.TaskSpec,
    local: m.LoadReport,
    view: LoadView,
    rng: random.Random,
    now: float,
    exclude: frozenset[m.NodeId] = frozenset(),
    *,
    scan_below: int = 64,
    max_age: float | None = None,
    where: pl.Where = pl.NOWHERE,
) -> pl.Placement:
    """Where `spec` goes, placed from the node whose fresh report is `local`: the rule
    `random` draws a uniformly random eligible node (that one included), any other rule
    is power of `d` choices over `view` plus `local`. Nodes in `exclude` refused it;
    reports older than `max_age` are not candidates; `where` carries the home's view of
    the task's job and data (spread, anti-affinity, delay scheduling)."""
    if rule == RANDOM:
        return place_random(local.node, spec, local, view, rng, exclude)
    return pl.place(
        spec,
        local,
        view,
        rng,
        now,
        d=d,
        exclude=exclude,
        scan_below=scan_below,
        max_age=max_age,
        where=where,
    )


def admission_refusal(
    spec: m.TaskSpec,
    ledger: sh.ShareLedger,
    flex: loadpol.FlexState = FREE_FLEX,
    usage: loadpol.Usage = NO_USAGE,
    capacity: loadpol.Capacity = NO_CAPACITY,
    *,
    gpus: Sequence[m.GpuDeviceFree] | None = None,
    hook: Callable[[m.TaskSpec], str | None] | None = None,
    labels: Mapping[str, str] | None = None,
) -> str | None:
    """Why a node would not take `spec` now (None: it would), on its fresh state: the
    test hook first, a task already here is taken again (handoffs retry), else
    `policy.placement.admit` (shares, GPU summary, Flex on declared CPU and memory)."""
    if hook is not None and (why := hook(spec)):
        return why
    if spec.id in ledger:
        return None
    adm = pl.admit(spec, ledger, flex, usage, capacity, gpus=gpus, labels=labels)
    return None if adm.ok else adm.reason


def place_random(
    node: m.NodeId,
    spec: m.TaskSpec,
    local: m.LoadReport,
    view: LoadView,
    rng: random.Random,
    exclude: frozenset[m.NodeId],
) -> pl.Placement:
    """Baseline for benchmarks: a uniformly random eligible node (this one included)."""
    needs = pl.Needs.of(spec)
    nodes = [n for n in view if n != node]
    for _ in range(16):
        i = rng.randrange(len(nodes) + 1)
        pick = node if i == len(nodes) else nodes[i]
        report = local if pick == node else view[pick].report
        if pick not in exclude and pl.refusal(report, needs) is None:
            return pl.Placement(spec.id, pick, pick == node, (), "random", 1, len(nodes), False)
    return pl.Placement(
        spec.id, None, False, (), "random: no eligible node drawn", 16, len(nodes), False
    )
