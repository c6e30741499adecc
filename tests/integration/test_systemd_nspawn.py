"""The real thing: boot systemd in a container, install with deploy/install.sh, run.

The container (systemd-nspawn, `--volatile=yes -D /`: the host's /usr read-only on an
empty tmpfs root, private network) has no internet, so install.sh installs offline
from a wheelhouse (`--wheels`), which this test builds once with pip on the host and
caches next to the venv. The checkout is bound read-only at /src.

A scenario unit inside the container does what an operator and two users would do,
records what it saw in /out/results.tsv, and powers the container off; the asserts
are here. What it proves:
- install.sh installs into /opt/swarm/venv, creates group/user swarm and the keyring,
  enables the unit; `systemctl start` returns once READY=1 came (Type=notify);
- STATUS= carries the peer and task counts; with WatchdogSec=3 the agent is still
  running, never restarted, after 3.5 s (its WATCHDOG=1 pings arrive);
- alice (in group swarm) submits with the CLI; the task runs as alice (uid, HOME,
  umask 0022), `swarm status` says user alice;
- bob (not in group swarm) cannot connect (exit 69, "permission denied");
- root's submission is refused (allow-root-tasks is off by default);
- `systemctl restart` with a running task (issue 19): the task keeps running, same
  process, under its supervisor; the restarted agent re-attaches to it (attempts 1,
  still running, never re-queued);
- `systemctl stop` is clean (Result=success, exit 0) and leaves none of alice's
  processes behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTAINER_TIMEOUT = 180

pytestmark = [pytest.mark.root, pytest.mark.slow]

SCENARIO = r"""#!/bin/bash
set -u
exec >>/out/scenario.log 2>&1
SW=/opt/swarm/venv/bin/swarm
rec() { printf '%s\t%s\n' "$1" "$(printf '%s' "$2" | tr '\t\n' '  ')" >> /out/results.tsv; }
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
# run a command as user $1 (no PAM in this container, so not runuser/su)
as() {
  local u=$1; shift
  (cd "/home/$u" && setpriv --reuid="$(id -u "$u")" --regid="$(id -g "$u")" --init-groups \
     env HOME="/home/$u" USER="$u" LOGNAME="$u" "$@")
}
running() {
  for _ in $(seq 200); do $SW status "$1" | grep -q 'state: *running' && return 0; sleep 0.05; done
  return 1
}

t=$(now); /src/deploy/install.sh --wheels /wheels --source /src --no-start
rec install_rc $?; rec install_s "$(since "$t")"
# for the test: no peers to wait for, a short grace, and a watchdog we can observe
printf 'join-wait = 1.0\nkill-grace = 2.0\n' >> /etc/swarm/agent.toml
mkdir -p /etc/systemd/system/swarm-agent.service.d
printf '[Service]\nWatchdogSec=3\n' > /etc/systemd/system/swarm-agent.service.d/test.conf
systemctl daemon-reload

t=$(now); systemctl start swarm-agent.service; rec start_rc $?; rec start_s "$(since "$t")"
rec active "$(systemctl is-active swarm-agent.service)"
rec status_text "$(systemctl show -p StatusText --value swarm-agent.service)"

useradd -m -G swarm alice; useradd -m bob
rec alice_uid "$(id -u alice)"
tid=$(as alice $SW submit --wait -- sh -c 'id -un; id -u; echo "$HOME"; umask')
rec submit_rc $?; rec task_id "$tid"
rec task_out "$(as alice $SW logs "$tid")"
rec task_status "$(as alice $SW status --json "$tid")"
out=$(as bob $SW info 2>&1); rec bob_rc $?; rec bob_msg "$out"
out=$($SW submit -- true 2>&1); rec root_submit_rc $?; rec root_submit_msg "$out"

long=$(as alice $SW submit -- sleep 300); rec long_id "$long"
running "$long"; rec long_running_rc $?
rec long_pid_before "$(pgrep -u alice -x sleep)"
sleep 3.5
rec nrestarts "$(systemctl show -p NRestarts --value swarm-agent.service)"
rec active_after_watchdog "$(systemctl is-active swarm-agent.service)"
t=$(now); systemctl restart swarm-agent.service; rec restart_rc $?; rec restart_s "$(since "$t")"
running "$long"; rec long_rerun_rc $?
rec long_pid_after "$(pgrep -u alice -x sleep)"
rec long_status "$($SW status --json "$long")"

