"""Agent configuration: TOML file < SWARM_* environment < command-line flags.

Options are declared once in OPTIONS (name, type, default, help); the loader, the
environment mapping (`state-dir` -> SWARM_STATE_DIR), the CLI flags and the example
config in deploy/ all derive from that table, so they cannot drift apart.

Invalid configuration raises ConfigError naming the key and where the bad value came
from; the CLI turns it into one line on stderr and exit code 2.
"""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from .options import OPTIONS, OPTIONS_BY_NAME, Option, parse_duration
from .paths import default_paths as _default_paths
from .policy.constraints import ConstraintError, check_labels
from .policy.datakeys import DATA_KEY_RULE, valid_data_key
from .policy.load import default_shares
from .policy.scalepool import PoolConfigError, PoolSpec, parse_pools
from .policy.sharing import Sharing, SharingError
from .policy.sharing import parse as parse_sharing


class ConfigError(Exception):
    def __init__(self, key: str, message: str, source: str = "") -> None:
        where = f" (from {source})" if source else ""
        super().__init__(f"{key}: {message}{where}")
        self.key = key
        self.source = source


def _coerce(opt: Option, value: Any, source: str) -> Any:
    """Turn a TOML value or a string (env/CLI) into the option's type."""
    kind = opt.kind
    from_text = isinstance(value, str) and kind not in ("str", "path")
    try:
        if kind == "raw":
            return value
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if from_text:
                low = value.strip().lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
            raise ValueError("must be true or false")
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError("must be an integer")
            if isinstance(value, int):
                return value
            if from_text:
                return int(value.strip(), 10)
            raise ValueError("must be an integer")
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError("must be a number")
            if isinstance(value, (int, float)):
                return float(value)
            if from_text:
                return float(value.strip())
            raise ValueError("must be a number")
        if kind in ("str", "path"):
            if not isinstance(value, str) or (kind == "path" and not value):
                raise ValueError(
                    "must be a non-empty string" if kind == "path" else "must be a string"
                )
            return Path(value).expanduser() if kind == "path" else value
        if kind == "list":
            if isinstance(value, dict) and opt.name == "labels":  # labels = { rack = "r1" }
                if not all(isinstance(v, str) for v in value.values()):
                    raise ValueError("label values must be strings")
                return [f"{k}={v}" for k, v in value.items()]
            if isinstance(value, str):
                return [x.strip() for x in value.split(",") if x.strip()]
            if isinstance(value, list) and all(isinstance(x, str) for x in value):
                return list(value)
            raise ValueError("must be a list of strings or a comma-separated string")
    except ValueError as e:
        msg = str(e)
        if "invalid literal" in msg or "could not convert" in msg:
            msg = f"must be {'an integer' if kind == 'int' else 'a number'}, got {value!r}"
        raise ConfigError(opt.name, msg, source) from None
    raise ConfigError(opt.name, f"unsupported option kind {kind}", source)


@attrs.frozen
class Config:
    """The resolved configuration. Every field has a value; paths are absolute."""

    node_id: str
    cluster: str
    state_dir: Path
    socket: Path
    socket_group: str | None
    slots: int
    shares: int
    kill_grace: float
    keep_finished: str
    port: int
    bind: str
    advertise: str | None
    seeds: list[str]
    mdns: bool
    mdns_interfaces: list[str]
    keyring: Path | None
    insecure: bool
    profile: str
    faults: str | None
    metrics: str | None
    placement_d: int
    late_binding: int
    backup_budget: float
    backup_history: int
    allow_root_tasks: bool
    isolation: str
    log_format: str
    log_level: str
    join_wait: float
    report_interval: float
    qos_psi_target: float
    migration: str
    checkpoint_signal: str
    checkpoint_exit_code: int
    checkpoint_timeout: float
    bandwidth: float
    gpu_policy: str
    mps: bool
    nvml: bool
    gpus: list[Any]
    placement: str
    transfer: bool
    priorities: dict[str, Any]
    default_priority: str
    groups: dict[str, Any]
    preempt: bool
    preempt_min_gap: int
    preempt_per_minute: int
    fair_share_half_life: str
    quota_floor: float
    quota_lag: float
    labels: list[str]
    data_keys: list[str]
    data_dirs: list[str]
    data_delay: float
    report_max_age: float | None
    scale: dict[str, Any]
    supervise: bool
    home_grace: float
    fence_ttl: float
    replicas: int | None
    keep_tasks: str
    config_file: Path | None = None
    sharing: Sharing = attrs.field(factory=Sharing)
    pools: tuple[PoolSpec, ...] = ()

    @property
    def label_map(self) -> dict[str, str]:
        """The static labels (checked when loaded)."""
        return dict(x.split("=", 1) for x in self.labels)

    @property
    def keep_finished_s(self) -> float:
        """keep-finished in seconds (0: keep forever); checked when loaded."""
        return parse_duration(self.keep_finished)

    @property
    def journal_path(self) -> Path:
        return self.state_dir / "journal.db"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"


