"""What the agent checks and prepares before it builds its parts (the cluster keyring,
the private state directory, the exec helper, the GPU inventory, cgroups, migration
settings) and the parts made from options alone. Each refuses with a ConfigError
naming the option, so `swarm agent` says what to fix.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from functools import partial
from pathlib import Path

import attrs

from .. import testbreak
from ..config import Config, ConfigError
from ..crypto import Keyring, KeyringError
from ..logs import EventLog
from ..model import TaskSpec
from ..node.config import Profile
from ..node.moves import MoveSettings
from ..node.state import Settings
from ..policy import datakeys
from ..policy import gpu as gpupol
from ..policy.constraints import merge_labels
from ..policy.hedge import HedgeConfig
from ..policy.latebind import LateConfig
from ..policy.shares import ShareLedger
from . import exechelper, hostfacts, recovery, shim
from . import gpu as gpu_runtime
from .autoscaler import Autoscaler
from .clock import Clock
from .driver import Driver
from .effects import MoveHooks
from .gpu import Inventory
from .isolation import Identities, IsolationError, TaskIsolation
from .isolation import detect as detect_cgroups
from .journal import Journal
from .localops import LocalOps
from .moving import Migrator, settings_for
from .peers import ClusterNode
from .retention import Retention
from .runner import LocalRunner
from .tasks import TaskTable

AGENT_UMASK = 0o077  # the agent's files are private; tasks get TASK_UMASK (0022)


def load_keyring(config: Config) -> Keyring | None:
    """The cluster keyring, or None in --insecure mode; refuses to guess."""
    if config.keyring is None:
        if config.insecure:
            return None
        raise ConfigError(
            "keyring",
            "no cluster key: give --keyring FILE (create one with `swarm keygen -o FILE`), "
            "or run with --insecure to send cluster traffic unencrypted",
        )
    try:
        return Keyring.load(config.keyring)
    except KeyringError as e:
        raise ConfigError("keyring", str(e)) from None
    except OSError as e:
        raise ConfigError("keyring", f"cannot read {config.keyring}: {e.strerror}") from None


def reload_keyring(config: Config, apply: Callable[[Keyring], None], log: EventLog) -> None:
    """SIGHUP: read the key file again and `apply` it (key rotation without
    downtime). A bad file keeps the old keys and says why."""
    if config.keyring is None:
        log.info("agent.keyring_reload", result="insecure mode: no keyring to reload")
        return
    try:
        keyring = Keyring.load(config.keyring)
    except (KeyringError, OSError) as e:
        log.error("agent.keyring_reload", result="kept the old keys", error=str(e))
        return
    apply(keyring)
    log.info(
        "agent.keyring_reload",
        result="ok",
        keys=len(keyring.keys),
        primary=keyring.fingerprints()[0],
    )


def state_dir_mode(euid: int) -> int:
    """The state dir's mode: a root agent's task users must traverse it to reach their
    own task-state dir below it (0711: not listable); otherwise only the agent's user."""
    return 0o711 if euid == 0 else 0o700


def private_state_dir(state_dir: Path, log_dir: Path) -> list[tuple[str, str, int]]:
    """Create the state dir (state_dir_mode) and its task-log dir (0700), and tighten
    either when it exists with looser modes (an older agent made them 0755, its journal
    and logs 0644, readable by every local user). Returns (old mode, path, new mode)
    of what it tightened, for the log. The journal's own files are its business."""
    changed: list[tuple[str, str, int]] = []
    for path, mode in ((state_dir, state_dir_mode(os.geteuid())), (log_dir, 0o700)):
        try:
            path.mkdir(parents=True, mode=mode)
            created = True
        except FileExistsError:
            created = False
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            old = os.fstat(fd).st_mode & 0o7777
            if created and old != mode:  # mkdir's mode went through the umask
                os.fchmod(fd, mode)
            elif old & ~mode:  # looser than it should be (stricter is left alone)
                os.fchmod(fd, old & mode)
                changed.append((f"{old:04o}", str(path), old & mode))
        finally:
            os.close(fd)
    return changed


def prepare(config: Config, log: EventLog) -> Keyring | None:
    """The keyring (warnings logged) and the private state dir; ConfigError if either
    cannot be had."""
    keyring = load_keyring(config)
    if keyring is not None:
        for w in keyring.warnings:
            log.warning("agent.keyring", warning=w)
    elif config.insecure:
        log.warning("agent.insecure", detail="cluster traffic is not encrypted (--insecure)")
    try:
        tightened = private_state_dir(config.state_dir, config.log_dir)
    except OSError as e:
        raise ConfigError("state-dir", f"{config.state_dir}: {e.strerror or e}") from None
    for what, path, mode in tightened:
        log.warning("agent.state_tightened", path=path, old=what, new=f"{mode:04o}")
    return keyring


