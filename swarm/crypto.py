"""Cluster keyring and AES-256-GCM packet sealing with replay protection.

Pure apart from `Keyring.load` (reads the key file) and the random instance id a
`Sealer` draws when none is injected. Time is always an argument (`now`, wall-clock
seconds since the epoch, because send times are compared across hosts).

Why the design is what it is (docs/protocol.md, "Security", has the full picture):

* One cluster key encrypts everything every node sends, for years. Random 96-bit
  GCM nonces are only safe for about 2**32 messages per key, which a busy cluster
  exceeds. So each sender *instance* (8 random bytes per process start) derives its
  own subkey `HKDF-SHA256(key, salt=instance)`, and the nonce is `stream || counter`:
  it can never repeat under that subkey. Instance ids only need to be unique across
  process starts (2**64 space), not across messages.
* A "stream" is one counter space of a sender: stream 0 carries datagrams, every
  TCP connection gets a fresh stream id. Reordering on one stream (UDP) is absorbed
  by a 1024-counter sliding window (IPsec / WireGuard style); a TCP stream is also
  checked for gap-free order by the transport.
* The cluster name is associated data: a packet of another cluster never opens.
* The send time bounds replays: a receiver that never saw a sender (restart, LRU
  eviction) still rejects captures older than `max_skew`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
import stat
import struct
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_SIZE = 32
VERSION = 1  # first byte of every sealed packet; the transport uses it as its mode marker
HINT_SIZE = 4
INSTANCE_SIZE = 8
TAG_SIZE = 16
# version, key hint, sender instance, stream id, counter, send time (ms since epoch)
_HEADER = struct.Struct(">B4s8sIQQ")
HEADER_SIZE = _HEADER.size  # 33
OVERHEAD = HEADER_SIZE + TAG_SIZE  # 49 bytes added to every sealed payload
DEFAULT_WINDOW = 1024
DEFAULT_MAX_SKEW = 60.0
DEFAULT_MAX_STREAMS = 8192
_MAX_STREAM_ID = 0xFFFFFFFF
_HKDF_INFO = b"swarm seal v1"
_FP_PREFIX = b"swarm keyring v1\x00"

REASONS = frozenset({"short", "version", "decrypt", "replay", "stale"})


class KeyringError(Exception):
    """The key file is missing, unreadable or has a bad line (the message says where)."""


class CryptoError(Exception):
    """A packet was rejected. `reason` is one of REASONS so drops can be counted."""

    def __init__(self, reason: str, detail: str = "") -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def key_fingerprint(key: bytes) -> bytes:
    """Public identifier of a key (safe to log, show, and put in packets)."""
    return hashlib.sha256(_FP_PREFIX + key).digest()


def generate_key() -> str:
    """A fresh random key, base64, as one keyring line."""
    return base64.b64encode(secrets.token_bytes(KEY_SIZE)).decode("ascii")


def keygen_file_text() -> str:
    """A complete new keyring file (one key) with instructions for rotation."""
    return (
        "# swarm cluster keyring: one base64 AES-256 key per line.\n"
        "# The first key encrypts; every key listed decrypts. To rotate without downtime:\n"
        "#   1. add the new key as the second line on all nodes (reload: SIGHUP),\n"
        "#   2. move it to the first line on all nodes,\n"
        "#   3. remove the old key on all nodes.\n"
        "# Keep this file private: mode 0600, owner root (a root agent refuses anything else).\n"
        f"{generate_key()}\n"
    )


def _decode_key(text: str, where: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise KeyringError(f"{where}: not valid base64") from None
    if len(raw) != KEY_SIZE:
        raise KeyringError(f"{where}: key is {len(raw)} bytes, want {KEY_SIZE} (AES-256)")
    return raw


@attrs.frozen
class Keyring:
    """Ordered cluster keys: `keys[0]` encrypts, all of them decrypt."""

    keys: tuple[bytes, ...] = attrs.field()
    source: str = "<keyring>"
    warnings: tuple[str, ...] = ()

    @keys.validator
    def _check(self, _attr: object, value: tuple[bytes, ...]) -> None:
        if not value:
            raise KeyringError(f"{self.source}: keyring has no keys")
        for k in value:
            if not isinstance(k, bytes) or len(k) != KEY_SIZE:
                raise KeyringError(f"{self.source}: every key must be {KEY_SIZE} bytes")

    @property
    def primary(self) -> bytes:
        return self.keys[0]

    def fingerprints(self) -> list[str]:
        """Short hex ids, in order, for `swarm keys list` and logs (never the key)."""
        return [key_fingerprint(k)[:8].hex() for k in self.keys]

    @classmethod
    def from_keys(cls, keys: Iterable[bytes], source: str = "<keyring>") -> Keyring:
        return cls(tuple(keys), source)

    @classmethod
    def parse(cls, text: str, source: str = "<keyring>") -> Keyring:
        """Parse keyring text: base64 keys, one per line; '#' starts a comment."""
        keys: list[bytes] = []
        warnings: list[str] = []
        for lineno, line in enumerate(text.splitlines(), 1):
            body = line.split("#", 1)[0].strip()
            if not body:
                continue
            where = f"{source}:{lineno}"
            if len(body.split()) != 1:
                raise KeyringError(f"{where}: expected one base64 key per line")
            key = _decode_key(body, where)
            if key in keys:
                warnings.append(f"{where}: duplicate key ignored")
                continue
            keys.append(key)
        if not keys:
            raise KeyringError(f"{source}: keyring has no keys")
        return cls(tuple(keys), source, tuple(warnings))

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        strict_mode: bool = False,
        euid: int | None = None,
    ) -> Keyring:
        """Read a key file as an agent running as `euid` (default: this process's)
        would. A file it must not trust (`key_file_refusal`) raises KeyringError; a
        group-writable one gets a warning in `.warnings`, or a KeyringError with
        `strict_mode=True`. The checks and the read use one descriptor."""
        p = Path(path)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise KeyringError(f"{p}: cannot read keyring: {e.strerror or e}") from None
        try:
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                refusal = key_file_refusal(
                    p, st.st_mode, st.st_uid, os.geteuid() if euid is None else euid
                )
                if refusal is not None:
                    raise KeyringError(refusal)
                data = f.read()
        except OSError as e:
            raise KeyringError(f"{p}: cannot read keyring: {e.strerror or e}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise KeyringError(f"{p}: keyring is not UTF-8 text") from None
        ring = cls.parse(text, str(p))
        warning = permission_warning(p, st.st_mode)
        if warning is None:
            return ring
        if strict_mode:
            raise KeyringError(warning)
        return attrs.evolve(ring, warnings=(*ring.warnings, warning))


def key_file_refusal(path: str | os.PathLike[str], mode: int, owner: int, euid: int) -> str | None:
    """Why an agent running as `euid` must not use a key file with this mode and
    owner (None: it may). Whoever can read the key can join the cluster and send
    offers as any user, so a root agent takes only a file private to root (0600 or
    stricter, owned by root: the socket group, whose members submit, must not read
    it), and no agent takes one that others can access."""
    mode = stat.S_IMODE(mode)
    if euid == 0:
        if owner != 0:
            return (
                f"{path}: key file is owned by uid {owner}, not root; a root agent refuses it:"
                f" run: chown root:root {path} && chmod 0600 {path}"
            )
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            return (
                f"{path}: key file is accessible by group/others (mode {mode:04o});"
                f" a root agent refuses it: run: chmod 0600 {path}"
            )
        return None
    if mode & stat.S_IRWXO:
        return (
            f"{path}: key file is accessible by others (mode {mode:04o}); refused:"
            f" run: chmod 0600 {path}"
        )
    return None


def permission_warning(path: str | os.PathLike[str], mode: int) -> str | None:
    """Group write exposes the cluster key to tampering (a non-root agent's file;
    what an agent refuses outright is `key_file_refusal`)."""
    if mode & (stat.S_IRWXO | stat.S_IWGRP):
        return (
            f"{path}: keyring is writable by group/others (mode {stat.S_IMODE(mode):04o});"
            f" run: chmod 0600 {path} (or 0640 for a swarm group)"
        )
    return None


# ------------------------------------------------------------------- replay window


class ReplayWindow:
    """Sliding window over one stream's counters: accepts each counter once, and
    nothing older than `size` below the highest seen."""

    __slots__ = ("bits", "mask", "size", "top")

    def __init__(self, size: int = DEFAULT_WINDOW) -> None:
        self.size = size
        self.mask = (1 << size) - 1
        self.top = -1  # highest counter accepted so far
        self.bits = 0  # bit i set = counter (top - i) seen

    def seen(self, counter: int) -> bool:
        """True if `counter` must be rejected (duplicate or too old)."""
        if counter > self.top:
            return False
        offset = self.top - counter
        if offset >= self.size:
            return True
        return bool((self.bits >> offset) & 1)

    def mark(self, counter: int) -> None:
        if counter > self.top:
            shift = counter - self.top
            self.bits = ((self.bits << shift) | 1) & self.mask if shift < self.size else 1
            self.top = counter
        else:
            self.bits |= 1 << (self.top - counter)


# ------------------------------------------------------------------------ sealing


@attrs.frozen
class Opened:
    """An authenticated packet: plaintext plus who sent it on which stream."""

    plaintext: bytes
    instance: bytes
    stream: int
    counter: int
    sent_at: float  # sender's wall clock, seconds

    @property
    def ident(self) -> bytes:
        """Sender instance + stream: what a reply binds to (see `bind`)."""
        return self.instance + self.stream.to_bytes(4, "big")


class SealStream:
    """One counter space of this sender. Stream 0 is the datagram stream; the
    transport takes a fresh one per TCP connection (`Sealer.new_stream`)."""

    def __init__(self, sealer: Sealer, instance: bytes, stream_id: int) -> None:
        self._sealer = sealer
        self.instance = instance
        self.stream_id = stream_id
        self.counter = 0  # next counter to use

    @property
    def ident(self) -> bytes:
        return self.instance + self.stream_id.to_bytes(4, "big")

    def seal(self, plaintext: bytes, now: float, bind: bytes = b"") -> bytes:
        counter = self.counter
        self.counter += 1
        return self._sealer._seal(self.instance, self.stream_id, counter, plaintext, now, bind)


class Sealer:
    """Seals and opens packets for one cluster with one keyring.

    `bind` (optional, both sides must agree) is extra associated data; the transport
    binds TCP replies to the request stream's `ident`, so a reply cannot be replayed
    into another connection.
    """

    def __init__(
        self,
        keyring: Keyring,
        cluster: str,
        *,
        max_skew: float = DEFAULT_MAX_SKEW,
        window: int = DEFAULT_WINDOW,
        max_streams: int = DEFAULT_MAX_STREAMS,
        instance_id: bytes | None = None,
    ) -> None:
        if instance_id is not None and len(instance_id) != INSTANCE_SIZE:
            raise ValueError(f"instance_id must be {INSTANCE_SIZE} bytes")
        if max_skew <= 0 or window <= 0 or max_streams <= 0:
            raise ValueError("max_skew, window and max_streams must be positive")
        self.cluster = cluster
        cl = cluster.encode("utf-8")
        self._cluster_ad = len(cl).to_bytes(2, "big") + cl
        self.max_skew = max_skew
        self.window = window
        self.max_streams = max_streams
        self.instance_id = instance_id if instance_id is not None else os.urandom(INSTANCE_SIZE)
        self._next_stream = 1
        self._datagrams = SealStream(self, self.instance_id, 0)
        self._windows: OrderedDict[tuple[bytes, int], ReplayWindow] = OrderedDict()
        self._aeads: OrderedDict[tuple[bytes, bytes], AESGCM] = OrderedDict()
        self.keyring = keyring
        self._keys: list[tuple[bytes, bytes]] = []  # (full fingerprint, key)
        self.reload(keyring)

    def reload(self, keyring: Keyring) -> None:
        """Swap keys (SIGHUP). Replay windows survive, so a reload opens no replay gap."""
        self.keyring = keyring
        self._keys = [(key_fingerprint(k), k) for k in keyring.keys]
        self._aeads.clear()

    # -- sending

    def seal(self, plaintext: bytes, now: float, bind: bytes = b"") -> bytes:
        """Seal one datagram (stream 0 of this process's instance)."""
        return self._datagrams.seal(plaintext, now, bind)

    def new_stream(self) -> SealStream:
        """A fresh counter space (one per TCP connection); ids never repeat for an
        instance, and the instance id is renewed if they would."""
        if self._next_stream > _MAX_STREAM_ID:
            self.instance_id = os.urandom(INSTANCE_SIZE)
            self._next_stream = 1
        sid = self._next_stream
        self._next_stream += 1
        return SealStream(self, self.instance_id, sid)

    def _aead(self, fp: bytes, key: bytes, instance: bytes) -> tuple[AESGCM, bool]:
        """The instance's subkey cipher and whether it came from the cache. Callers
        cache (`_remember`) only after a successful use, so forged instance ids
        cannot flush the cache."""
        aead = self._aeads.get((fp, instance))
        if aead is not None:
            self._aeads.move_to_end((fp, instance))
            return aead, True
        sub = HKDF(
            algorithm=hashes.SHA256(), length=KEY_SIZE, salt=instance, info=_HKDF_INFO
        ).derive(key)
        return AESGCM(sub), False

    def needs_derive(self, packet: bytes) -> bool:
        """True if opening `packet` would first derive a subkey (HKDF): its key hint
        matches a key of ours and its sender instance has never authenticated a packet
        here (or was evicted from the cache). Cheap (no crypto): the transport asks
        before it lets an unauthenticated source spend an HKDF (see
        swarm.cluster.ratelimit.SourceLimiter)."""
        if len(packet) < OVERHEAD:
            return False
        hint = bytes(packet[1 : 1 + HINT_SIZE])
        instance = bytes(packet[1 + HINT_SIZE : 1 + HINT_SIZE + INSTANCE_SIZE])
        return any(
            fp[:HINT_SIZE] == hint and (fp, instance) not in self._aeads for fp, _ in self._keys
        )

    def _remember(self, fp: bytes, instance: bytes, aead: AESGCM) -> None:
        self._aeads[(fp, instance)] = aead
        if len(self._aeads) > self.max_streams:
            self._aeads.popitem(last=False)

    def _seal(
        self,
        instance: bytes,
        stream: int,
        counter: int,
        plaintext: bytes,
        now: float,
        bind: bytes,
    ) -> bytes:
        fp, key = self._keys[0]
        sent_ms = max(0, int(now * 1000))
        header = _HEADER.pack(VERSION, fp[:HINT_SIZE], instance, stream, counter, sent_ms)
        nonce = stream.to_bytes(4, "big") + counter.to_bytes(8, "big")
        aead, cached = self._aead(fp, key, instance)
        if not cached:
            self._remember(fp, instance, aead)
        return header + aead.encrypt(nonce, plaintext, header + self._cluster_ad + bind)

    # -- receiving

    def open(self, packet: bytes, now: float, bind: bytes = b"") -> bytes:
        return self.open_info(packet, now, bind).plaintext

    def open_info(self, packet: bytes, now: float, bind: bytes = b"") -> Opened:
        """Authenticate, decrypt, then check freshness and replay, in that order, so
        that only authentic packets are ever counted as 'stale' or 'replay'."""
        if len(packet) < OVERHEAD:
            raise CryptoError("short", f"{len(packet)} bytes")
        version, hint, instance, stream, counter, sent_ms = _HEADER.unpack_from(packet)
        if version != VERSION:
            raise CryptoError("version", f"packet version {version}, want {VERSION}")
        header = bytes(packet[:HEADER_SIZE])
        nonce = stream.to_bytes(4, "big") + counter.to_bytes(8, "big")
        ad = header + self._cluster_ad + bind
        body = bytes(packet[HEADER_SIZE:])
        plaintext: bytes | None = None
        for fp, key in self._keys:
            if fp[:HINT_SIZE] != hint:
                continue
            aead, cached = self._aead(fp, key, instance)
            try:
                plaintext = aead.decrypt(nonce, body, ad)
            except InvalidTag:
                continue
            if not cached:
                self._remember(fp, instance, aead)
            break
        if plaintext is None:
            raise CryptoError("decrypt", "no key in the keyring authenticates this packet")
        if abs(now * 1000 - sent_ms) > self.max_skew * 1000:
            raise CryptoError("stale", f"sent {now - sent_ms / 1000:.1f}s from now")
        wkey = (instance, stream)
        win = self._windows.get(wkey)
        if win is None:
            win = ReplayWindow(self.window)
            self._windows[wkey] = win
            if len(self._windows) > self.max_streams:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(wkey)
        if win.seen(counter):
            raise CryptoError("replay", f"counter {counter} already seen or too old")
        win.mark(counter)
        return Opened(plaintext, instance, stream, counter, sent_ms / 1000)
