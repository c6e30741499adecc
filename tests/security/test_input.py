"""Item 12 of issue 17: bad input reaching the terminal or a traceback.

Real `swarm` CLI processes against a real agent: every bad value is one line naming
the field and exit 2 (never a traceback); control characters in what a task carries
never reach the operator's terminal raw; a request no node of the cluster could ever
run is refused at submit with the reason instead of staying queued forever.
Runs as root or not (the agent runs the test's own user's tasks either way).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from tests.conftest import AgentFactory
from tests.integration.test_cluster import LOOP, all_see, wait_for

RAW = ("\x1b", "\x07", "\x9b", "\x00", "\u202e")  # ESC, BEL, CSI, NUL, bidi override


def _one_line_error(r: subprocess.CompletedProcess[str], field: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swarm: "), r.stderr[-2000:]
    assert field in lines[0], lines[0]
    assert r.stdout == ""


BAD_NUMBERS = [
    (["--mem", "99999999999999999999999999T"], "mem"),
    (["--mem", str(1 << 64)], "mem"),
    (["--reserve-shares", "9" * 40], "reserve_shares"),
    (["--reserve-shares", "-5"], "reserve_shares"),
    (["--cpu", "1e400"], "cpu"),
    (["--cpu", "nan"], "cpu"),
    (["--weight", "1e400"], "weight"),
    (["--weight", "-1"], "weight"),
    (["--expected-runtime", "inf"], "expected_runtime"),
    (["--gpu-core", "10", "--gpu-memory", "99999999999999999999999T"], "gpu memory_bytes"),
]


# where a task may run (issue 21): a submitter's constraint is data the agent evaluates
BAD_WHERE = [
    (["--constraint", "gpu.model~(a+)+$"], "constraint"),
    (["--constraint", "mem>=lots"], "constraint"),
    (["--prefer", "\x1b[2J=x"], "prefer"),
    (["--job", "../../etc"], "job"),
    (["--job", "j", "--spread", "a b"], "spread"),
    (["--spread", "rack"], "--job"),
    (["--data", "/data/../etc/shadow"], "data"),
    (["--constraint", "pool=nowhere"], "pool=nowhere"),  # no member has it
]


def test_huge_or_bad_numbers_are_one_line_naming_the_field(make_agent: AgentFactory) -> None:
    a = make_agent("in1")
    for flags, field in [*BAD_NUMBERS, *BAD_WHERE]:
        _one_line_error(a.cli("submit", *flags, "--", "true"), field)
    with a.client() as c:
        assert c.list(all=True) == []


def _big_stack() -> None:
    # execve's argument space is a quarter of the stack limit: room for > 4 MiB of argv
    resource.setrlimit(resource.RLIMIT_STACK, (256 << 20, 256 << 20))


def test_argv_over_4_mib_is_one_line_not_a_traceback(make_agent: AgentFactory) -> None:
    a = make_agent("in2")
    chunk = "x" * 100_000  # under the kernel's 128 KiB per-argument limit
    argv = [sys.executable, "-m", "swarm", "--socket", str(a.socket), "submit", "--", "echo"]
    argv += [chunk] * 45  # 4.5 MB
    r = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env=a.env,
        preexec_fn=_big_stack,
    )
    _one_line_error(r, "argv")
    # an environment over the agent's frame limit is named too (through the client)
    big_env = [f"--env=V{i}={chunk}" for i in range(45)]
    r = subprocess.run(
        [*argv[:6], *big_env, "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        env=a.env,
        preexec_fn=_big_stack,
    )
    _one_line_error(r, "'env'")
    with a.client() as c:
        assert c.list(all=True) == []  # nothing was submitted


NASTY = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b1m\u202eevil\nfake line\x00"


def test_control_characters_never_reach_the_terminal_raw(make_agent: AgentFactory) -> None:
    a = make_agent("in3")
    sub = a.cli(
        "submit",
        "--name",
        "n" + NASTY[:-1],  # argv/env strings cannot hold NUL; names may only via the API
        "--label",
        "k=" + NASTY[:-1],
        "--",
        "sh",
        "-c",
        "exit 3",
        "a" + NASTY[:-1],
    )
    assert sub.returncode == 0, sub.stderr
    tid = sub.stdout.strip()
    with a.client() as c:
        c.wait(tid, timeout=60)
    outputs = {
        "ps": a.cli("ps", "-a"),
        "status": a.cli("status", tid),
        "explain": a.cli("explain", tid),
        "top": a.cli("top", "--once"),
        "nodes": a.cli("nodes"),
        "wait": a.cli("wait", tid),
    }
    for what, r in outputs.items():
        text = r.stdout + r.stderr
        assert "Traceback" not in text, (what, text)
        for c in RAW:
            assert c not in text, (what, repr(text))
    assert "\\x1b]0;pwned\\x07" in outputs["ps"].stdout  # shown, escaped
    assert "fake line" in outputs["status"].stdout
    assert not any(ln.startswith("fake line") for ln in outputs["status"].stdout.splitlines())
    # JSON output stays JSON: the exact strings come back
    got = json.loads(a.cli("status", "--json", tid).stdout)
    assert got["spec"]["name"] == "n" + NASTY[:-1]
    # an error message echoing a bad value is escaped as well
    bad = a.cli("submit", "--env", "K\x1b[2J=1", "--", "true")
    assert bad.returncode == 2 and "\x1b" not in bad.stderr, repr(bad.stderr)


def test_impossible_requests_are_refused_at_submit_with_the_reason(
    make_agent: AgentFactory,
) -> None:
    a = make_agent("in4")
    cores = os.cpu_count() or 1
    for flags, why in (
        (["--cpu", str(cores * 1000)], f"wants {cores * 1000} cores"),
        (["--mem", "1000P"], "bytes of memory"),
        (["--gpu", "100"], "has no GPUs"),  # test agents see no GPU (--no-nvml)
    ):
        r = a.cli("submit", *flags, "--", "true")
        _one_line_error(r, "could ever run")
        assert why in r.stderr and "in4:" in r.stderr, r.stderr
    with a.client() as c:
        assert c.list(all=True) == []  # nothing queued forever
    ok = a.cli("submit", "--cpu", "0.5", "--", "true")  # possible: accepted
    assert ok.returncode == 0, ok.stderr
    a.cli("cancel", ok.stdout.strip())


def test_a_peer_that_could_run_it_keeps_the_request(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    from tests.integration.test_gpu import gpu_config

    g = make_agent("ig1", *LOOP, "--config", str(gpu_config(short_tmp, "ig1", 1)))
    n = make_agent("in5", *LOOP, "--seeds", f"127.0.0.1:{g.port}")
    wait_for(lambda: all_see([g, n], {"ig1", "in5"}), 60, "two-node cluster")

    def knows_ig1_capacity() -> bool:
        nodes = json.loads(n.cli("nodes", "--json").stdout)
        return any(x["node"] == "ig1" and (x.get("load") or {}).get("gpus") for x in nodes)

    wait_for(knows_ig1_capacity, 30, "ig1's load report at in5")
    # in5 has no GPU, ig1 has one: one whole GPU is possible (it runs there), two are not
    ok = n.cli("submit", "--gpu", "100", "--wait", "--json", "--", "true")
    assert ok.returncode == 0 and json.loads(ok.stdout)["node"] == "ig1", ok
    r = n.cli("submit", "--gpu", "200", "--", "true")
    _one_line_error(r, "could ever run")
    assert "ig1: wants GPU 200%" in r.stderr and "in5: wants GPU 200%" in r.stderr, r.stderr