def task_shim(config: Config, log: EventLog) -> Path | None:
    """swarm-shim, each task's supervisor (runtime/shim.py): a root agent's in the
    root-only cache shared with swarm-exec, another's in its state directory. None
    (tasks die with the agent and run again after it, as before issue 19) when
    `supervise` is off or it cannot be built (no C compiler: said once)."""
    if not config.supervise:
        return None
    where = exechelper.CACHE_DIR if os.geteuid() == 0 else config.state_dir / "bin"
    try:
        path = shim.build(where)
    except exechelper.HelperUnavailable as e:
        log.warning("executor.no_shim", reason=str(e), fallback="tasks end with the agent")
        return None
    log.info("executor.shim", path=str(path))
    return path


def exec_helper(log: EventLog) -> Path | None:
    """swarm-exec for starts as another user (a root agent only): built once per
    version into a root-only cache shared by the host's agents."""
    if os.geteuid() != 0:
        return None
    try:
        helper = exechelper.build(exechelper.CACHE_DIR)
    except exechelper.HelperUnavailable as e:
        log.warning("executor.no_helper", reason=str(e), fallback="each start as a user forks")
        return None
    log.info("executor.helper", path=str(helper))
    return helper


def gpu_inventory(config: Config, log: EventLog) -> Inventory:
    """This node's GPUs (NVML or declared), logged; ConfigError for a bad declaration."""
    try:
        inv = gpu_runtime.discover(config.gpus, config.node_id, nvml=config.nvml)
    except gpupol.GpuConfigError as e:
        raise ConfigError(f"gpus ({e.key})", str(e)) from None
    log.info(
        "gpu.inventory",
        source=inv.source,
        devices=len(inv.devices),
        **({"note": inv.note} if inv.note else {}),
    )
    return inv


def task_isolation(config: Config, clock: Clock, log: EventLog) -> TaskIsolation:
    """Per-user tasks and their cgroups; ConfigError when the one asked for is missing."""
    try:
        cgroups = detect_cgroups(config.state_dir, prefer=config.isolation, log=log)
    except IsolationError as e:
        raise ConfigError("isolation", str(e)) from None
    ids = Identities(node=config.node_id, allow_root=config.allow_root_tasks, clock=clock.now)
    return TaskIsolation(ids, cgroups, log=log)


def migration_settings(config: Config) -> MoveSettings:
    try:
        return settings_for(config)
    except ValueError as e:
        raise ConfigError("checkpoint-signal", str(e)) from None


def cluster_node(
    config: Config,
    keyring: Keyring | None,
    profile: Profile,
    rng: random.Random,
    *,
    clock: Clock,
    log: EventLog,
) -> ClusterNode:
    """The node's membership, transport and peer RPCs, from its options."""
    return ClusterNode(
        node=config.node_id,
        cluster=config.cluster,
        bind=config.bind,
        port=config.port,
        advertise=config.advertise,
        seeds=config.seeds,
        mdns=config.mdns,
        mdns_interfaces=config.mdns_interfaces,
        keyring=keyring,
        profile=profile,
        state_dir=config.state_dir,
        faults=config.faults or os.environ.get("SWARM_FAULTS"),
        log=log,
        rng=rng,
        clock=clock,
    )


MAX_DATA_KEYS = 48  # keys in the 512-bit digest: ~1% false positives (policy.datakeys)


def node_labels(config: Config, gpus: Inventory) -> tuple[tuple[str, str], ...]:
    """The labels this node advertises: what it discovers about its host, overridden
    by its configured ones, within the report's bounds."""
    models = hostfacts.gpu_models_from_proc()
    if gpus.devices and len(models) != len(gpus.devices):  # declared or found by NVML
        models = [models[0] if models else "unknown"] * len(gpus.devices)
    facts = hostfacts.discover(gpu_models=models)
    return tuple(merge_labels(facts, config.label_map).items())


