"""Data locality: a Bloom-filter digest of the data keys a node holds.

A data key names data a task wants near it: a dataset name ("imagenet") or an
absolute path ("/data/imagenet"). Every node summarises the keys it holds in a
digest that rides in each load report, so a placer can prefer nodes that probably
hold a task's data without any node listing its directories to the cluster.

The digest must be small (it is in every report) and mean the same on every machine
(it is compared across processes and hosts), hence a fixed 512-bit Bloom filter with
4 bit positions per key taken from blake2b; Python's `hash()` is salted per process
and would make every digest meaningless elsewhere. A Bloom filter has false positives
(a node "may hold" a key it does not) and never false negatives, which suits a
preference: a wrong guess costs a copy, never a refusal. With n keys ORed into
m = 512 bits and k = 4 hashes the false-positive rate is about
(1 - exp(-k n / m)) ** k: about 0.04% at 20 keys, 1% at 50, 9% at 100, 39% at
200 and 92% at 500 (`false_positive_rate`); a node with many keys still gets a
valid digest, only a less selective one (past a few hundred keys it says "maybe"
to almost anything).

Keys are data, never opened: the agent (root) does not read a path because a user
named it. `valid_data_key` still keeps them plain so that they log, display and
compare cleanly.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Iterable

DIGEST_BYTES = 64
"""Digest size in bytes (512 bits): small enough for every load report."""

HASHES = 4
"""Bit positions per key (k); optimal (m/n ln 2) for about 90 keys in 512 bits."""

BITS = DIGEST_BYTES * 8

MAX_KEY_LEN = 256

DATA_KEY_RULE = (
    "a data key is 1 to 256 printable characters (no NUL or newline), either a name of "
    "letters, digits, '_', '.', ':' and '-' that starts with a letter, digit or '_' "
    "(at most 128 characters), or an absolute path that starts with '/' and has no "
    "'..' component and no '//'"
)
"""What `valid_data_key` accepts, in words for error messages and docs."""

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,127}")


def valid_data_key(key: str) -> bool:
    """Whether `key` follows `DATA_KEY_RULE`.

    Paths are checked for shape only (no `..`, no `//`) so that one place has one
    spelling a placer can match; nothing here or elsewhere opens them.
    """
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LEN:
        return False
    if not key.isprintable():  # excludes NUL, newline and other control characters
        return False
    if key.startswith("/"):
        return "//" not in key and ".." not in key.split("/")
    return _NAME_RE.fullmatch(key) is not None


@functools.lru_cache(maxsize=4096)  # placement asks about the same few keys per node
def _positions(key: str) -> tuple[int, ...]:
    """The HASHES bit positions of a key: blake2b-128, cut into little-endian 32-bit
    words, each modulo BITS. Stable across processes, machines and Python versions."""
    h = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return tuple(int.from_bytes(h[4 * i : 4 * i + 4], "little") % BITS for i in range(HASHES))


def digest(keys: Iterable[str]) -> bytes:
    """The Bloom filter of `keys`: b"" for none (a node with no data sends nothing),
    else exactly DIGEST_BYTES bytes. Bit p is bit (p % 8), least significant first,
    of byte p // 8. Order and repeats of `keys` do not matter."""
    bits = bytearray(DIGEST_BYTES)
    any_key = False
    for key in keys:
        any_key = True
        for p in _positions(key):
            bits[p >> 3] |= 1 << (p & 7)
    return bytes(bits) if any_key else b""


def may_hold(digest: bytes, key: str) -> bool:
    """Whether a node with this digest may hold `key`: never False for a key that went
    into the digest, sometimes True for one that did not (`false_positive_rate`).

    An empty digest holds nothing, and so does one of the wrong length: the wire
    decoder rejects those; here they are simply no evidence of data.
    """
    if len(digest) != DIGEST_BYTES:
        return False
    return all(digest[p >> 3] & (1 << (p & 7)) for p in _positions(key))


def false_positive_rate(n_keys: int) -> float:
    """The expected rate at which `may_hold` says True for a key not among `n_keys`
    distinct keys: (1 - exp(-k n / m)) ** k with k = HASHES and m = 512 bits."""
    if n_keys <= 0:
        return 0.0
    return float((1.0 - math.exp(-HASHES * n_keys / BITS)) ** HASHES)
