"""`swarm ...` commands.

Exit codes: 0 ok, 1 task or operation failed, 2 usage or invalid request,
69 agent unreachable (EX_UNAVAILABLE, with the socket that was tried).
Light to import: the agent (and trio) is loaded only by `swarm agent`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from . import __version__
from .client import AgentUnreachable, Client, ClientError, RequestFailed
from .fmt import fmt_age, fmt_bytes, table_lines, term_safe
from .paths import default_socket_path

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 69

_INVALID_CODES = {
    "invalid",
    "not_allowed",  # a group or priority class this user may not use
    "bad_request",
    "malformed",
    "frame_too_large",
    "version",
    "unknown_op",
    "conflict",
    "unsatisfiable",
}


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def _die(message: str, code: int) -> NoReturn:
    print(f"swarm: {term_safe(message)}", file=sys.stderr)
    raise SystemExit(code)


# ------------------------------------------------------------------ helpers


def _client(args: argparse.Namespace) -> Client:
    path = getattr(args, "socket", None)
    return Client(Path(path) if path else default_socket_path())


def _task_exit(task: dict[str, Any]) -> int:
    """Exit status for --wait / wait: the task's own code, 128+signal if killed."""
    state = task.get("state")
    if state == "succeeded":
        return 0
    sig = task.get("signal")
    if sig is not None:
        return 128 + int(sig)
    code = task.get("exit_code")
    if code is not None:
        return int(code) if 0 <= int(code) <= 255 else 1
    return 1


def _say(line: str) -> None:
    """Print one line of human-readable output made from data: escaped (term_safe)."""
    print(term_safe(line))


def _table(rows: Sequence[Sequence[str]], headers: Sequence[str]) -> str:
    return "\n".join(table_lines(rows, headers))


def _cmd_str(argv: Sequence[str], width: int = 40) -> str:
    s = " ".join(argv)
    return s if len(s) <= width else s[: width - 1] + "…"


def _task_runtime(t: dict[str, Any], now: float) -> float | None:
    if t.get("started_at") is None:
        return None
    end = t.get("finished_at") or now
    return float(end) - float(t["started_at"])