def _check_where(values: dict[str, Any]) -> None:
    """Labels, data keys and data directories: one clear line naming the bad one."""
    labels: dict[str, str] = {}
    for item in values["labels"]:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError("labels", f"expected KEY=VALUE, got {item!r:.60}")
        labels[key.strip()] = value.strip()
    try:
        labels = check_labels(labels, "labels")
    except ConstraintError as e:
        raise ConfigError("labels", str(e).removeprefix("labels: ")) from None
    values["labels"] = [f"{k}={v}" for k, v in labels.items()]
    for key in values["data_keys"]:
        if not valid_data_key(key):
            raise ConfigError("data-keys", f"{key!r:.60}: {DATA_KEY_RULE}")
    for d in values["data_dirs"]:
        if not d.startswith("/"):
            raise ConfigError("data-dirs", f"{d!r:.60}: must be an absolute path")


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("config", f"file not found: {path}") from None
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", f"{path} is not valid TOML: {e}") from None
    # Allow both a flat file and an [agent] table.
    if "agent" in data and isinstance(data["agent"], dict):
        agent = dict(data.pop("agent"))
        agent.update(data)
        data = agent
    return data


def load_config(
    *,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    uid: int | None = None,
) -> Config:
    """Resolve the configuration. `flags` uses option names (dashes) and skips Nones."""
    env = os.environ if env is None else env
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    uid = os.getuid() if uid is None else uid

    values: dict[str, Any] = {o.attr: o.default for o in OPTIONS}
    values = {k: (list(v) if isinstance(v, list) else v) for k, v in values.items()}

    cfg_file = file
    if cfg_file is None and env.get("SWARM_CONFIG"):
        cfg_file = Path(env["SWARM_CONFIG"])
    if cfg_file is not None:
        data = read_toml(cfg_file)
        for key, raw in data.items():
            opt = OPTIONS_BY_NAME.get(key) or OPTIONS_BY_NAME.get(key.replace("_", "-"))
            if opt is None:
                raise ConfigError(key, f"unknown option in {cfg_file}")
            values[opt.attr] = _coerce(opt, raw, str(cfg_file))

    for opt in OPTIONS:
        if opt.env in env and opt.kind != "raw":
            values[opt.attr] = _coerce(opt, env[opt.env], f"environment {opt.env}")

    for name, raw in flags.items():
        opt = OPTIONS_BY_NAME.get(name)
        if opt is None:
            raise ConfigError(name, "unknown option")
        values[opt.attr] = _coerce(opt, raw, f"--{name}")

    for opt in OPTIONS:
        v = values[opt.attr]
        if v is not None and opt.check is not None:
            err = opt.check(v)
            if err:
                raise ConfigError(opt.name, err)

    state_default, sock_default = _default_paths(uid)
    if values["state_dir"] is None:
        values["state_dir"] = state_default
    if values["socket"] is None:
        values["socket"] = sock_default
    values["state_dir"] = Path(values["state_dir"]).absolute()
    values["socket"] = Path(values["socket"]).absolute()
    if values["slots"] is None:
        values["slots"] = os.cpu_count() or 1
    if values["shares"] is None:
        values["shares"] = default_shares(values["slots"])
    if values["node_id"] is None:
        values["node_id"] = socket.gethostname()
    if not values["node_id"] or len(values["node_id"]) > 128:
        raise ConfigError("node-id", "must be 1-128 characters")
    if len(str(values["socket"]).encode()) > 107:
        raise ConfigError("socket", f"path too long for a Unix socket ({values['socket']})")
    if not isinstance(values["gpus"], list):
        raise ConfigError("gpus", "must be a list of tables ([[gpus]])")
    for key in ("priorities", "groups", "scale"):
        if not isinstance(values[key], dict):
            raise ConfigError(key, f"must be a table ([{key}])")
    try:
        sharing = parse_sharing(
            values["priorities"],
            values["groups"],
            default_class=values["default_priority"],
            preempt=values["preempt"],
            preempt_min_gap=values["preempt_min_gap"],
            preempt_per_minute=values["preempt_per_minute"],
            half_life=parse_duration(values["fair_share_half_life"]) or 86_400.0,
            quota_floor=values["quota_floor"],
            quota_lag=values["quota_lag"],
        )
    except SharingError as e:
        raise ConfigError(e.key, e.message) from None
    _check_where(values)
    try:
        pools = parse_pools(values["scale"])
    except PoolConfigError as e:
        key, _, msg = str(e).partition(": ")
        raise ConfigError(key, msg) from None
    return Config(config_file=cfg_file, sharing=sharing, pools=pools, **values)