def data_digest(config: Config, log: EventLog) -> bytes:
    """The Bloom digest of the data sets held here: configured keys first, then the
    entries of the data directories, at most MAX_DATA_KEYS in all (more would make the
    digest say "maybe" to most keys)."""
    keys = list(dict.fromkeys(config.data_keys))
    dirs = [Path(d) for d in config.data_dirs]
    for d in dirs:
        if not d.is_dir():
            log.warning("data.dir_missing", dir=str(d))
    keys += [k for k in hostfacts.scan_data_dirs(dirs) if k not in keys]
    if len(keys) > MAX_DATA_KEYS:
        log.warning("data.too_many_keys", keys=len(keys), kept=MAX_DATA_KEYS)
        keys = keys[:MAX_DATA_KEYS]
    if keys:
        log.info("data.keys", count=len(keys), keys=keys[:8])
    return datakeys.digest(keys)


def late_config(d: int, profile: Profile) -> LateConfig | None:
    """`--late-binding D`: the D least loaded of 2D peers sampled from the view hold a
    reservation; the profile's hold and second-wave delay (None: off)."""
    if d <= 0:
        return None
    return LateConfig(d=d, sample=2 * d, stage=profile.late_stage, hold=profile.late_hold)


def hedge_config(budget: float, history: int) -> HedgeConfig | None:
    """`--backup-budget F --backup-history N` (node/backups.py; None: no backups)."""
    if budget <= 0:
        return None
    return HedgeConfig(budget=budget, min_history=history, history=max(512, history))


def driver(
    config: Config,
    profile: Profile,
    gpus: Inventory,
    *,
    table: TaskTable,
    journal: Journal,
    runner: LocalRunner,
    cluster: ClusterNode,
    ledger: ShareLedger,
    rng: random.Random,
    clock: Clock,
    log: EventLog,
    admission_hook: Callable[[TaskSpec], str | None] | None = None,
    moves: Callable[[Driver], MoveHooks] | None = None,
) -> Driver:
    """The node's driver and state machine, their options from the config and profile."""
    max_age = config.report_max_age or 3 * profile.membership.load_refresh_interval
    settings = Settings(
        placement_d=config.placement_d,
        late=late_config(config.late_binding, profile),
        hedge=hedge_config(config.backup_budget, config.backup_history),
        placement_rule=config.placement,
        gpu_policy=config.gpu_policy,
        psi_target=config.qos_psi_target,
        slots=config.slots,
        default_shares=config.shares,
        breaks=testbreak.active(),
        sharing=config.sharing,
        report_max_age=max_age,
        data_delay=config.data_delay,
        home_grace=config.home_grace,
        fence_ttl=config.fence_ttl,
        replicas=config.replicas,
        labels=node_labels(config, gpus),
        data_digest=data_digest(config, log),
    )
    return Driver(
        node=config.node_id,
        table=table,
        journal=journal,
        runner=runner,
        cluster=cluster,
        ledger=ledger,
        log=log,
        clock=clock,
        settings=settings,
        report_interval=config.report_interval,
        rpc_timeout=profile.rpc_timeout,
        transfer_config=attrs.evolve(profile.transfer, max_age=max_age),
        transfer=config.transfer,
        gpu_devices=gpus.devices,
        mps=config.mps,
        rng=rng,
        admission_hook=admission_hook,
        moves=moves,
        migration_period=migration_settings(config).period,
    )


def migrator_factory(
    config: Config,
    clock: Clock,
    owner_of: Callable[[TaskSpec], tuple[int, int] | None],
    log: EventLog,
    made: list[Migrator],
) -> Callable[[Driver], Migrator]:
    """What the driver calls to build its migration side (kept in `made` for the agent)."""

    def build(driver: Driver) -> Migrator:
        made.append(
            Migrator(driver, migration_settings(config), clock=clock, owner_of=owner_of, log=log)
        )
        return made[-1]

    return build


def retention(
    config: Config,
    journal: Journal,
    table: TaskTable,
    runner: LocalRunner,
    coord: Driver,
    migrator: Migrator,
    clock: Clock,
    log: EventLog,
) -> Retention:
    """Retention of finished records, asking the node's rules (recovery.py) what it may
    forget and what goes with a forgotten task."""
    return Retention(
        config.keep_finished_s,
        journal,
        table,
        runner.log_paths,
        partial(recovery.still_needed, coord, migrator, runner),
        log=log,
        on_forget=partial(recovery.forget_task_state, coord, journal),
        clock=clock,
    )


def autoscaler(
    config: Config,
    cluster: ClusterNode,
    journal: Journal,
    ops: LocalOps,
    coord: Driver,
    clock: Clock,
    log: EventLog,
) -> Autoscaler:
    """The elastic pools' loop (idle when no [scale.NAME] table is configured)."""
    return Autoscaler(config.pools, cluster, journal, ops.shares, coord.local_report, clock, log)
