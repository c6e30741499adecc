"""deploy/: the unit verifies without a word, sysusers/tmpfiles parse and do what
they say, install.sh is valid bash, and agent.toml.example lists every option."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import time
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from swarm.config import load_config
from swarm.options import OPTIONS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SYSTEM_UNITS = next(
    (Path(p) for p in ("/usr/lib/systemd/system", "/lib/systemd/system") if Path(p).is_dir()),
    None,
)


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (make sysdeps installs systemd)")


def _verify_root(tmp: Path, unit_text: str, name: str = "swarm-agent.service") -> Path:
    """A root for `systemd-analyze --root`: the system's units, the unit as install.sh
    puts it, and an executable where ExecStart points (verify checks that it exists)."""
    assert SYSTEM_UNITS is not None
    root = tmp / "root"
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system" / name).write_text(unit_text)
    for rel in ("opt/swarm/venv/bin/swarm", "bin/kill"):  # ExecStart, ExecReload
        exe = root / rel
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return root


def _analyze(root: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", f"--root={root}", "verify", name],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_unit_verifies_with_no_output(tmp_path: Path) -> None:
    _need("systemd-analyze")
    if SYSTEM_UNITS is None:
        pytest.skip("no systemd unit directory on this machine")
    text = (DEPLOY / "swarm-agent.service").read_text()
    r = _analyze(_verify_root(tmp_path, text), "swarm-agent.service")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr


def test_verify_would_catch_a_typo(tmp_path: Path) -> None:
    """The check above is not vacuous: a misspelt value is reported (as a warning)."""
    _need("systemd-analyze")
    if SYSTEM_UNITS is None:
        pytest.skip("no systemd unit directory on this machine")
    text = (
        (DEPLOY / "swarm-agent.service").read_text().replace("KillMode=process", "KillMode=proces")
    )
    r = _analyze(_verify_root(tmp_path, text), "swarm-agent.service")
    assert "proces" in r.stdout + r.stderr


def test_unit_says_what_the_docs_say() -> None:
    unit = (DEPLOY / "swarm-agent.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if re.match(r"^[A-Z]\w*=", line)
    )
    assert settings["Type"] == "notify"
    assert settings["KillMode"] == "process"  # tasks outlive a restart (issue 19)
    assert settings["Delegate"] == "yes"
    assert settings["StateDirectory"] == "swarm" and settings["RuntimeDirectory"] == "swarm"
    assert float(settings["WatchdogSec"]) > 0
    # the agent's own stop (kill-grace 10 s, leave, journal) fits in the stop timeout
    assert float(settings["TimeoutStopSec"]) >= 10 + 15
    assert "ProtectControlGroups" not in settings  # it would make cgroups read-only


def test_sysusers_creates_group_and_user(tmp_path: Path) -> None:
    _need("systemd-sysusers")
    root = tmp_path / "root"
    (root / "etc/sysusers.d").mkdir(parents=True)
    (root / "etc/passwd").write_text("")
    (root / "etc/group").write_text("")
    shutil.copy(DEPLOY / "sysusers.d/swarm.conf", root / "etc/sysusers.d/swarm.conf")
    r = subprocess.run(
        ["systemd-sysusers", f"--root={root}", "swarm.conf"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert re.search(r"^swarm:x:\d+:", (root / "etc/group").read_text(), re.M)
    passwd = (root / "etc/passwd").read_text()
    assert re.search(
        r"^swarm:x:\d+:\d+:swarm agent:/var/lib/swarm:/usr/sbin/nologin$", passwd, re.M
    )


def test_tmpfiles_cleans_old_task_output_only(tmp_path: Path) -> None:
    _need("systemd-tmpfiles")
    root = tmp_path / "root"
    (root / "etc/tmpfiles.d").mkdir(parents=True)
    shutil.copy(DEPLOY / "tmpfiles.d/swarm.conf", root / "etc/tmpfiles.d/swarm.conf")
    logs = root / "var/lib/swarm/logs"
    logs.mkdir(parents=True)
    old, new = logs / "told.out", logs / "tnew.out"
    old.write_text("x")
    new.write_text("y")
    long_ago = time.time() - 40 * 86400
    os.utime(old, (long_ago, long_ago))
    journal = root / "var/lib/swarm/journal.db"
    journal.write_text("z")
    os.utime(journal, (long_ago, long_ago))
    r = subprocess.run(
        ["systemd-tmpfiles", f"--root={root}", "--clean", "swarm.conf"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert not old.exists() and new.exists() and journal.exists()


def test_install_script_is_valid_bash() -> None:
    r = subprocess.run(["bash", "-n", str(DEPLOY / "install.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    if shutil.which("shellcheck"):
        r = subprocess.run(
            ["shellcheck", str(DEPLOY / "install.sh")], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stdout
    helptext = subprocess.run(
        ["bash", str(DEPLOY / "install.sh"), "--help"], capture_output=True, text=True
    )
    assert helptext.returncode == 0 and "--wheels" in helptext.stdout


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_agent_toml", DEPLOY / "gen_agent_toml.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_config_is_generated_from_the_options_table() -> None:
    text = (DEPLOY / "agent.toml.example").read_text()
    regen = "python deploy/gen_agent_toml.py > deploy/agent.toml.example"
    assert text == _generator().render(), f"deploy/agent.toml.example is stale: {regen}"
    for opt in OPTIONS:
        assert re.search(rf"^#\[*{re.escape(opt.name)}\]*( = |$)", text, re.M), opt.name


def test_example_config_uncommented_is_a_valid_config(tmp_path: Path) -> None:
    """Every example value is one the loader accepts: uncomment all and load it."""
    text = (DEPLOY / "agent.toml.example").read_text()
    live = [
        re.sub(r"\s+# default: unset$", "", line[1:])
        for line in text.splitlines()
        if re.match(r"^#[\[a-z]", line)
    ]
    path = tmp_path / "agent.toml"
    path.write_text("\n".join(live) + "\n")
    data = tomllib.loads(path.read_text())
    assert {o.name for o in OPTIONS} == set(data)
    cfg = load_config(file=path, env={}, flags={})
    assert cfg.isolation == "auto" and cfg.metrics == "127.0.0.1:9464"
