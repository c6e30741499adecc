"""Finding peers: mDNS (zeroconf) announce/browse, static seeds, a peer snapshot.

Discovery only finds candidates to join; it never decides liveness (a silently
dead node stays in mDNS caches until its TTL expires, 120 s+). Membership does that.

python-zeroconf runs its own asyncio thread; we create it with
`trio.to_thread.run_sync`, and its browser callbacks hop back into trio with
`TrioToken.run_sync_soon`. Names are resolved (a blocking call) in worker threads so
the browser thread is never held up.

`parse_seeds`, `save_peers`/`load_peers` and `JoinBackoff` are plain functions and
classes (no trio) that the agent uses around the join loop.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import math
import os
import random
import re
import socket
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from zeroconf import (
    InterfaceChoice,
    IPVersion,
    ServiceBrowser,
    ServiceInfo,
    ServiceStateChange,
    Zeroconf,
)

from ..wire import PROTOCOL_VERSION
from .net import collapse_single_group

log = logging.getLogger(__name__)

SERVICE_TYPE = "_swarm._udp.local."
SNAPSHOT_VERSION = 1
_RESOLVE_TIMEOUT_MS = 3000
_MAX_TXT_VALUE = 200


@attrs.frozen
class DiscoveredPeer:
    """A candidate to join: where its agent listens (UDP and TCP share the port)."""

    node: str
    addr: str
    port: int
    cluster: str
    version: int = PROTOCOL_VERSION  # the peer's protocol version, from TXT "pv"


# ------------------------------------------------------------------------ seeds


class SeedError(ValueError):
    """A static seed list entry is not host:port."""


_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9_.])?$")


def _port(entry: str, text: str, default_port: int | None) -> int:
    if text == "":
        if default_port is None:
            raise SeedError(f"seed {entry!r}: missing port (write host:port)")
        return default_port
    if not text.isdigit():
        raise SeedError(f"seed {entry!r}: port {text!r} is not a number")
    port = int(text)
    if not 1 <= port <= 65535:
        raise SeedError(f"seed {entry!r}: port {port} out of range 1-65535")
    return port


def parse_seeds(text: str, default_port: int | None = None) -> list[tuple[str, int]]:
    """Parse "host:port,host2:port2,[::1]:7946" (commas and/or whitespace separate).

    Hostnames are kept as given (resolution happens when joining, so DNS changes are
    picked up); duplicates are dropped. Raises SeedError naming the bad entry.
    """
    out: list[tuple[str, int]] = []
    for entry in text.replace(",", " ").split():
        if entry.startswith("["):
            end = entry.find("]")
            if end < 0:
                raise SeedError(f"seed {entry!r}: missing ']' after an IPv6 address")
            host, rest = entry[1:end], entry[end + 1 :]
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise SeedError(f"seed {entry!r}: {host!r} is not an IPv6 address") from None
            if rest and not rest.startswith(":"):
                raise SeedError(f"seed {entry!r}: expected ':port' after ']'")
            port = _port(entry, rest[1:], default_port)
        else:
            if entry.count(":") > 1:
                raise SeedError(f"seed {entry!r}: write IPv6 addresses in brackets, [addr]:port")
            host, _, ptext = entry.partition(":")
            if not host:
                raise SeedError(f"seed {entry!r}: missing host")
            if not _HOSTNAME.match(host) or ".." in host:
                raise SeedError(f"seed {entry!r}: {host!r} is not a valid host name or address")
            if ":" not in entry and default_port is None:
                raise SeedError(f"seed {entry!r}: missing port (write host:port)")
            port = _port(entry, ptext, default_port)
        if (host, port) not in out:
            out.append((host, port))
    return out


# --------------------------------------------------------------------- snapshot


def save_peers(path: str | os.PathLike[str], peers: Iterable[DiscoveredPeer]) -> None:
    """Atomically replace the snapshot (tmp file, fsync, rename, fsync dir).
    Raises OSError; the old snapshot stays intact on any failure."""
    p = Path(path)
    doc = {
        "version": SNAPSHOT_VERSION,
        "peers": [attrs.asdict(peer) for peer in peers],
    }
    data = json.dumps(doc, indent=1, sort_keys=True).encode("utf-8") + b"\n"
    tmp = p.with_name(f".{p.name}.tmp.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(p.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"expected an integer, got {v!r:.40}")
    return v


def _peer_from_json(obj: Any) -> DiscoveredPeer:
    if not isinstance(obj, dict):
        raise ValueError("entry is not an object")
    node, addr, cluster = obj.get("node"), obj.get("addr"), obj.get("cluster")
    if not (isinstance(node, str) and node and isinstance(addr, str) and addr):
        raise ValueError("node and addr must be non-empty strings")
    if not isinstance(cluster, str):
        raise ValueError("cluster must be a string")
    port = _int(obj.get("port"))
    version = _int(obj.get("version", PROTOCOL_VERSION))
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} out of range")
    return DiscoveredPeer(node, addr, port, cluster, version)


def load_peers(path: str | os.PathLike[str]) -> tuple[list[DiscoveredPeer], str | None]:
    """Read the snapshot: (peers, warning). A missing file is normal on first start:
    ([], None). An unreadable or corrupt file gives ([], warning); individually bad
    entries are skipped with a warning. Never raises."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return [], None
    except OSError as e:
        return [], f"{p}: cannot read peer snapshot: {e.strerror or e}"
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return [], f"{p}: corrupt peer snapshot ignored: {e}"
    if not isinstance(doc, dict) or not isinstance(doc.get("peers"), list):
        return [], f"{p}: corrupt peer snapshot ignored: no peer list"
    if doc.get("version") != SNAPSHOT_VERSION:
        return [], f"{p}: peer snapshot version {doc.get('version')!r} not understood; ignored"
    peers: list[DiscoveredPeer] = []
    bad = 0
    for entry in doc["peers"]:
        try:
            peers.append(_peer_from_json(entry))
        except ValueError:
            bad += 1
    warning = f"{p}: skipped {bad} invalid peer snapshot entries" if bad else None
    return peers, warning


