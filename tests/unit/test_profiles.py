"""The profile presets (swarm/node/config.py): one table, the values the scattered
`profile == "local"` tests used to choose."""

from __future__ import annotations

from swarm.cluster.membership import MembershipConfig
from swarm.config import load_config
from swarm.node.config import PROFILES, profile_settings
from swarm.policy.transfer import TransferConfig
from swarm.runtime.moving import settings_for


def test_local_is_faster_than_lan_everywhere() -> None:
    lan, local = PROFILES["lan"], PROFILES["local"]
    assert local.membership == MembershipConfig.local() and lan.membership == MembershipConfig.lan()
    assert (lan.join_backoff_base, local.join_backoff_base) == (1.0, 0.5)
    assert (lan.refused_report_interval, local.refused_report_interval) == (5.0, 1.0)
    assert (lan.snapshot_interval, local.snapshot_interval) == (30.0, 3.0)
    assert (lan.rpc_timeout, local.rpc_timeout) == (5.0, 2.0)
    assert lan.transfer == TransferConfig(task_cooldown=10.0)
    assert local.transfer.round_interval < lan.transfer.round_interval
    for name in ("cooldown", "max_report_age", "period", "move_timeout", "staged_ttl"):
        assert getattr(local.migration, name) < getattr(lan.migration, name), name


def test_any_other_name_is_lan() -> None:
    assert profile_settings("lan") is PROFILES["lan"]
    assert profile_settings("local") is PROFILES["local"]
    assert profile_settings("wan") is PROFILES["lan"]


def test_migrator_settings_follow_the_profile() -> None:
    def settings(profile: str) -> tuple[float, ...]:
        s = settings_for(load_config(env={}, flags={"profile": profile}))
        p = s.policy
        return (p.cooldown, p.rate, p.max_report_age, s.period, s.default_pause,
                s.rpc_timeout, s.move_timeout, s.staged_ttl)  # fmt: skip

    assert settings("local") == (5.0, 1.0, 10.0, 0.5, 0.5, 2.0, 60.0, 60.0)
    assert settings("lan") == (600.0, 1.0 / 60, 30.0, 5.0, 2.0, 5.0, 120.0, 300.0)
