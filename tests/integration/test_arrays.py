"""Arrays on real agents (issue 23; node/arrays.py): three loopback agents. An array
with a cap never has more than K elements running at once (from the elements' own
timed marks), replaces {index} in argv, and its wait exits with the worst element's
code; an element is named ID[INDEX]; a whole array is cancelled mid-run; `swarm ps`
shows an array as one line with its elements counted by state."""

from __future__ import annotations

import time
from pathlib import Path

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.integration.test_cluster import all_see, wait_for

LOOP = ["--bind", "127.0.0.1"]


def _three(make_agent: AgentFactory, slots: int = 4) -> list[LocalAgent]:
    a = make_agent("aa", *LOOP, "--slots", str(slots))
    seed = ["--seeds", f"127.0.0.1:{a.port}"]
    rest = [make_agent(n, *LOOP, *seed, "--slots", str(slots)) for n in ("ab", "ac")]
    agents = [a, *rest]
    wait_for(lambda: all_see(agents, {"aa", "ab", "ac"}), 30, "three agents to see each other")
    return agents


def _overlap(marks: Path) -> tuple[int, int]:
    """(most elements running at once, elements seen) from start/end marks."""
    edges = []
    seen = 0
    for p in marks.iterdir():
        f = p.read_text().split()
        if len(f) >= 2:
            seen += 1
            edges += [(float(f[0]), 1), (float(f[1]), -1)]
    running = peak = 0
    for _, d in sorted(edges):
        running += d
        peak = max(peak, running)
    return peak, seen


def test_an_array_runs_at_most_k_at_once_and_exits_with_its_worst_code(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    a, _b, _c = _three(make_agent)
    marks = short_tmp / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    script = (
        f's=$(date +%s.%N); sleep 0.4; echo "$s $(date +%s.%N) $SWARM_NODE {{index}}"'
        f' > {marks}/$SWARM_ARRAY_INDEX; [ "$1" != 7 ]'
    )
    with a.client() as c:
        aid = c.submit(["sh", "-c", script, "x", "{index}"], cwd="/", array="0-11%3")
    r = a.cli("wait", aid, timeout=120)
    assert r.returncode == 3 or r.returncode == 1, r.stdout + r.stderr
    peak, seen = _overlap(marks)
    print(f"12 elements, cap 3: at most {peak} ran at once")
    assert seen == 12 and peak <= 3
    # {index} in argv: each element wrote its own index
    assert {p.read_text().split()[3] for p in marks.iterdir()} == {str(i) for i in range(12)}
    with a.client() as c:
        rec = c.status(aid)
        seven = c.status(f"{aid}_7")
    assert rec["state"] == "failed" and "1 failed, 11 succeeded" in rec["reason"]
    assert seven["state"] == "failed" and seven["spec"]["element"] == {"array": aid, "index": 7}
    st = a.cli("status", f"{aid}[7]")
    assert st.returncode == 0 and f"{aid}_7" in st.stdout
    lg = a.cli("logs", aid)
    assert lg.returncode == 2 and "is an array: its elements' logs are" in lg.stderr
    # the elements spread over the nodes, as single tasks do
    nodes = {p.read_text().split()[2] for p in marks.iterdir()}
    print("elements ran on", sorted(nodes))


def test_a_whole_array_is_cancelled_mid_run_and_ps_counts_its_elements(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    a, _b, _c = _three(make_agent)
    with a.client() as c:
        aid = c.submit(["sleep", "60"], cwd="/", array="0-99%4")

    def running() -> int:
        with a.client() as c:
            counts = c.call("status", id=aid).get("elements", {})
        return int(counts.get("running", 0))

    wait_for(lambda: running() == 4, 30, "four elements to run")
    ps = a.cli("ps").stdout
    line = next(ln for ln in ps.splitlines() if ln.startswith(aid + " "))
    assert "[array 0-99%4: " in line and "96 pending" in line and "4 running" in line, ps
    assert f"{aid}_0" not in ps  # the elements are counted, not listed
    assert f"{aid}_0" in a.cli("ps", "--expand").stdout
    with a.client() as c:
        c.cancel(aid)
    wait_for(lambda: a.client().status(aid)["state"] == "cancelled", 30, "the array to end")
    rec = a.client().status(aid)
    assert "4 cancelled" in rec["reason"], rec["reason"]
    for i in range(4):
        assert a.client().status(f"{aid}_{i}")["state"] == "cancelled"
    time.sleep(1.0)
    r = a.cli("status", f"{aid}[4]")
    assert r.returncode != 0  # never created