# ---------------------------------------------------------------------- backoff


@attrs.define
class JoinBackoff:
    """Delays between join attempts: exponential up to `cap`, each reduced by up to
    `jitter` (a fraction) at random, so restarted fleets do not retry in lockstep."""

    rng: random.Random
    base: float = 1.0
    cap: float = 60.0
    factor: float = 2.0
    jitter: float = 0.5
    attempt: int = 0

    def __attrs_post_init__(self) -> None:
        if not (0 < self.base <= self.cap and math.isfinite(self.cap)):
            raise ValueError("JoinBackoff needs 0 < base <= cap < inf")
        if self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError("JoinBackoff needs factor >= 1 and 0 <= jitter <= 1")

    def next_delay(self) -> float:
        raw = self.base * self.factor**self.attempt
        if raw >= self.cap:
            raw = self.cap
        else:
            self.attempt += 1
        return raw * (1.0 - self.jitter * self.rng.random())

    def reset(self) -> None:
        """After a successful join."""
        self.attempt = 0


# ------------------------------------------------------------------ zeroconf


def instance_label(node: str, cluster: str) -> str:
    """A DNS-safe, unique mDNS instance label for (cluster, node)."""
    safe = re.sub(r"[^A-Za-z0-9-]+", "-", node).strip("-")[:40] or "node"
    digest = hashlib.sha256(f"{cluster}\x00{node}".encode()).hexdigest()[:8]
    return f"{safe}-{digest}"


def _txt(props: dict[bytes, bytes | None], key: bytes) -> str | None:
    v = props.get(key)
    if v is None:
        return None
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        return None


