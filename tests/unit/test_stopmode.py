"""Does a stopping agent leave its tasks running (runtime/stopmode.py)?"""

from __future__ import annotations

import pytest

from swarm.runtime import stopmode

CGROUP_V2 = "0::/system.slice/swarm-agent.service\n"
CGROUP_V1 = (
    "12:memory:/system.slice/swarm-agent.service/tasks/t1\n"
    "11:cpu,cpuacct:/system.slice/swarm-agent.service\n"
    "1:name=systemd:/system.slice/swarm-agent.service\n"
)


@pytest.mark.parametrize(
    ("text", "unit"),
    [
        (CGROUP_V2, "swarm-agent.service"),
        (CGROUP_V1, "swarm-agent.service"),
        ("0::/user.slice/user-0.slice/session-3.scope\n", None),
        ("", None),
    ],
)
def test_own_unit(text: str, unit: str | None) -> None:
    assert stopmode.own_unit(text) == unit


JOBS = "41 swarm-agent.service restart running\n42 other.service start waiting\n"


def test_restart_job() -> None:
    assert stopmode.restart_job(JOBS, "swarm-agent.service")
    assert not stopmode.restart_job(JOBS, "other.service")  # a start is not a restart
    assert not stopmode.restart_job("41 swarm-agent.service stop running\n", "swarm-agent.service")
    assert not stopmode.restart_job("", "swarm-agent.service")
    assert not stopmode.restart_job("garbage\n\n", "swarm-agent.service")


def test_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    assert stopmode.keep_tasks("always") is True
    assert stopmode.keep_tasks("never") is False
    # not under systemd: a stop is a stop
    assert stopmode.keep_tasks("restart") is False
