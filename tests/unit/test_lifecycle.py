"""The task lifecycle state machine: legal moves succeed and are recorded, the rest raise."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm import model as m

S = m.TaskState
ALL = list(S)


def _task() -> m.Task:
    spec = m.TaskSpec(id="t1", argv=("true",))
    return m.new_task(spec, now=100.0, node="n1")


def test_new_task_is_queued_with_a_journaled_cause() -> None:
    t = _task()
    assert t.state is S.QUEUED
    assert t.history == (m.Transition(100.0, None, S.QUEUED, "submitted", "n1"),)


def test_happy_path_records_times_and_exit() -> None:
    t = m.transition(_task(), S.RUNNING, 101.0, "started", node="n2")
    assert (t.attempts, t.started_at, t.node) == (1, 101.0, "n2")
    t = m.transition(t, S.SUCCEEDED, 105.0, "exited 0", exit_code=0)
    assert t.finished_at == 105.0 and t.exit_code == 0 and t.reason == "exited 0"
    assert [h.dst for h in t.history] == [S.QUEUED, S.RUNNING, S.SUCCEEDED]


@pytest.mark.parametrize("terminal", sorted(m.TERMINAL_STATES, key=lambda s: s.value))
def test_terminal_states_are_final(terminal: m.TaskState) -> None:
    t = m.transition(_task(), S.RUNNING, 1.0, "started")
    t = m.transition(t, terminal, 2.0, "end")
    for dst in ALL:
        with pytest.raises(m.IllegalTransition):
            m.transition(t, dst, 3.0, "again")


def test_illegal_transition_names_both_states() -> None:
    with pytest.raises(m.IllegalTransition, match="queued -> succeeded"):
        m.transition(_task(), S.SUCCEEDED, 1.0, "nope")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ALL), max_size=30))
def test_random_event_sequences(events: list[m.TaskState]) -> None:
    """Any sequence: legal moves apply and append exactly one history entry, illegal
    moves raise and change nothing, attempts count the starts, terminal is final."""
    t = _task()
    starts = 0
    now = 100.0
    for dst in events:
        now += 1.0
        before = t
        if dst in m.ALLOWED_TRANSITIONS[t.state]:
            t = m.transition(t, dst, now, f"to {dst.value}")
            assert len(t.history) == len(before.history) + 1
            assert t.history[-1] == m.Transition(now, before.state, dst, f"to {dst.value}", t.node)
            if dst is S.RUNNING and before.state is not S.MIGRATING:
                starts += 1
            if dst.terminal:
                assert t.finished_at == now
        else:
            with pytest.raises(m.IllegalTransition):
                m.transition(t, dst, now, "illegal")
            assert t == before
        assert t.attempts == starts
        assert t.history[0].src is None
        # history is a chain: every entry starts where the previous ended
        for a, b in zip(t.history, t.history[1:], strict=False):
            assert b.src == a.dst
        terminal_seen = [h for h in t.history if h.dst.terminal]
        assert len(terminal_seen) <= 1
        if terminal_seen:
            assert t.history[-1] is terminal_seen[0]


def test_exit_status_convention() -> None:
    assert m.exit_status(0, None) == 0
    assert m.exit_status(3, None) == 3
    assert m.exit_status(None, 9) == 137