class Discovery:
    """A running announce + browse (see `open_discovery`). Discovered peers arrive
    on `peers`, once per mDNS add/update (the consumer dedupes)."""

    def __init__(
        self,
        zc: Zeroconf,
        info: ServiceInfo,
        *,
        node: str,
        cluster: str,
        ip_version: IPVersion | None,
        queue: int,
    ) -> None:
        self.zc = zc
        self.info = info
        self.node = node
        self.cluster = cluster
        self._ip_version = ip_version
        self._token = trio.lowlevel.current_trio_token()
        send, recv = trio.open_memory_channel[DiscoveredPeer](queue)
        self._send = send
        self.peers: trio.MemoryReceiveChannel[DiscoveredPeer] = recv
        self.counters = dict.fromkeys(
            (
                "announced",
                "events",
                "resolved",
                "resolve_failed",
                "filtered_self",
                "filtered_cluster",
                "bad_txt",
                "dropped_backlog",
            ),
            0,
        )
        self._resolving: set[str] = set()
        self._closed = False
        self._nursery: trio.Nursery | None = None

    # called in zeroconf's browser thread
    def _on_change(
        self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        if self._closed or state_change not in (
            ServiceStateChange.Added,
            ServiceStateChange.Updated,
        ):
            return
        try:
            self._token.run_sync_soon(self._schedule, name)
        except trio.RunFinishedError:
            pass

    # called in the trio thread; must never raise (it would abort the trio run)
    def _schedule(self, name: str) -> None:
        try:
            self.counters["events"] += 1
            if self._closed or self._nursery is None or name in self._resolving:
                return
            self._resolving.add(name)
            self._nursery.start_soon(self._resolve, name)
        except Exception:
            log.exception("discovery: cannot schedule resolution of %s", name)

    async def _resolve(self, name: str) -> None:
        try:
            info = await trio.to_thread.run_sync(
                partial(self.zc.get_service_info, SERVICE_TYPE, name, _RESOLVE_TIMEOUT_MS),
                abandon_on_cancel=True,
            )
        except Exception as e:
            log.debug("discovery: resolving %s failed: %s", name, e)
            info = None
        finally:
            self._resolving.discard(name)
        if info is None:
            self.counters["resolve_failed"] += 1
            return
        peer = self._peer_of(info)
        if peer is None:
            return
        self.counters["resolved"] += 1
        try:
            self._send.send_nowait(peer)
        except trio.WouldBlock:
            self.counters["dropped_backlog"] += 1
        except trio.ClosedResourceError:
            pass

    def _peer_of(self, info: ServiceInfo) -> DiscoveredPeer | None:
        props = info.properties
        node, cluster, pv = _txt(props, b"node"), _txt(props, b"cluster"), _txt(props, b"pv")
        if not node or cluster is None or pv is None or not pv.isdigit() or not info.port:
            self.counters["bad_txt"] += 1
            return None
        if cluster != self.cluster:
            self.counters["filtered_cluster"] += 1
            return None
        if node == self.node:
            self.counters["filtered_self"] += 1
            return None
        version = IPVersion.All if self._ip_version is None else self._ip_version
        addrs = info.parsed_addresses(version)
        if not addrs:
            self.counters["bad_txt"] += 1
            return None
        v4 = [a for a in addrs if ":" not in a]
        return DiscoveredPeer(node, (v4 or addrs)[0], info.port, cluster, int(pv))


@asynccontextmanager
async def open_discovery(
    *,
    node: str,
    cluster: str,
    host: str,
    port: int,
    interfaces: Sequence[str] | None = None,
    ip_version: IPVersion | None = None,
    queue: int = 256,
    announce: bool = True,
) -> AsyncIterator[Discovery]:
    """Announce (node, cluster, host:port) as `_swarm._udp.local.` and browse for
    peers of the same cluster until the block exits (then unregister and close).

    `host` is the advertised address (not a wildcard). `interfaces` defaults to all;
    tests use ["127.0.0.1"] with IPVersion.V4Only. Registration (mDNS probing takes
    about a second) runs in the background, so entering is quick.
    """
    try:
        packed = socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        raise ValueError(f"discovery needs an IP address to announce, got {host!r}") from None
    if ipaddress.ip_address(host).is_unspecified:
        raise ValueError(f"cannot announce the wildcard address {host!r}")
    if len(node.encode()) > _MAX_TXT_VALUE or len(cluster.encode()) > _MAX_TXT_VALUE:
        raise ValueError(f"node and cluster names must be at most {_MAX_TXT_VALUE} bytes")
    label = instance_label(node, cluster)
    info = ServiceInfo(
        SERVICE_TYPE,
        f"{label}.{SERVICE_TYPE}",
        addresses=[packed],
        port=port,
        properties={
            "node": node,
            "cluster": cluster,
            "port": str(port),
            "pv": str(PROTOCOL_VERSION),
        },
        server=f"{label}.local.",
    )
    ifaces: Any = InterfaceChoice.All if interfaces is None else list(interfaces)
    zc = await trio.to_thread.run_sync(partial(Zeroconf, interfaces=ifaces, ip_version=ip_version))
    d = Discovery(zc, info, node=node, cluster=cluster, ip_version=ip_version, queue=queue)
    browser: ServiceBrowser | None = None
    try:
        async with collapse_single_group(), trio.open_nursery() as nursery:
            d._nursery = nursery
            browser = await trio.to_thread.run_sync(
                partial(ServiceBrowser, zc, SERVICE_TYPE, handlers=[d._on_change])
            )
            if announce:
                nursery.start_soon(_register, d)
            try:
                yield d
            finally:
                d._closed = True
                nursery.cancel_scope.cancel()
    finally:
        d._closed = True
        d._send.close()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await trio.to_thread.run_sync(partial(_shutdown, zc, browser))


async def _register(d: Discovery) -> None:
    try:
        await trio.to_thread.run_sync(
            partial(d.zc.register_service, d.info, allow_name_change=True)
        )
    except Exception as e:
        log.warning("discovery: mDNS registration failed: %s", e)
        return
    d.counters["announced"] = 1


def _shutdown(zc: Zeroconf, browser: ServiceBrowser | None) -> None:
    """Runs in a worker thread: stop browsing, send goodbyes, close sockets."""
    try:
        if browser is not None:
            browser.cancel()
    finally:
        zc.close()  # unregisters our service (goodbye packets) and stops its thread
