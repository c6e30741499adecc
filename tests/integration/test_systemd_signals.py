"""Stopping the agent the way systemd does: one SIGTERM, sometimes a second one while
it is already on its way out. It must always finish its shutdown and exit 0 (a
death by signal would cut the journal's last write and read as a crash)."""

from __future__ import annotations

import signal
import time

from tests.conftest import AgentFactory


def test_a_second_sigterm_during_shutdown_is_harmless(make_agent: AgentFactory) -> None:
    for n, delay in enumerate((0.0, 0.05, 0.1, 0.2)):
        a = make_agent(f"s{n}", "--kill-grace", "2")
        a.cli("submit", "--", "sleep", "300")
        assert a.proc is not None
        a.proc.send_signal(signal.SIGTERM)
        time.sleep(delay)
        if a.proc.poll() is None:
            a.proc.send_signal(signal.SIGTERM)
        assert a.proc.wait(30) == 0, (delay, a.log_tail())
        log = a.log_text()
        assert "event=agent.stopped" in log and "will run again" in log, log
