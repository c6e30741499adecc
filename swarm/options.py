"""The agent's options, declared once: name, kind, default, help, check.

Kept free of heavy imports so the CLI can build `swarm agent --help` quickly; the
loader (swarm.config), the environment mapping and the example config derive from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple


class Option(NamedTuple):
    name: str
    kind: str  # "int" | "float" | "str" | "bool" | "path" | "list" | "raw"
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None  # returns an error message or None
    cli: bool = True  # exposed as --name on `swarm agent`

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return "SWARM_" + self.name.replace("-", "_").upper()


def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be greater than 0"


def _non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be 0 or more"


def _port(v: Any) -> str | None:
    return None if 0 <= v <= 65535 else "must be a port number 0-65535"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    return check


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: Any) -> float:
    """Seconds in "90", "30s", "15m", "12h", "7d" or "2w"; raises ValueError."""
    t = str(text).strip().lower()
    scale = _DURATION_UNITS.get(t[-1:])
    number = t[:-1] if scale is not None else t
    value = float(number) * (scale or 1.0)
    if not value >= 0 or value == float("inf"):
        raise ValueError(text)
    return value


def _duration(v: Any) -> str | None:
    try:
        parse_duration(v)
    except ValueError:
        return "must be a duration like 30s, 15m, 12h, 7d or 2w (0 = forever)"
    return None


def _fraction(v: Any) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be between 0 and 1"


OPTIONS: tuple[Option, ...] = (
    Option("node-id", "str", None, "this node's name in the cluster (default: hostname)"),
    Option("cluster", "str", "swarm", "cluster name; nodes of other clusters are never admitted"),
    Option("state-dir", "path", None, "journal, logs and snapshots (default per user)"),
    Option("socket", "path", None, "local submit socket (default per user)"),
    Option("socket-group", "str", None, "group owning the submit socket (mode 0660)"),
    Option("slots", "int", None, "tasks run at once on this node (default: CPUs)", _positive),
    Option(
        "shares",
        "int",
        None,
        "this node's shares (default: 1024 per slot; 0 = drain)",
        _non_negative,
    ),
    Option("kill-grace", "float", 10.0, "seconds between SIGTERM and SIGKILL", _non_negative),
    Option(
        "supervise",
        "bool",
        True,
        "start each task under its own supervisor (swarm-shim): tasks outlive the agent",
    ),
    Option(
        "keep-tasks",
        "str",
        "restart",
        "on stop, leave tasks running for the next run: restart (when systemd restarts"
        " the unit), always, never",
        _one_of("restart", "always", "never"),
    ),
    Option(
        "home-grace",
        "float",
        30.0,
        "seconds a task's home must be SWIM-dead before the node that holds the task"
        " takes its home role over (failover)",
        _positive,
    ),
    Option(
        "fence-ttl",
        "float",
        10.0,
        "seconds an --at-most-once task runs on another node than its home without its"
        " home renewing its lease; then its supervisor stops it (fencing)",
        _positive,
    ),
    Option(
        "replicas",
        "int",
        None,
        "copies of a queued task's record, its home's included: a submission is"
        " acknowledged once they are journaled (default: 2 on clusters of 3 or more,"
        " else 1; 1 = no copy, the lowest latency)",
        _positive,
    ),
    Option(
        "keep-finished",
        "str",
        "7d",
        "how long a finished task's record and log files are kept (0 = forever)",
        _duration,
    ),
    Option("port", "int", 7946, "UDP+TCP port for gossip and transfer (0 = any)", _port),
    Option("bind", "str", "0.0.0.0", "address to bind the cluster port to"),
    Option("advertise", "str", None, "address peers should use to reach this node"),
    Option("seeds", "list", [], "static peers host:port to join (comma-separated)"),
    Option("mdns", "bool", True, "discover peers with zeroconf/mDNS"),
    Option("mdns-interfaces", "list", [], "interfaces (addresses) for mDNS (default all)"),
    Option("keyring", "path", None, "cluster key file (see `swarm keygen`)"),
    Option("insecure", "bool", False, "run without encryption (refused unless set)"),
    Option("profile", "str", "lan", "timing profile: lan or local", _one_of("lan", "local")),
    Option("faults", "str", None, "transport fault shim, e.g. drop=0.2,seed=1 (tests only)"),
    Option("metrics", "str", None, "serve Prometheus metrics on ADDR:PORT"),
    Option("placement-d", "int", 2, "peers sampled per placement (power of d choices)", _positive),
    Option(
        "late-binding",
        "int",
        0,
        "late binding: a task that finds no room at its home waits there while this many"
        " peers hold a reservation; the first with room pulls it (0 = off)",
        _non_negative,
    ),
    Option(
        "backup-budget",
        "float",
        0.05,
        "speculative backups of late --idempotent tasks: their task-seconds at most this"
        " fraction of the finished work's (0 = no backups)",
        _fraction,
    ),
    Option(
        "backup-history",
        "int",
        20,
        "runs of a class (array, --name or program) that must have ended before one of"
        " its runs can count as late and get a backup",
        _positive,
    ),
    Option(
        "placement",
        "str",
        "two-choice",
        "placement rule: two-choice (power of d) or random (a baseline for benchmarks)",
        _one_of("two-choice", "random"),
    ),
    Option("allow-root-tasks", "bool", False, "let root submit tasks that run as root"),
    Option(
        "isolation",
        "str",
        "auto",
        "task cgroups: auto (delegated cgroup2, else cgroup1, else none), cgroup2, cgroup1, none",
        _one_of("auto", "cgroup2", "cgroup1", "none"),
    ),
    Option("log-format", "str", "logfmt", "stderr log format", _one_of("logfmt", "json")),
    Option("log-level", "str", "info", "log level", _one_of("debug", "info", "warning", "error")),
    Option("join-wait", "float", 5.0, "seconds to wait for peers before READY", _non_negative),
    Option("report-interval", "float", 1.0, "seconds between local load samples", _positive),
    Option("qos-psi-target", "float", 50.0, "PSI some avg10 (%) above which QoS is violated"),
    Option(
        "migration", "str", "on", "migration: on, off or dry-run", _one_of("on", "off", "dry-run")
    ),
    Option("checkpoint-signal", "str", "SIGUSR1", "signal asking a task to checkpoint"),
    Option("checkpoint-exit-code", "int", 85, "exit code meaning 'checkpointed, move me'"),
    Option("checkpoint-timeout", "float", 30.0, "seconds a task has to checkpoint", _positive),
    Option(
        "bandwidth", "float", 100e6, "default bytes/s between nodes for migration costs", _positive
    ),
    Option("gpu-policy", "str", "binpack", "GPU slice placement", _one_of("binpack", "spread")),
    Option("mps", "bool", False, "an MPS control daemon runs: set MPS limits for tasks"),
    Option("nvml", "bool", True, "find GPUs through NVML when none are declared"),
    Option(
        "gpus", "raw", [], "declared GPU devices (list of tables) for hosts without NVML", cli=False
    ),
    Option("transfer", "bool", True, "move queued tasks between nodes (sender/receiver)"),
    # sharing a fleet (issue 20; swarm/policy/sharing.py)
    Option(
        "priorities",
        "raw",
        {},
        "priority classes: a table of name = value (default low 10, normal 50, high 100,"
        " system 1000)",
        cli=False,
    ),
    Option("default-priority", "str", "normal", "the class of a task that names none"),
    Option("groups", "raw", {}, "accounting groups: [groups.NAME] tables", cli=False),
    Option(
        "scale",
        "raw",
        {},
        "elastic pools: [scale.NAME] tables (the same on every agent; docs/operations.md)",
        cli=False,
    ),
    Option("preempt", "bool", True, "stop lower-class work when a higher class cannot start"),
    Option(
        "preempt-min-gap", "int", 1, "a task preempts only classes this far below it", _positive
    ),
    Option(
        "preempt-per-minute", "int", 30, "at most this many preemptions a minute", _non_negative
    ),
    Option(
        "fair-share-half-life",
        "str",
        "1d",
        "how fast past usage is forgotten by fair share (a duration)",
        _duration,
    ),
    Option(
        "quota-floor",
        "float",
        0.0,
        "slots a node may always start for a capped group it has demand for (each such"
        " node may then overshoot the cap by this much)",
        _non_negative,
    ),
    # where tasks run (issue 21; swarm/policy/constraints.py)
    Option(
        "labels",
        "list",
        [],
        "this node's labels KEY=VALUE (comma-separated; in agent.toml a table,"
        ' labels = { rack = "r1" }); added to the facts the agent discovers',
    ),
    Option("data-keys", "list", [], "data sets this node holds, by name or path (--data)"),
    Option(
        "data-dirs",
        "list",
        [],
        "directories whose entries are data sets held here (name and path of each)",
    ),
    Option(
        "data-delay",
        "float",
        3.0,
        "seconds a task that reads data waits for a slot on a node holding it",
        _non_negative,
    ),
    Option(
        "report-max-age",
        "float",
        None,
        "seconds: older peer load reports are not placement candidates"
        " (default: 3 load refresh intervals, 15 s on lan)",
        _positive,
    ),
    Option(
        "quota-lag",
        "float",
        2.0,
        "seconds: a node splits a capped group's quota on its own queued demand as it was"
        " this long ago (as the others see it: about one gossip dissemination)",
        _non_negative,
    ),
)

OPTIONS_BY_NAME: Mapping[str, Option] = {o.name: o for o in OPTIONS}
