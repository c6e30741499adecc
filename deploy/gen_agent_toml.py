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
    "advertise": "10.0.0.5",
    "keyring": "/etc/swarm/keyring",
    "faults": "drop=0.1,seed=1",
    "metrics": "127.0.0.1:9464",
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
    lines = [f"# {opt.help}"]
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
    if opt.default is None:
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
