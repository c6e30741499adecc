"""Configuration: precedence file < env < flags, defaults per user, clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from swarm.config import ConfigError, load_config


def test_defaults_for_root() -> None:
    c = load_config(env={}, uid=0)
    assert c.state_dir == Path("/var/lib/swarm")
    assert c.socket == Path("/run/swarm/swarm.sock")
    assert c.shares == 1024 * c.slots and c.slots >= 1 and c.placement_d == 2


def test_defaults_for_a_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    c = load_config(env={}, uid=1000)
    assert c.state_dir == tmp_path / "state" / "swarm"
    assert c.socket == tmp_path / "run" / "swarm" / "swarm.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    c = load_config(env={}, uid=1000)
    assert c.socket.name == "swarm.sock" and "swarm-1000" in str(c.socket)


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text('slots = 3\nshares = 100\ncluster = "fromfile"\nseeds = ["a:1", "b:2"]\n')
    c = load_config(file=f, env={}, uid=0)
    assert (c.slots, c.shares, c.cluster, c.seeds) == (3, 100, "fromfile", ["a:1", "b:2"])
    c = load_config(file=f, env={"SWARM_SLOTS": "5", "SWARM_SEEDS": "c:3"}, uid=0)
    assert (c.slots, c.shares, c.seeds) == (5, 100, ["c:3"])
    c = load_config(file=f, env={"SWARM_SLOTS": "5"}, flags={"slots": "7"}, uid=0)
    assert (c.slots, c.shares) == (7, 100)


def test_agent_table_is_accepted(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text("[agent]\nslots = 4\n")
    assert load_config(file=f, env={}, uid=0).slots == 4


def test_config_file_from_env(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text("slots = 9\n")
    assert load_config(env={"SWARM_CONFIG": str(f)}, uid=0).slots == 9


@pytest.mark.parametrize(
    ("text", "env", "key"),
    [
        ("slots = 0\n", {}, "slots"),
        ('slots = "many"\n', {}, "slots"),
        ("frobnicate = 1\n", {}, "frobnicate"),
        ("", {"SWARM_PORT": "70000"}, "port"),
        ("", {"SWARM_SLOTS": "x"}, "slots"),
        ("", {"SWARM_MDNS": "perhaps"}, "mdns"),
        ('profile = "wan"\n', {}, "profile"),
        ('placement = "best"\n', {}, "placement"),
        ("slots = [\n", {}, "config"),
    ],
)
def test_invalid_config_names_the_key(
    tmp_path: Path, text: str, env: dict[str, str], key: str
) -> None:
    f = tmp_path / "agent.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(file=f, env=env, uid=0)
    assert ei.value.key == key
    assert str(ei.value).startswith(key)


def test_env_error_says_where_it_came_from() -> None:
    with pytest.raises(ConfigError, match="SWARM_SLOTS"):
        load_config(env={"SWARM_SLOTS": "-1x"}, uid=0)


def test_cli_invalid_config_exits_2_with_one_line(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text("shares = -5\n")
    p = subprocess.run(
        [sys.executable, "-m", "swarm", "agent", "--config", str(f)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0
    assert "shares" in p.stderr and "config error" in p.stderr


def test_cli_missing_config_file_exits_2(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "swarm", "agent", "--config", str(tmp_path / "nope.toml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 2 and "not found" in p.stderr


def test_agent_with_a_socket_group_that_does_not_exist_exits_2_naming_the_option(
    tmp_path: Path,
) -> None:
    """Not an agent whose socket only root can use (it used to start with a warning)."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm",
            "agent",
            "--socket",
            str(tmp_path / "s.sock"),
            "--state-dir",
            str(tmp_path / "state"),
            "--socket-group",
            "no-such-group-swarm",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        "swarm: config error: socket-group: no group named 'no-such-group-swarm' on this host"
    ]
    assert not (tmp_path / "s.sock").exists()