def _parse_env(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for it in items:
        if "=" not in it:
            raise CliError(f"--env expects KEY=VALUE, got {it!r}", EXIT_USAGE)
        k, v = it.split("=", 1)
        env[k] = v
    return env


def _parse_bytes(text: str) -> int:
    from .policy.gpu import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None


# ------------------------------------------------------------------ commands


def _check_socket_group(group: str | None) -> None:
    """A `socket-group` that names no group stops the agent here, at its start.

    Without this the agent started, logged `api.socket_group` and served a socket only
    root could use: every submitter got "permission denied" (stop 42's CI). Checked at
    start rather than in `load_config`, which also reads configs for other hosts (the
    example config names group "swarm", which a build host need not have).
    """
    if not group:
        return
    import grp

    try:
        grp.getgrnam(group)
    except KeyError:
        raise CliError(
            f"config error: socket-group: no group named {group!r:.60} on this host", EXIT_USAGE
        ) from None


def cmd_agent(args: argparse.Namespace) -> int:
    from .config import ConfigError, load_config
    from .options import OPTIONS

    flags: dict[str, Any] = {}
    for opt in OPTIONS:
        if not opt.cli:
            continue
        v = getattr(args, "opt_" + opt.attr, None)
        if v is not None:
            flags[opt.name] = v
    if "socket" not in flags and getattr(args, "socket", None):
        flags["socket"] = args.socket
    try:
        config = load_config(file=Path(args.config) if args.config else None, flags=flags)
    except ConfigError as e:
        raise CliError(f"config error: {e}", EXIT_USAGE) from None
    _check_socket_group(config.socket_group)

    import trio

    from .agent import Agent
    from .runtime.startup import AGENT_UMASK

    os.umask(AGENT_UMASK)  # the journal, logs and state are private (tasks: TASK_UMASK)
    try:
        agent = Agent(config)
    except ConfigError as e:
        raise CliError(f"config error: {e}", EXIT_USAGE) from None
    from .runtime.gctune import tune_gc

    tune_gc()  # a burst's heap growth set off full collections of 0.5 s each
    try:
        trio.run(agent.run)
    except OSError as e:
        raise CliError(f"agent failed to start: {e.strerror or e}", EXIT_FAILED) from None
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        # The agent has stopped: a late SIGTERM (a second `kill`, systemd) during the
        # interpreter's exit must not turn a clean exit into death by signal.
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError(
            "submit: give the command to run after --, e.g. swarm submit -- echo hi", EXIT_USAGE
        )
    env = _parse_env(args.env or [])
    if args.export_env:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")} | env
    elif "PATH" not in env and os.environ.get("PATH"):
        env["PATH"] = os.environ["PATH"]
    extra: dict[str, Any] = {}
    if args.reserve_shares:
        extra["reserve_shares"] = args.reserve_shares
    if args.is_global:
        extra["is_global"] = True
    if args.array:
        extra["array"] = args.array
    if args.after:
        extra["after"] = list(args.after)  # ID[INDEX] kept: the agent checks the index
    if args.at_most_once:
        extra["at_most_once"] = True
    if args.idempotent:
        extra["idempotent"] = True
    if args.gang is not None:
        extra.update(gang=args.gang, gang_mode=args.gang_mode, min_available=args.min_available)
        extra.update(gang_timeout=args.gang_timeout, gang_restart=args.gang_restart or None)
    elif args.gang_mode or args.min_available is not None or args.gang_timeout is not None:
        raise CliError(
            "submit: --gang-mode, --min-available and --gang-timeout need --gang N", EXIT_USAGE
        )
    if args.cpu is not None:
        extra["cpu"] = args.cpu
    if args.mem is not None:
        extra["mem"] = _parse_bytes(args.mem)
    if args.label:
        extra["labels"] = _parse_env(args.label)
    if args.migrate:
        extra["migrate"] = args.migrate
    if args.expected_runtime is not None:
        extra["expected_runtime"] = args.expected_runtime
    if args.priority:
        extra["priority"] = args.priority
    if args.group:
        extra["group"] = args.group
    for flag in ("constraint", "prefer", "data"):
        if getattr(args, flag):
            extra["constraints" if flag == "constraint" else flag] = getattr(args, flag)
    for flag in ("job", "spread", "anti_affinity", "cwd_any", "wait_for_node"):
        if getattr(args, flag):
            extra[flag] = getattr(args, flag)
    gpu = _gpu_request(args)
    if gpu is not None:
        extra["gpu"] = gpu
    with _client(args) as c:
        tid = c.submit(
            command,
            name=args.name,
            env=env,
            cwd=os.path.abspath(args.cwd) if args.cwd else None,
            weight=args.weight,
            no_retry=args.no_retry,
            **extra,
        )
        if not args.wait:
            if args.json:
                print(json.dumps({"id": tid}))
            else:
                print(tid)
            return EXIT_OK
        task = c.wait(tid)
    if args.json:
        print(json.dumps(task))
    else:
        print(tid)
    return _task_exit(task)


def _gpu_request(args: argparse.Namespace) -> dict[str, Any] | None:
    if (
        args.gpu is None
        and args.gpu_core is None
        and args.gpu_memory is None
        and args.gpu_memory_ratio is None
    ):
        return None
    from . import codec
    from .policy import gpu as gpu_policy

    mem = _parse_bytes(args.gpu_memory) if args.gpu_memory is not None else None
    try:
        req = gpu_policy.request_from_flags(args.gpu, args.gpu_core, mem, args.gpu_memory_ratio)
    except gpu_policy.GpuRequestError as e:
        raise CliError(f"invalid GPU request: {e}", EXIT_USAGE) from None
    return None if req is None else codec.gpu_request_to_wire(req)


def cmd_ps(args: argparse.Namespace) -> int:
    with _client(args) as c:
        reply = c.call("list", all=args.all, limit=args.limit, expand=args.expand or None)
    tasks, classes = reply["tasks"], reply.get("classes")
    if args.json:
        print(json.dumps(tasks))
        return EXIT_OK
    now = time.time()
    names = {v: k for k, v in (classes or {}).items()}
    rows = []
    for t in _gangs_grouped(tasks):
        spec = t["spec"]
        if spec.get("array"):  # one line for the array: its elements by state
            counts = ", ".join(f"{n} {k}" for k, n in sorted((t.get("elements") or {}).items()))
            spec = {
                **spec,
                "name": f"{spec.get('name') or '-'} [array {spec['array']}: {counts or '-'}]",
            }
        prio = spec.get("priority", 50)
        code = "-"
        if t.get("signal") is not None:
            code = f"sig{t['signal']}"
        elif t.get("exit_code") is not None:
            code = str(t["exit_code"])
        rows.append(
            [
                t["spec"]["id"],
                _ps_name(spec),
                t["state"],
                t.get("node") or "-",
                names.get(prio, str(prio)),
                spec.get("group") or "-",
                code,
                fmt_age(_task_runtime(t, now)),
                fmt_age(now - float(t.get("created_at") or now)),
                _cmd_str(spec["argv"]),
            ]
        )
    head = ["ID", "NAME", "STATE", "NODE", "PRIO", "GROUP", "EXIT", "RUNTIME", "AGE", "COMMAND"]
    print(_table(rows, head))
    return EXIT_OK


def task_ref(text: str) -> str:
    """A task id as typed: `ID[INDEX]` names an array's element (its id is ID_INDEX,
    with ID's owner part, if any, after it)."""
    if text.endswith("]") and "[" in text:
        base, _, index = text[:-1].partition("[")
        if index.isdigit():
            head, sep, owner = base.partition("~")
            return f"{head}_{int(index)}{sep}{owner}"
    return text


def _gangs_grouped(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each gang's members (those kept here) right after the gang's own line."""
    members: dict[str, list[dict[str, Any]]] = {}
    ids = {t["spec"]["id"] for t in tasks}
    for t in tasks:
        gang = (t["spec"].get("member") or {}).get("gang")
        if isinstance(gang, str) and gang in ids:
            members.setdefault(gang, []).append(t)
    out = []
    for t in tasks:
        if (t["spec"].get("member") or {}).get("gang") in ids:
            continue
        out.append(t)
        out += sorted(members.get(t["spec"]["id"], []), key=lambda x: x["spec"]["member"]["rank"])
    return out


def _ps_name(spec: dict[str, Any]) -> str:
    """The name, with a gang's size or a member's rank (issue 22)."""
    name = spec.get("name") or "-"
    if spec.get("gang"):
        g = spec["gang"]
        return f"{name} [gang of {g['size']}, {g.get('mode', 'strict')}]"
    if spec.get("member"):
        r = spec["member"]
        return f"{name} [rank {r['rank']}/{r['world']} of {r['gang']}]"
    if spec.get("element"):
        return f"{name} [{spec['element']['index']} of {spec['element']['array']}]"
    return str(name)


def cmd_share(args: argparse.Namespace) -> int:
    with _client(args) as c:
        r = c.call("share")
    if args.json:
        print(json.dumps(r))
        return EXIT_OK
    rows = [
        [
            str(p["rank"]),
            p["kind"],
            p["principal"],
            f"{p['dominant_share']:.3g}",
            f"{p['weight']:g}",
            f"{p['slot_seconds']:.0f}",
            f"{p['cpu_seconds']:.0f}",
            f"{p['gpu_seconds']:.0f}",
        ]
        for p in r["principals"]
    ]
    print(_table(rows, ["RANK", "KIND", "WHO", "SHARE", "WEIGHT", "SLOT-S", "CPU-S", "GPU-S"]))
    _say(
        f"usage decays with a half-life of {fmt_age(float(r['half_life']))}; from"
        f" {r['nodes']} nodes' reports, the oldest {float(r['view_age']):.1f}s old"
    )
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as c:
        r = c.call("status", id=args.id)
    t = r["task"]
    migrations = r.get("migrations") or []
    note = r.get("note")
    if args.json:
        print(json.dumps({**t, "migrations": migrations, **({"note": note} if note else {})}))
        return EXIT_OK
    print(format_status(t, migrations))
    if t["spec"].get("array"):
        counts = ", ".join(f"{n} {k}" for k, n in sorted((r.get("elements") or {}).items()))
        print(f"array:     {t['spec']['array']}: {counts or 'ended (see its state)'}")
    if note:
        _say(f"note: {note}")
    return EXIT_OK


def format_migration(mg: dict[str, Any]) -> str:
    """One migration on one line: when, where, how it went, what it cost."""
    at = time.strftime("%H:%M:%S", time.localtime(float(mg.get("started_at") or 0)))
    parts = [
        f"{at}  {mg.get('from', '?')} -> {mg.get('to', '?')}",
        str(mg.get("mode", "?")),
        str(mg.get("outcome", "in progress")),
    ]
    if mg.get("detail") and mg.get("outcome") != "moved":
        parts.append(f"({mg['detail']})")
    if mg.get("pause_s") is not None:
        parts.append(f"pause {float(mg['pause_s']):.3f}s")
    if mg.get("bytes") is not None and mg.get("transfer_s") is not None:
        secs = float(mg["transfer_s"])
        rate = f", {fmt_bytes(float(mg['bytes']) / secs)}/s" if secs > 0 else ""
        parts.append(f"state {fmt_bytes(float(mg['bytes']))} in {secs:.3f}s{rate}")
    if mg.get("reason"):
        parts.append(f"why: {mg['reason']}")
    return term_safe("  ".join(parts))


def format_status(t: dict[str, Any], migrations: list[dict[str, Any]] | None = None) -> str:
    spec = t["spec"]
    now = time.time()
    lines = [
        f"id:        {spec['id']}",
        f"name:      {spec.get('name') or '-'}",
        f"state:     {t['state']}" + (f" ({t['reason']})" if t.get("reason") else ""),
        f"node:      {t.get('node') or '-'}   home: {spec.get('home') or '-'}",
        f"command:   {' '.join(spec['argv'])}",
        f"user:      {spec.get('user') or spec.get('uid')}",
        f"weight:    {spec.get('weight')}   attempts: {t.get('attempts')}",
    ]
    where = _where_lines(spec)
    lines += where
    if t.get("exit_code") is not None or t.get("signal") is not None:
        lines.append(f"exit:      code={t.get('exit_code')} signal={t.get('signal')}")
    lines.append(f"runtime:   {fmt_age(_task_runtime(t, now))}")
    lines.append("history:")
    for h in t.get("history", []):
        at = (
            time.strftime("%H:%M:%S", time.localtime(h["at"])) + f".{int((h['at'] % 1) * 1000):03d}"
        )
        lines.append(
            f"  {at}  {h.get('src') or '-':>12} -> {h['dst']:<12} "
            f"{h.get('node') or ''}  {h['cause']}"
        )
    if migrations:
        lines.append("migrations:")
        lines += ["  " + format_migration(mg) for mg in migrations]
    return "\n".join(term_safe(ln) for ln in lines)  # each line from data, escaped


def _where_lines(spec: dict[str, Any]) -> list[str]:
    """The task's own labels and where it may run, for `swarm status` (none: no line)."""
    out = []
    if spec.get("labels"):
        out.append("labels:    " + " ".join(f"{k}={v}" for k, v in spec["labels"].items()))
    for key, name in (("constraints", "needs"), ("prefer", "prefers"), ("data", "data")):
        if spec.get(key):
            out.append(f"{name + ':':<11}" + "  ".join(spec[key]))
    if spec.get("job"):
        extra = [f"spread over {spec['spread']}"] if spec.get("spread") else []
        if spec.get("anti_affinity"):
            extra.append(f"at most {spec['anti_affinity']} a node")
        out.append(f"job:       {spec['job']}" + (f" ({', '.join(extra)})" if extra else ""))
    if spec.get("cwd"):
        out.append(
            f"cwd:       {spec['cwd']}"
            + (" (or $HOME where missing)" if spec.get("cwd_any") else "")
        )
    return out


def cmd_logs(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    with _client(args) as c:
        for chunk in c.logs(args.id, stderr=args.stderr, follow=args.follow):
            out.write(chunk)
            out.flush()
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as c:
        for tid in args.ids:
            try:
                r = c.cancel(tid)
                print(term_safe(f"{tid} {r['task']['state']}"))
            except RequestFailed as e:
                if e.code == "finished":
                    print(f"swarm: {term_safe(e.message)}", file=sys.stderr)
                    return EXIT_FAILED
                raise
    return EXIT_OK


def cmd_wait(args: argparse.Namespace) -> int:
    with _client(args) as c:
        worst = 0
        for tid in args.ids:
            r = c.call("wait", id=tid, timeout=args.timeout)
            if r.get("timed_out"):
                msg = f"timed out waiting for {tid} ({r['task']['state']})"
                print(f"swarm: {term_safe(msg)}", file=sys.stderr)
                return EXIT_FAILED
            code = _task_exit(r["task"])
            if args.json:
                print(json.dumps(r["task"]))
            worst = worst or code
    return worst


def cmd_nodes(args: argparse.Namespace) -> int:
    with _client(args) as c:
        nodes = c.call("nodes")["nodes"]
    if args.json:
        print(json.dumps(nodes))
        return EXIT_OK
    if args.labels:
        for n in nodes:
            ld = n.get("load") or {}
            pairs = " ".join(f"{k}={v}" for k, v in ld.get("labels") or [])
            data = " data" if ld.get("data") else ""
            print(f"{n['node']}{' *' if n.get('self') else ''}: {pairs or '-'}{data}")
        return EXIT_OK
    rows = []
    for n in nodes:
        ld = n.get("load") or {}
        shares = ld.get("shares")
        load = "-"
        if ld:
            cap = (ld.get("shares") or 0) - (ld.get("reserved_shares") or 0)
            load = f"{1024 * ld['weight_sum'] / cap:.2f}" if cap > 0 else "drained"
        gpus = ld.get("gpus") or []
        rows.append(
            [
                n["node"] + (" *" if n.get("self") else ""),
                f"{n['addr']}:{n['port']}",
                n["state"],
                str(n["incarnation"]),
                "-" if shares is None else str(shares),
                load,
                "-" if not ld else f"{ld.get('running', 0)}/{ld.get('slots', 0)}",
                "-" if not ld else str(ld.get("queued", 0)),
                "-" if not ld else f"{100 * ld.get('cpu_util', 0):.0f}%",
                "-" if not ld else fmt_bytes(ld.get("mem_available", 0)),
                "-" if not gpus else f"{sum(g[1] for g in gpus)}/{100 * len(gpus)}%",
                "-" if not ld else ld.get("isolation", "none"),
                "-" if not ld else ("yes" if ld.get("criu") else "no"),
                "-" if n.get("load_age") is None else fmt_age(n["load_age"]),
            ]
        )
    headers = [
        "NODE",
        "ADDRESS",
        "STATE",
        "INC",
        "SHARES",
        "LOAD",
        "RUN",
        "QUEUE",
        "CPU",
        "MEM FREE",
        "GPU FREE",
        "ISOLATION",
        "CRIU",
        "REPORT AGE",
    ]
    print(_table(rows, headers))
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    with _client(args) as c:
        r = c.call("explain", id=args.id)
    if args.json:
        print(json.dumps(r))
        return EXIT_OK
    t = r["task"]
    _say(f"{t['spec']['id']}: {t['state']} on {t.get('node') or '-'}")
    if not r["decisions"]:
        _say("  no placement decisions recorded here")
    for d in r["decisions"]:
        at = time.strftime("%H:%M:%S", time.localtime(d.get("at", 0)))
        where = f" [{d['node']}]" if d.get("node") else ""
        _say(f"- {at}{where} {d.get('outcome', '')}")
        if d.get("summary"):
            _say(f"    {d['summary']}")
        fig = d.get("figures")
        if d.get("kind") == "migration" and isinstance(fig, dict):
            _say(
                f"    from {d.get('from')} to {d.get('target') or '-'}: remaining "
                f"{fig.get('remaining')}s, slowdown {fig.get('slowdown_here')} here vs "
                f"{fig.get('slowdown_there')} there, transfer {fig.get('transfer')}s at "
                f"{fmt_bytes(float(fig.get('bandwidth') or 0))}/s, lost work "
                f"{fig.get('lost_work')}s: gain {d.get('gain')}s vs margin {d.get('margin')} "
                f"x cost {d.get('cost')}s"
            )
        for cand in d.get("candidates", []):
            score = cand.get("score")
            why = cand.get("why_not") or ""
            age = cand.get("age")
            _say(
                f"    {cand['node']:<16} load {cand.get('load')!s:<10} "
                f"age {'-' if age is None else f'{float(age):.1f}s':<7} "
                f"score {'-' if score is None else score!s:<12} {why}"
            )
    return EXIT_OK


def cmd_shares(args: argparse.Namespace) -> int:
    with _client(args) as c:
        r = c.call("shares", shares=args.shares)
    state = " (draining)" if r["draining"] else ""
    print(f"shares {r['shares']}{state}")
    return EXIT_OK


def _ago(sec: float | None) -> str:
    return "-" if sec is None else f"{sec:.0f}s ago"


def cmd_scale(args: argparse.Namespace) -> int:
    """`swarm scale status`: each elastic pool as the local agent sees it."""
    with _client(args) as c:
        r = c.call("scale")
    if args.json:
        print(json.dumps(r))
        return EXIT_OK
    if not r["pools"]:
        print("no elastic pools configured ([scale.NAME] in agent.toml)")
        return EXIT_OK
    for p in r["pools"]:
        sel = " ".join(p["selector"]) or "every node"
        print(
            f"pool {p['pool']} ({sel}; {p['min_nodes']}-{p['max_nodes']} nodes,"
            f" max-step {p['max_step']})"
        )
        who = "this node acts" if p["acting"] else f"actor: {p['owner'] or '-'}"
        print(f"  seat: {who} (epoch {p['epoch']}): {p['seat']}")
        d = p["decision"]
        if d is not None:
            act = d["action"] + (f" {d['count']}" if d["count"] else "")
            seen = p.get("view_ago")  # (an agent before stop 45 does not say)
            when = "" if seen is None else f" (view taken {_ago(seen)})"
            print(f"  decision{when}: {act} -> {d['desired']}: {d['reason']}")
        last = p["last_action"]
        if last is not None:
            print(f"  last action: {last['action']} {last['count']} ({_ago(last['ago'])})")
        pend = p["pending"]
        if pend is not None:
            state = "running" if pend["running"] else f"retry in {pend['retry_in']:.0f}s"
            nodes = " ".join(pend["nodes"])
            print(
                f"  hook: {pend['action']} {pend['count']} {nodes}"
                f" attempt {pend['attempt']} {state}"
            )
        for v in p["draining"]:
            shown = "drained" if v["drained"] else "drain asked"
            print(f"  draining {v['node']}: {shown} {v['for']:.0f}s, {v['tasks']} tasks left")
        if p["booting"]:
            print(f"  booting: {p['booting']}")
        for h in p["hooks"]:
            res = "ok" if h["ok"] else h["error"]
            nodes = "".join(f" {n}" for n in h["nodes"])
            print(
                f"  hook {h['action']} {h['count']}{nodes} (attempt {h['attempt']},"
                f" {h['duration']:.1f}s, {_ago(h['ago'])}): {res}"
            )
            for line in h["output"].splitlines()[-5:]:
                print(f"    | {line}")
        for n in p["notes"]:
            print(f"  note: {n}")
    return EXIT_OK


def cmd_drain(args: argparse.Namespace) -> int:
    with _client(args) as c:
        r = c.call("shares", drain=True)
    print(f"drained (shares {r['shares']}); running tasks finish, no new work starts here")
    return EXIT_OK


def cmd_undrain(args: argparse.Namespace) -> int:
    with _client(args) as c:
        r = c.call("shares", undrain=True, shares=args.shares)
    print(f"undrained (shares {r['shares']})")
    return EXIT_OK


def cmd_keygen(args: argparse.Namespace) -> int:
    import stat

    from .crypto import keygen_file_text

    text = keygen_file_text()
    if args.output is None:
        # `swarm keygen > FILE`: the shell made FILE with its umask (often 0644)
        try:
            if stat.S_ISREG(os.fstat(sys.stdout.fileno()).st_mode):
                os.fchmod(sys.stdout.fileno(), 0o600)
        except (OSError, ValueError):
            pass  # not a file we may change (or no descriptor): leave it be
        sys.stdout.write(text)
        return EXIT_OK
    path = Path(args.output)
    try:
        write_private_file(path, text.encode(), replace=args.force)
    except FileExistsError:
        raise CliError(
            f"keygen: {path} exists; not replacing a key (add --force to replace it)",
            EXIT_FAILED,
        ) from None
    except OSError as e:
        raise CliError(f"keygen: cannot write {path}: {e.strerror or e}", EXIT_FAILED) from None
    print(f"wrote a new cluster key to {path} (mode 0600); copy it to every node", file=sys.stderr)
    return EXIT_OK


def write_private_file(path: Path, data: bytes, *, replace: bool = False) -> None:
    """Write `data` to a new file of mode 0600 (O_CREAT|O_EXCL, never through a
    symlink), synced. With `replace`, an existing file is replaced atomically (a new
    file renamed over it), so its old mode does not carry over."""
    target = path
    if replace:
        path = path.with_name(f".{path.name}.{os.getpid()}.new")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(path, target)
    except BaseException:
        if replace:
            path.unlink(missing_ok=True)
        else:
            target.unlink(missing_ok=True)
        raise
    dfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def cmd_info(args: argparse.Namespace) -> int:
    with _client(args) as c:
        info = c.info()
    print(json.dumps(info, indent=2))
    wedged = info.get("journal_wedged")
    if isinstance(wedged, dict):
        since = wedged.get("since")
        age = time.time() - since if isinstance(since, (int, float)) else None
        print(
            f"swarm: journal wedged for {fmt_age(age)} ({wedged.get('failures')} failed"
            f" writes): {term_safe(wedged.get('error'))}; submissions are refused until it"
            " can write again",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_top(args: argparse.Namespace) -> int:
    from .top import fetcher, run

    path = getattr(args, "socket", None)
    if args.interval <= 0:
        raise CliError("top: --interval must be > 0", EXIT_USAGE)
    return run(
        fetcher(Path(path) if path else default_socket_path()),
        once=args.once,
        interval=args.interval,
    )


def cmd_sim(args: argparse.Namespace) -> int:
    from .sim.cmd import run_command  # the simulator (and matplotlib) load only here

    return run_command(
        args.experiment,
        nodes=args.nodes,
        seed=args.seed,
        tasks=args.tasks,
        out=args.out,
        doc=args.doc,
        quick=args.quick,
    )


# ------------------------------------------------------------------ parser


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line naming the argument (exit 2), not the whole usage."""

    def error(self, message: str) -> NoReturn:
        text = term_safe(f"{self.prog}: {message} (see {self.prog} --help)")
        if len(text) > 300:
            text = text[:299] + "…"
        print(text, file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--socket",
        default=argparse.SUPPRESS,
        help="agent socket (env SWARM_SOCKET; default per user)",
    )
    p = _Parser(prog="swarm", description="decentralized load-sharing agent", parents=[common])
    p.add_argument("--version", action="version", version=f"swarm {__version__}")
    sub = p.add_subparsers(dest="command_name", metavar="COMMAND")
    sub.required = True

    def add(
        name: str, fn: Callable[[argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help, parents=[common])
        sp.set_defaults(fn=fn)
        return sp

    a = add("agent", cmd_agent, "run the agent (one per host)")
    a.add_argument("--config", help="TOML config file (env SWARM_CONFIG)")
    from .options import OPTIONS

    for opt in OPTIONS:
        if not opt.cli or opt.name == "socket":
            continue
        flag = "--" + opt.name
        dest = "opt_" + opt.attr
        text = opt.help.replace("%", "%%")  # argparse %-formats help strings
        if opt.kind == "bool":
            a.add_argument(
                flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=text
            )
        else:
            a.add_argument(flag, dest=dest, default=None, metavar=opt.kind.upper(), help=text)
    a.set_defaults(opt_socket=None)

    s = add("submit", cmd_submit, "submit a command; prints the task id")
    s.add_argument("--name", help="a name for the task")
    s.add_argument("--weight", type=float, help="task weight for the load index (default 1.0)")
    s.add_argument(
        "--env", action="append", metavar="K=V", help="environment variable (repeatable)"
    )
    s.add_argument(
        "--export-env", action="store_true", help="pass this whole environment to the task"
    )
    s.add_argument("--cwd", help="working directory (default: the current one)")
    s.add_argument(
        "--no-retry", action="store_true", help="never run twice: fail/lose instead of re-running"
    )
    s.add_argument(
        "--after",
        action="append",
        metavar="COND:ID[,ID]",
        help="start only once these ended: ok (all succeeded), any, notok (none"
        " succeeded); an ID may be an array (all its elements) or ID[INDEX]; repeatable",
    )
    s.add_argument(
        "--array",
        metavar="SPEC",
        help="an array: one element per index (0-99, 1,5,7-9, 0-99:2; %%K: at most K at"
        " once), each with SWARM_ARRAY_INDEX and {index} replaced in the command",
    )
    s.add_argument(
        "--gang",
        type=int,
        metavar="N",
        help="N members of the command that start together, all or none (docs/gang.md);"
        " each gets SWARM_RANK, SWARM_WORLD_SIZE, MASTER_ADDR and MASTER_PORT",
    )
    s.add_argument(
        "--gang-mode",
        choices=("strict", "nonstrict"),
        help="strict (default): all N or none; nonstrict: start and run with --min-available",
    )
    s.add_argument("--min-available", type=int, metavar="M", help="nonstrict gangs: at least M")
    s.add_argument(
        "--gang-timeout", type=float, metavar="S", help="fail the gang if not running after S"
    )
    s.add_argument(
        "--gang-restart",
        action="store_true",
        help="a gang whose member fails starts again as a whole (default: it fails)",
    )
    s.add_argument(
        "--at-most-once",
        action="store_true",
        help="never two copies running at once: a runner cut off from the task's home"
        " stops it when its lease lapses (docs/handoff.md)",
    )
    s.add_argument(
        "--idempotent",
        action="store_true",
        help="it may run twice: a run far past its class's usual runtime gets a backup copy"
        " on another node, and the first to finish wins (docs/policy.md)",
    )
    s.add_argument(
        "--reserve-shares", type=int, default=0, metavar="N", help="shares reserved while it runs"
    )
    s.add_argument("--global", dest="is_global", action="store_true", help="run once on every node")
    s.add_argument("--cpu", type=float, help="CPU request in cores")
    s.add_argument("--mem", help="memory request, e.g. 512M, 2GiB")
    s.add_argument("--gpu", type=int, help="GPU percent of one device, or a multiple of 100")
    s.add_argument(
        "--gpu-core", type=int, help="GPU core percent (with --gpu-memory or --gpu-memory-ratio)"
    )
    s.add_argument("--gpu-memory", help="GPU memory, e.g. 8GiB")
    s.add_argument("--gpu-memory-ratio", type=int, help="GPU memory percent of one device")
    s.add_argument(
        "--label",
        action="append",
        metavar="K=V",
        help="the task's own label, shown by swarm status (repeatable; where it runs is"
        " --constraint's business)",
    )
    wh = s.add_argument_group("where it runs (node labels: swarm nodes)")
    wh.add_argument(
        "--constraint",
        action="append",
        metavar="EXPR",
        help="hard: only nodes whose labels satisfy EXPR, e.g. arch=x86_64,"
        " 'gpu.model~H100|H200', 'mem>=64G', 'rack in r1,r2', '!gpu.count' (repeatable)",
    )
    wh.add_argument(
        "--prefer", action="append", metavar="EXPR", help="soft: favour such nodes (repeatable)"
    )
    wh.add_argument(
        "--job", metavar="NAME", help="the job this task belongs to (spread, anti-affinity)"
    )
    wh.add_argument(
        "--spread", metavar="LABEL", help="spread the job's tasks evenly over LABEL's values"
    )
    wh.add_argument(
        "--anti-affinity", type=int, metavar="K", help="at most K of the job's tasks per node"
    )
    wh.add_argument(
        "--data",
        action="append",
        metavar="KEY",
        help="a data set it reads (name or path): nodes holding it are tried first (repeatable)",
    )
    wh.add_argument(
        "--cwd-any",
        action="store_true",
        help="run even where the working directory does not exist (in $HOME there)",
    )
    wh.add_argument(
        "--wait-for-node",
        action="store_true",
        help="accept it even if no node satisfies its constraints yet",
    )
    s.add_argument(
        "--migrate", choices=["never", "checkpoint", "restart", "criu"], help="migration mode"
    )
    s.add_argument("--expected-runtime", type=float, metavar="SECONDS", help="expected run time")
    s.add_argument(
        "--priority",
        metavar="CLASS",
        help="priority class (default classes: low, normal, high, system; higher runs first"
        " and may preempt lower)",
    )
    s.add_argument("--group", metavar="NAME", help="accounting group (default: your primary group)")
    s.add_argument("--wait", action="store_true", help="wait and exit with the task's exit code")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")

    ps = add("ps", cmd_ps, "list tasks")
    ps.add_argument("--all", "-a", action="store_true", help="include finished tasks")
    ps.add_argument("--limit", type=int, default=None, help="at most this many tasks")
    ps.add_argument("--json", action="store_true")
    ps.add_argument("--expand", action="store_true", help="list each array element too")

    sh_ = add("share", cmd_share, "fair share: each user's and group's usage, share and rank")
    sh_.add_argument("--json", action="store_true")

    st = add("status", cmd_status, "show one task")
    st.add_argument("id", type=task_ref)
    st.add_argument("--json", action="store_true")

    lg = add("logs", cmd_logs, "print a task's output")
    lg.add_argument("id", type=task_ref)
    lg.add_argument("-f", "--follow", action="store_true", help="follow until the task ends")
    lg.add_argument("--stderr", action="store_true", help="stderr instead of stdout")

    cn = add("cancel", cmd_cancel, "cancel tasks (kills the whole process tree)")
    cn.add_argument("ids", nargs="+", metavar="ID", type=task_ref)

    w = add("wait", cmd_wait, "wait for tasks; exit with the first failing task's code")
    w.add_argument("ids", nargs="+", metavar="ID", type=task_ref)
    w.add_argument("--timeout", type=float, help="give up after SECONDS (exit 1)")
    w.add_argument("--json", action="store_true")

    nd = add("nodes", cmd_nodes, "list cluster members with their load")
    nd.add_argument("--json", action="store_true")
    nd.add_argument(
        "--labels", "-l", action="store_true", help="each node's labels (what --constraint tests)"
    )

    ex = add("explain", cmd_explain, "why a task went where it went")
    ex.add_argument("id", type=task_ref)
    ex.add_argument("--json", action="store_true")

    sh = add("shares", cmd_shares, "show or set this node's shares (0 = drain)")
    sh.add_argument("shares", nargs="?", type=int, help="new share count")

    sc = add("scale", cmd_scale, "elastic pools: the actor, its decision, drains and hooks")
    sc.add_argument("what", choices=["status"], help="status: each pool as this agent sees it")
    sc.add_argument("--json", action="store_true")

    add("drain", cmd_drain, "stop new work on this node (shares 0)")
    ud = add("undrain", cmd_undrain, "accept work again (the shares it had before drain)")
    ud.add_argument("--shares", type=int, help="set these shares instead")

    kg = add(
        "keygen",
        cmd_keygen,
        "make a new cluster key file (first key encrypts, all decrypt): -o FILE, or stdout",
    )
    kg.add_argument("-o", "--output", metavar="FILE", help="write it to FILE, mode 0600")
    kg.add_argument("--force", action="store_true", help="replace FILE if it exists")

    add("info", cmd_info, "show the local agent's status")

    tp = add("top", cmd_top, "live view of the nodes and recent tasks (q quits)")
    tp.add_argument("--once", action="store_true", help="print one frame and exit")
    tp.add_argument("--interval", type=float, default=1.0, help="seconds between frames")

    sm = add(
        "sim",
        cmd_sim,
        "run a simulator experiment: balls, staleness, load, transfer, shares, flex, fairness,"
        " constraints, locality, elastic, gang or all",
    )
    sm.add_argument("experiment", metavar="NAME")
    sm.add_argument("--nodes", type=int, help="cluster size (each experiment has a default)")
    sm.add_argument("--seed", type=int, default=1)
    sm.add_argument("--tasks", type=int, help="tasks per run (each experiment has a default)")
    sm.add_argument("--out", default="sim-out", help="directory for CSV, PNG and markdown")
    sm.add_argument("--doc", help="with 'all': also write this markdown page")
    sm.add_argument(
        "--quick",
        action="store_true",
        help="the small sizes of the reproducibility test: write only the CSVs"
        " (make experiments keeps them in docs/experiments/quick)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except CliError as e:
        print(f"swarm: {term_safe(e)}", file=sys.stderr)
        return e.code
    except AgentUnreachable as e:
        print(f"swarm: {term_safe(e)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except RequestFailed as e:
        print(f"swarm: {term_safe(e.message)}", file=sys.stderr)
        return EXIT_USAGE if e.code in _INVALID_CODES else EXIT_FAILED
    except ClientError as e:
        print(f"swarm: {term_safe(e)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
