#!/usr/bin/env python3
"""Writes deploy/agent.toml.example from the options table (swarm/options.py).

    python deploy/gen_agent_toml.py > deploy/agent.toml.example

tests/integration/test_systemd_files.py fails when the file and the table disagree,
so a new option cannot be forgotten here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.options import OPTIONS, Option

# Values to show for options whose default is "unset" (computed at start-up).
EXAMPLES: dict[str, Any] = {
    "node-id": "node1",
    "state-dir": "/var/lib/swarm",
    "socket": "/run/swarm/swarm.sock",
    "socket-group": "swarm",
    "slots": 8,
    "shares": 8192,  # 1024 per slot, as the default for the 8 slots above
    "report-max-age": 15.0,
    "advertise": "10.0.0.5",
    "keyring": "/etc/swarm/keyring",
    "faults": "drop=0.1,seed=1",
    "metrics": "127.0.0.1:9464",
}

# Values to show for list options whose default is empty (TOML text, as written).
SHOWN: dict[str, str] = {
    "labels": '{ rack = "r1", zone = "eu-1" }',
    "data-keys": '["imagenet"]',
    "data-dirs": '["/data"]',
}

# Extra comment lines shown under an option's help (what the one-line help cannot say).
NOTES: dict[str, list[str]] = {
    "default-priority": [
        "a class named in [priorities] (below); `swarm submit --priority` overrides it"
    ],
    "preempt": [
        "checked when a task arrives at a node whose slots are all taken: victims are",
        "the lowest class, then the least work lost, then the newest; a --migrate",
        "checkpoint victim gets checkpoint-signal and checkpoint-timeout first; every",
        "victim goes back to this node's queue as a retry (docs/policy.md)",
    ],
    "preempt-per-minute": ["0 = never preempt (as preempt = false)"],
    "labels": [
        "discovered at start-up: arch, os, os.id, os.version, kernel, hostname, cpus,",
        "mem and, with GPUs, gpu.count and gpu.model; a label set here overrides one",
        "discovered; at most 24 labels and 384 characters in all (`swarm nodes --labels`)",
    ],
    "data-dirs": [
        "each entry directly inside (not recursive, no dotfiles) counts as two keys, its",
        "name and its absolute path; read at start-up; with data-keys, at most 48 keys",
    ],
    "report-max-age": [
        "transfer does not probe such peers either; migration has its own bound (30 s on lan)"
    ],
    "fair-share-half-life": [
        "usage (slot-, cpu-, mem- and gpu-seconds of running tasks, as requested) halves",
        "every this long; HTCondor's default is a day",
    ],
    "quota-floor": [
        "0: a capped group waits for its split of the cap (whole slots, by gossiped",
        "queued demand); 1: every node with queued work of the group may run one,",
        "so no node starves, and the cap may be exceeded by a slot per such node",
        "(besides what stale gossip lets through: docs/policy.md)",
    ],
}

# Example tables for the options that are tables (shown commented out, like the rest).
TABLES: dict[str, list[str]] = {
    "priorities": [
        "# A higher value starts first and may preempt a class at least preempt-min-gap",
        "# below it; `system` is for root only. A table replaces all four defaults:",
        "#[priorities]",
        "#low = 10",
        "#normal = 50",
        "#high = 100",
        "#system = 1000",
    ],
    "groups": [
        "# A task's group (`swarm submit --group`) defaults to its submitter's primary",
        "# Unix group; a group with no table, or no members list, may be used by its Unix",
        "# members (and root). Default: no tables. Quotas count slots only, cluster-wide,",
        "# enforced approximately from gossip (docs/policy.md).",
        "#[groups]",
        "#[groups.research]",
        "#quota-max = 64",
        "#[groups.ml]",
        '#members = ["alice", "bob"]   # only they (and root) may use it',
        '#max-priority = "high"        # the highest class its members may ask for',
        "#quota-max = 16               # slots its tasks may hold at once, cluster-wide",
        "#quota-min = 4                # slots it reclaims from groups above their own min",
        '#parent = "research"',
        "#weight = 2.0                 # fair-share weight (the queue ranks users: no effect yet)",
    ],
    "scale": [
        "# An elastic pool per table: the nodes its selector matches grow and shrink through",
        "# the operator's hook commands (docs/operations.md, Elastic fleets; an example hook:",
        "# deploy/scale-hook.example.sh). Give every agent the same tables: the pool's actor",
        "# is chosen among all live agents, and one without the table never acts. Default:",
        "# no tables. Each key is shown with its default, except the two commands (required).",
        '# Durations: 30, "30s", "5m", "2h", "1d".',
        "#[scale]",
        "#[scale.default]",
        "#selector = []                # label constraints (as --constraint); [] = every node",
        "#min-nodes = 0",
        "#max-nodes = 10               # booting and draining nodes count",
        "#target-utilisation = 0.7     # (running + queued) / slots the pool aims at",
        "#tolerance = 0.1              # no change while |utilisation / target - 1| <= this",
        '#scale-out-window = "0s"      # grow to the lowest recommendation of this window',
        '#scale-in-window = "5m"       # shrink to the highest recommendation of this window',
        '#out-cooldown = "1m"          # after the last action, before a scale-out',
        '#in-cooldown = "5m"           # after the last action, before a scale-in',
        "#max-step = 4                 # nodes one action adds or removes; nodes draining at once",
        '#max-view-age = "30s"         # an older view of the pool decides nothing',
        "#slots-per-node = 0           # a new node's slots; 0 = the pool's mean",
        "#scale-in-utilisation = 0.5   # a scale-in lands where demand sits at this (<= target)",
        '#scale-out-command = "/etc/swarm/scale-hook.sh"   # required; run with /bin/sh -c',
        '#scale-in-command = "/etc/swarm/scale-hook.sh"    # required',
        '#hook-timeout = "5m"          # one attempt; then its process group is killed',
        "#hook-retries = 3             # retries after a failed first attempt (0-100)",
        '#hook-backoff = "10s"         # before the first retry, doubled for each further one',
        '#drain-grace = "10m"          # for a drain; busy after it and the retries: kept',
        '#boot-timeout = "10m"         # a launched node counts as booting until it joins',
        '#lease-ttl = "15s"            # the actor\'s lease, renewed every third of it',
    ],
}

HEADER = """\
# swarm agent configuration: /etc/swarm/agent.toml (`swarm agent --config FILE`).
#
# Every option of `swarm agent` is listed below, commented out, with its default
# (or, for options computed at start-up, an example value). Precedence:
# this file < environment SWARM_<OPTION> < command-line flag --<option>.
# Keys may also be written with underscores, and may sit in an [agent] table.
#
# Generated from swarm/options.py by deploy/gen_agent_toml.py: do not edit by hand.
"""


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def placeholder(opt: Option) -> Any:
    return {"int": 1, "float": 1.0, "bool": False, "list": []}.get(opt.kind, "")


def block(opt: Option) -> list[str]:
    lines = [f"# {opt.help}"] + [f"# {n}" for n in NOTES.get(opt.name, [])]
    if opt.kind == "raw":
        lines.append("# (this file only)")
    else:
        lines.append(f"# (env {opt.env}" + (f", flag --{opt.name})" if opt.cli else ")"))
    if opt.name == "gpus":
        lines += [
            "#[[gpus]]",
            "#index = 0",
            '#memory = "80GiB"',
            "#numa = 0",
            '#nvlink-group = "a"',
        ]
        return lines
    if opt.name in TABLES:
        return lines + TABLES[opt.name]
    if isinstance(opt.default, dict):
        raise SystemExit(
            f"gen_agent_toml: option {opt.name!r} is a table: add its example to TABLES"
        )
    if opt.name in SHOWN:
        lines.append(f"#{opt.name} = {SHOWN[opt.name]}   # default: none")
    elif opt.default is None:
        example = EXAMPLES.get(opt.name, placeholder(opt))
        lines.append(f"#{opt.name} = {toml_value(example)}   # default: unset")
    else:
        lines.append(f"#{opt.name} = {toml_value(opt.default)}")
    return lines


def render() -> str:
    out = [HEADER]
    # tables last: in TOML, keys after a [[table]] header would belong to the table
    for opt in sorted(OPTIONS, key=lambda o: o.kind == "raw"):
        out.append("\n".join(block(opt)) + "\n")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