t=$(now); systemctl stop swarm-agent.service; rec stop_rc $?; rec stop_s "$(since "$t")"
rec result "$(systemctl show -p Result --value swarm-agent.service)"
rec exec_status "$(systemctl show -p ExecMainStatus --value swarm-agent.service)"
rec alice_procs "$(pgrep -u alice | wc -l)"
journalctl -u swarm-agent.service -o cat --no-pager > /out/agent.log
rec done 1
exit 0
"""

SCENARIO_UNIT = """[Unit]
Description=swarm install-and-run scenario (test)
After=basic.target
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
TimeoutStartSec=150
ExecStart=/bin/bash /scenario.sh
"""


def _nspawn(*args: str) -> list[str]:
    return [
        "systemd-nspawn",
        "--quiet",
        "--register=no",
        "--keep-unit",
        "--volatile=yes",
        "-D",
        "/",
        "--console=pipe",
        "--private-network",
        *args,
    ]


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to boot a systemd container"
    if shutil.which("systemd-nspawn") is None:
        return "systemd-nspawn is not installed (make sysdeps installs systemd-container)"
    if not any(Path(p).exists() for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd")):
        return "no systemd to boot in the container"
    for tool in ("bc", "setpriv", "useradd", "pgrep"):
        if shutil.which(tool) is None:
            return f"the container scenario needs {tool} in the host's /usr"
    probe = subprocess.run(
        [
            "/usr/bin/python3",
            "-c",
            "import sys, venv, ensurepip; assert sys.version_info >= (3, 11)",
        ],
        capture_output=True,
    )
    if probe.returncode != 0:
        return "the container uses the host's /usr/bin/python3, which is not >= 3.11 with venv"
    try:
        r = subprocess.run(_nspawn("/bin/true"), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "systemd-nspawn does not work here (a trivial container timed out)"
    if r.returncode != 0:
        return f"systemd-nspawn does not work here: {r.stderr.strip()[:200]}"
    return None


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    """Wheels of swarm's dependencies and of hatchling, for the offline install."""
    why = _unavailable()
    if why:
        pytest.skip(why)
    key = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:12]
    cache = Path(sys.prefix) / f"wheelhouse-{key}"
    if cache.is_dir():
        return cache
    tmp = Path(tempfile.mkdtemp(prefix="wheelhouse-", dir=sys.prefix))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "-w",
            str(tmp),
            f"{REPO}[metrics]",
            "hatchling",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.skip(f"cannot build the wheelhouse for the offline container: {r.stderr[-300:]}")
    for w in tmp.glob("swarm-*.whl"):
        w.unlink()  # the container installs swarm from the checkout, this run's code
    tmp.rename(cache)
    return cache


def _results(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, _, value = line.partition("\t")
            out[key] = value
    return out


def test_install_start_submit_as_user_and_stop_in_a_systemd_container(
    wheelhouse: Path, short_tmp: Path
) -> None:
    out = short_tmp / "out"
    out.mkdir()
    scenario = short_tmp / "scenario.sh"
    scenario.write_text(SCENARIO)
    unit = short_tmp / "swarm-scenario.service"
    unit.write_text(SCENARIO_UNIT)
    cmd = _nspawn(
        "-M",
        "swarmtest",
        f"--bind-ro={REPO}:/src",
        f"--bind-ro={wheelhouse}:/wheels",
        f"--bind={out}:/out",
        f"--bind-ro={scenario}:/scenario.sh",
        f"--bind-ro={unit}:/etc/systemd/system/swarm-scenario.service",
        "-b",
        "systemd.firstboot=off",
        "systemd.wants=swarm-scenario.service",
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        console, _ = proc.communicate(timeout=CONTAINER_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.terminate()
        console, _ = proc.communicate(timeout=30)
    r = _results(out / "results.tsv")
    log = (out / "scenario.log").read_text() if (out / "scenario.log").exists() else ""
    agent_log = (out / "agent.log").read_text() if (out / "agent.log").exists() else ""
    context = f"results={r}\nscenario log:\n{log[-3000:]}\nagent log:\n{agent_log[-3000:]}"
    assert r.get("done") == "1", f"scenario did not finish\n{console.decode()[-2000:]}\n{context}"

    figures = {k: float(r[k]) for k in ("install_s", "start_s", "restart_s", "stop_s") if r.get(k)}
    print("systemd container figures (s):", json.dumps(figures))

    assert r["install_rc"] == "0", context
    assert r["start_rc"] == "0" and r["active"] == "active", context
    assert "peers;" in r["status_text"] and "running" in r["status_text"], context
    # the task ran as its submitter
    assert r["submit_rc"] == "0", context
    assert r["task_out"] == f"alice {r['alice_uid']} /home/alice 0022", context
    assert json.loads(r["task_status"])["spec"]["user"] == "alice", context
    # not in group swarm: no access; root: refused by default
    assert r["bob_rc"] == "69" and "permission denied" in r["bob_msg"], context
    assert r["root_submit_rc"] == "1" and "allow-root-tasks" in r["root_submit_msg"], context
    # the watchdog is fed
    assert r["nrestarts"] == "0" and r["active_after_watchdog"] == "active", context
    # restart: the running task kept running, the same process, re-attached
    assert r["long_running_rc"] == "0" and r["restart_rc"] == "0", context
    assert r["long_rerun_rc"] == "0", context
    assert r["long_pid_before"] and r["long_pid_after"] == r["long_pid_before"], context
    long = json.loads(r["long_status"])
    assert long["state"] == "running" and long["attempts"] == 1, context
    causes = [h["cause"] for h in long["history"]]
    assert "agent shutdown: will run again" not in causes, context
    assert "event=task.reattached" in agent_log, context
    # a clean stop, nothing left behind
    assert r["stop_rc"] == "0" and r["result"] == "success" and r["exec_status"] == "0", context
    assert r["alice_procs"] == "0", context
    assert "event=agent.stopped" in agent_log, context
    assert "Traceback" not in agent_log and "level=error" not in agent_log, context
