"""Share changes (drain, undrain, `swarm shares`) as the node's pure rules, and commit
423d5ed replayed: a drain whose write landed after the undrain that followed it."""

from __future__ import annotations

import pytest

from swarm.node import events as ev
from swarm.node.shares import SHARES_KEY, UNDRAIN_KEY, ShareChanges, ShareRequestError
from swarm.policy.shares import ShareLedger


def _changes(shares: int = 1024) -> ShareChanges:
    return ShareChanges(ShareLedger(shares), default_shares=1024)


def test_423d5ed_a_late_drain_write_never_overrides_the_undrain_after_it() -> None:
    c = _changes(2048)
    drain = c.decide(None, drain=True, undrain=False)
    assert drain is not None and c.ledger.shares == 0  # a cut applies before its write
    undrain = c.decide(None, drain=False, undrain=True)
    assert undrain is not None and undrain.new == 2048  # what the drain took away
    c.landed(undrain.seq)
    assert c.ledger.shares == 2048
    c.landed(drain.seq)  # the slow drain write lands last
    assert c.ledger.shares == 2048 and not c.ledger.draining
    # the journal's writes went in decision order: the last shares written are 2048
    assert [o.value for o in (*drain.ops, *undrain.ops) if o.key == SHARES_KEY] == [0, 2048]


def test_a_raise_waits_for_its_write_and_a_cut_does_not() -> None:
    c = _changes(1024)
    up = c.decide(4096, drain=False, undrain=False)
    assert up is not None and c.ledger.shares == 1024
    out = c.landed(up.seq)
    assert c.ledger.shares == 4096
    assert ev.PublishLoad() in out and ev.SyncGlobals() in out and ev.KickRunner() in out
    down = c.decide(512, drain=False, undrain=False)
    assert down is not None and c.ledger.shares == 512


def test_a_failed_drain_write_takes_the_cut_back_and_the_undrain_value_too() -> None:
    c = _changes(3000)
    drain = c.decide(None, drain=True, undrain=False)
    assert drain is not None and drain.ops[1] == ev.Put(UNDRAIN_KEY, 3000)
    c.failed(drain.seq)
    assert c.ledger.shares == 3000 and c.undrain_to == 0
    undrain = c.decide(None, drain=False, undrain=True)
    assert undrain is not None and undrain.new == 1024  # the configured default


def test_reading_changes_nothing_and_drain_takes_no_other_field() -> None:
    c = _changes()
    assert c.decide(None, drain=False, undrain=False) is None
    with pytest.raises(ShareRequestError):
        c.decide(5, drain=True, undrain=False)


def test_shares_and_the_undrain_value_survive_a_restart() -> None:
    c = _changes()
    c.restore({SHARES_KEY: 0, UNDRAIN_KEY: 700})
    assert c.ledger.draining
    undrain = c.decide(None, drain=False, undrain=True)
    assert undrain is not None and undrain.new == 700
