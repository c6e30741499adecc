"""The elastic scenario's set-up (issue 25): every agent carries the same `[scale.NAME]`
pool, whose hooks are a recorder, and the harness reads back what the hooks were told.

The recorder (`RECORDER`, written into the run's directory) appends one JSON line per
call to a file there: the wall time it started, and the action, count, nodes, actor,
epoch, attempt and pool the agent put in its environment. It removes nothing and
stops no agent: a "removed" node stays a member (drained by its scale-in), so the
usual invariants still judge every agent, and the scale checks read the hook calls
against the agents' own journals. The paths reach the hook on its command line (the
agent gives a hook only a minimal environment).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs

from .invariants import HookCall

# One JSON line per call; `print(..., file=f)` on a file opened for append is one
# write(2) of a short line, so concurrent calls (two actors in a partition) never
# interleave within a line.
RECORDER = """\
import json, os, sys, time
t = time.time()
e = os.environ
rec = {
    "t": t,
    "pool": e.get("SWARM_SCALE_POOL", ""),
    "action": e.get("SWARM_SCALE_ACTION", ""),
    "count": e.get("SWARM_SCALE_COUNT", ""),
    "nodes": e.get("SWARM_SCALE_NODES", "").split(),
    "desired": e.get("SWARM_SCALE_DESIRED", ""),
    "epoch": e.get("SWARM_SCALE_EPOCH", ""),
    "actor": e.get("SWARM_SCALE_ACTOR", ""),
    "attempt": e.get("SWARM_SCALE_ATTEMPT", ""),
}
with open(sys.argv[1], "a") as f:
    print(json.dumps(rec, sort_keys=True), file=f)
print(f"recorded {rec['action']} {rec['count']} {' '.join(rec['nodes'])}")
"""


@attrs.frozen
class ElasticSpec:
    """The pool every agent of the elastic scenario carries (`[scale.POOL]`)."""

    pool: str = "chaos"
    min_nodes: int = 1
    max_nodes: int = 12
    target_utilisation: float = 0.7
    scale_in_window: float = 4.0
    in_cooldown: float = 8.0
    out_cooldown: float = 8.0
    max_step: int = 1
    lease_ttl: float = 2.0
    # longer than any task of the workload: a victim's hook waits for its work to end,
    # never for the grace (the check excuses a hook that ran after the grace, and says so)
    drain_grace: float = 60.0
    hook_timeout: float = 10.0
    # the recorder launches nothing: a scale-out's nodes stop counting as booting soon
    boot_timeout: float = 10.0
    hook_retries: int = 2
    hook_backoff: float = 1.0

    def toml(self, out_command: str, in_command: str) -> str:
        def q(s: str) -> str:
            return json.dumps(s)  # a TOML basic string is a JSON string for these

        return "\n".join(
            [
                f"[scale.{self.pool}]",
                f"min-nodes = {self.min_nodes}",
                f"max-nodes = {self.max_nodes}",
                f"target-utilisation = {self.target_utilisation}",
                f"scale-in-window = {self.scale_in_window}",
                f"in-cooldown = {self.in_cooldown}",
                f"out-cooldown = {self.out_cooldown}",
                f"max-step = {self.max_step}",
                f"lease-ttl = {self.lease_ttl}",
                f"drain-grace = {self.drain_grace}",
                f"hook-timeout = {self.hook_timeout}",
                f"boot-timeout = {self.boot_timeout}",
                f"hook-retries = {self.hook_retries}",
                f"hook-backoff = {self.hook_backoff}",
                f"scale-out-command = {q(out_command)}",
                f"scale-in-command = {q(in_command)}",
                "",
            ]
        )


@attrs.frozen
class ElasticFiles:
    config: Path  # the agents' --config
    recorder: Path
    calls: Path  # the recorder's JSON lines


def write_files(root: Path, spec: ElasticSpec, python: str = sys.executable) -> ElasticFiles:
    """The recorder script and the agents' config file, in the run's directory."""
    recorder = root / "scale-hook.py"
    recorder.write_text(RECORDER)
    calls = root / "scale-hooks.jsonl"
    calls.touch()
    cmd = " ".join(shlex.quote(x) for x in (python, "-I", str(recorder), str(calls)))
    config = root / "elastic.toml"
    config.write_text(spec.toml(cmd, cmd))
    return ElasticFiles(config, recorder, calls)


def read_calls(path: Path) -> list[HookCall]:
    """The recorder's lines, in time order; a line that does not parse is skipped."""
    out: list[HookCall] = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            d = json.loads(line)
            out.append(
                HookCall(
                    at=float(d["t"]),
                    action=str(d["action"]),
                    nodes=tuple(str(n) for n in d.get("nodes", ())),
                    actor=str(d.get("actor", "")),
                    epoch=int(d.get("epoch") or 0),
                    attempt=int(d.get("attempt") or 0),
                    count=int(d.get("count") or 0),
                    pool=str(d.get("pool", "")),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    out.sort(key=lambda c: c.at)
    return out


def describe_calls(calls: Sequence[HookCall], t0: float) -> str:
    """One line: each call as `+12.3s in [n4] by n2 e3`."""
    return (
        "; ".join(
            f"+{c.at - t0:.1f}s {c.action} [{','.join(c.nodes)}] by {c.actor} e{c.epoch}"
            + (f" attempt {c.attempt}" if c.attempt else "")
            for c in calls
        )
        or "none"
    )
