"""Profile presets in one table: every timing that `--profile` chooses.

`lan` is the default for real clusters; `local` is for loopback clusters, tests and
demos, where every timer runs several times faster. The parts look their profile up
once (`profile_settings(config.profile)`) instead of each testing the name.
"""

from __future__ import annotations

import attrs

from ..cluster.membership import MembershipConfig
from ..policy.transfer import TransferConfig


@attrs.frozen
class MigrationTimings:
    """The migrator's timers (seconds) and start rate, per profile."""

    cooldown: float  # after a task arrived, before it may move again
    rate: float  # migrations started per second (token bucket, burst 2)
    max_report_age: float  # ignore targets whose gossiped report is older
    period: float  # between decision rounds
    default_pause: float  # assumed pause until pauses were measured here
    rpc_timeout: float
    move_timeout: float  # how long the source waits for the home's verdict
    staged_ttl: float  # staged state whose task never came is deleted after


@attrs.frozen
class Profile:
    """What one profile sets (all seconds unless named otherwise)."""

    name: str
    membership: MembershipConfig  # SWIM/gossip timers
    join_backoff_base: float  # first retry delay joining the seeds (capped at 30 s)
    refused_report_interval: float  # refused peer packets are logged this often at most
    snapshot_interval: float  # peers.json is rewritten this often
    rpc_timeout: float  # the coordinator's peer requests
    transfer: TransferConfig
    migration: MigrationTimings
    late_hold: float  # late binding: a held task nobody pulled joins the home's queue
    late_stage: float  # ... and peers that did not look free are reserved this much later


PROFILES: dict[str, Profile] = {
    "lan": Profile(
        name="lan",
        membership=MembershipConfig.lan(),
        join_backoff_base=1.0,
        refused_report_interval=5.0,
        snapshot_interval=30.0,
        rpc_timeout=5.0,
        transfer=TransferConfig(task_cooldown=10.0),
        late_hold=30.0,
        late_stage=0.05,
        migration=MigrationTimings(
            cooldown=600.0,
            rate=1.0 / 60,
            max_report_age=30.0,
            period=5.0,
            default_pause=2.0,
            rpc_timeout=5.0,
            move_timeout=120.0,
            staged_ttl=300.0,
        ),
    ),
    "local": Profile(
        name="local",
        membership=MembershipConfig.local(),
        join_backoff_base=0.5,
        refused_report_interval=1.0,
        snapshot_interval=3.0,
        rpc_timeout=2.0,
        transfer=TransferConfig(
            round_interval=0.5, probe_timeout=0.3, task_cooldown=1.0, switch_cooldown=2.0
        ),
        late_hold=5.0,
        late_stage=0.02,
        migration=MigrationTimings(
            cooldown=5.0,
            rate=1.0,
            max_report_age=10.0,
            period=0.5,
            default_pause=0.5,
            rpc_timeout=2.0,
            move_timeout=60.0,
            staged_ttl=60.0,
        ),
    ),
}


def profile_settings(name: str) -> Profile:
    """The preset of a profile name. Any name but "local" gets the LAN preset (the
    options table only lets "lan" and "local" through)."""
    return PROFILES.get(name, PROFILES["lan"])
