"""Keyring parsing, sealing, rotation, replay and freshness checks."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.crypto import (
    HEADER_SIZE,
    OVERHEAD,
    CryptoError,
    Keyring,
    KeyringError,
    ReplayWindow,
    Sealer,
    generate_key,
    key_file_refusal,
    keygen_file_text,
)

NOW = 1_800_000_000.0
K1 = bytes(range(32))
K2 = bytes(range(100, 132))
K3 = bytes(32)


def ring(*keys: bytes) -> Keyring:
    return Keyring.from_keys(keys)


def reason(sealer: Sealer, packet: bytes, now: float = NOW) -> str:
    with pytest.raises(CryptoError) as ei:
        sealer.open(packet, now)
    return ei.value.reason


# ---------------------------------------------------------------- keyring file


def test_generate_key_is_32_random_bytes() -> None:
    a, b = generate_key(), generate_key()
    assert len(base64.b64decode(a)) == 32
    assert a != b


def test_keygen_file_parses_to_one_key() -> None:
    r = Keyring.parse(keygen_file_text())
    assert len(r.keys) == 1
    assert r.warnings == ()


def test_parse_comments_blanks_and_order() -> None:
    text = (
        "# header\n\n"
        f"{base64.b64encode(K2).decode()}   # new key\n"
        f"  {base64.b64encode(K1).decode()}\n"
    )
    r = Keyring.parse(text, "ring")
    assert r.keys == (K2, K1)
    assert r.primary == K2
    assert len(r.fingerprints()) == 2 and r.fingerprints()[0] != r.fingerprints()[1]


def test_duplicate_key_warns() -> None:
    line = base64.b64encode(K1).decode()
    r = Keyring.parse(f"{line}\n{line}\n", "ring")
    assert r.keys == (K1,)
    assert r.warnings == ("ring:2: duplicate key ignored",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "ring: keyring has no keys"),
        ("# only comments\n\n", "ring: keyring has no keys"),
        ("not-base64!\n", "ring:1: not valid base64"),
        (f"# c\n{base64.b64encode(b'short').decode()}\n", "ring:2: key is 5 bytes, want 32"),
        (f"{generate_key()} {generate_key()}\n", "ring:1: expected one base64 key per line"),
    ],
)
def test_parse_errors_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(KeyringError) as ei:
        Keyring.parse(text, "ring")
    assert message in str(ei.value)


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(KeyringError, match="cannot read keyring"):
        Keyring.load(tmp_path / "nope")


def test_load_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "keys"
    p.write_bytes(b"\xff\xfe\x00")
    p.chmod(0o600)
    with pytest.raises(KeyringError, match="not UTF-8"):
        Keyring.load(p)


def test_load_private_file_has_no_warning(tmp_path: Path) -> None:
    p = tmp_path / "keys"
    p.write_text(keygen_file_text())
    p.chmod(0o600)
    owner = p.stat().st_uid
    assert Keyring.load(p, euid=owner).warnings == ()
    p.chmod(0o640)  # a non-root agent may share the file with its group
    assert Keyring.load(p, euid=owner if owner else 1000).warnings == ()


def test_load_group_writable_warns_or_refuses(tmp_path: Path) -> None:
    p = tmp_path / "keys"
    p.write_text(keygen_file_text())
    p.chmod(0o660)
    r = Keyring.load(p, euid=1000)
    assert len(r.warnings) == 1 and "0660" in r.warnings[0] and str(p) in r.warnings[0]
    with pytest.raises(KeyringError, match="writable by group/others"):
        Keyring.load(p, strict_mode=True, euid=1000)


@pytest.mark.parametrize(
    ("mode", "owner", "euid", "refused"),
    [
        (0o600, 0, 0, None),
        (0o400, 0, 0, None),
        (0o640, 0, 0, "accessible by group/others (mode 0640)"),
        (0o644, 0, 0, "accessible by group/others (mode 0644)"),
        (0o604, 0, 0, "accessible by group/others"),
        (0o600, 1000, 0, "owned by uid 1000, not root"),
        (0o640, 0, 1000, None),  # root:swarm 0640 for an agent running as swarm
        (0o600, 1000, 1000, None),
        (0o644, 1000, 1000, "accessible by others (mode 0644)"),
    ],
)
def test_key_file_refusal(mode: int, owner: int, euid: int, refused: str | None) -> None:
    why = key_file_refusal("/etc/swarm/keyring", 0o100000 | mode, owner, euid)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why
        assert why.startswith("/etc/swarm/keyring: ") and "chmod 0600 /etc/swarm/keyring" in why


def test_load_refuses_world_readable_file(tmp_path: Path) -> None:
    p = tmp_path / "keys"
    p.write_text(keygen_file_text())
    p.chmod(0o644)
    for euid in (0, 1000):
        with pytest.raises(KeyringError, match="0644") as ei:
            Keyring.load(p, euid=euid)
        assert str(p) in str(ei.value)


def test_keyring_rejects_bad_keys() -> None:
    with pytest.raises(KeyringError):
        Keyring.from_keys([])
    with pytest.raises(KeyringError):
        Keyring.from_keys([b"x" * 31])


# ---------------------------------------------------------------------- sealing


def test_round_trip_and_overhead() -> None:
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod")
    for msg in (b"", b"hello", os.urandom(1400)):
        pkt = a.seal(msg, NOW)
        assert len(pkt) == len(msg) + OVERHEAD
        assert b.open(pkt, NOW + 0.5) == msg


def test_open_info_reports_sender() -> None:
    a = Sealer(ring(K1), "prod", instance_id=b"AAAAAAAA")
    b = Sealer(ring(K1), "prod")
    b.open(a.seal(b"x", NOW), NOW)
    info = b.open_info(a.seal(b"y", NOW + 1.2345), NOW + 2)
    assert (info.plaintext, info.instance, info.stream, info.counter) == (b"y", b"AAAAAAAA", 0, 1)
    assert info.sent_at == pytest.approx(NOW + 1.234)
    assert info.ident == b"AAAAAAAA\x00\x00\x00\x00"


def test_ciphertext_differs_for_same_plaintext() -> None:
    a = Sealer(ring(K1), "prod")
    assert a.seal(b"same", NOW)[HEADER_SIZE:] != a.seal(b"same", NOW)[HEADER_SIZE:]


def test_tamper_any_byte_fails() -> None:
    a = Sealer(ring(K1), "prod")
    pkt = a.seal(b"payload to protect", NOW)
    for i in range(len(pkt)):
        b = Sealer(ring(K1), "prod")
        bad = bytearray(pkt)
        bad[i] ^= 0x01
        with pytest.raises(CryptoError):
            b.open(bytes(bad), NOW)
    # and the original still opens: failed attempts left no trace in the window
    b = Sealer(ring(K1), "prod")
    for i in range(len(pkt)):
        bad = bytearray(pkt)
        bad[i] ^= 0x80
        with pytest.raises(CryptoError):
            b.open(bytes(bad), NOW)
    assert b.open(pkt, NOW) == b"payload to protect"


def test_truncated_and_bad_version() -> None:
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod")
    pkt = a.seal(b"abc", NOW)
    assert reason(b, pkt[: OVERHEAD - 1]) == "short"
    assert reason(b, b"") == "short"
    assert reason(b, b"\x02" + pkt[1:]) == "version"
    assert reason(b, pkt[:-1]) == "decrypt"


def test_wrong_key_and_other_cluster_fail_decrypt() -> None:
    a = Sealer(ring(K1), "prod")
    pkt = a.seal(b"x", NOW)
    assert reason(Sealer(ring(K2), "prod"), pkt) == "decrypt"
    assert reason(Sealer(ring(K1), "staging"), pkt) == "decrypt"
    assert reason(Sealer(ring(K2, K3), "prod"), pkt) == "decrypt"


def test_bind_must_match() -> None:
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod")
    pkt = a.seal(b"reply", NOW, bind=b"conn-1")
    assert reason(b, pkt) == "decrypt"
    assert b.open(pkt, NOW, bind=b"conn-1") == b"reply"


def test_rotation_interoperates_at_every_step() -> None:
    """The documented procedure: add k2 second, move it first, drop k1. At each step
    some nodes lag one step behind; every pair must still talk both ways."""
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod")

    def both_ways() -> None:
        assert b.open(a.seal(b"a->b", NOW), NOW) == b"a->b"
        assert a.open(b.seal(b"b->a", NOW), NOW) == b"b->a"

    a.reload(ring(K1, K2))  # step 1 on A, B lags
    both_ways()
    b.reload(ring(K1, K2))  # step 1 everywhere; step 2 on A, B lags
    a.reload(ring(K2, K1))
    both_ways()
    b.reload(ring(K2, K1))  # step 2 everywhere
    both_ways()
    a.reload(ring(K2))  # step 3 on A, B lags
    both_ways()
    b.reload(ring(K2))
    both_ways()

    # A node that missed the rotation entirely can no longer talk.
    c = Sealer(ring(K1), "prod")
    assert reason(c, a.seal(b"a->c", NOW)) == "decrypt"


def test_new_key_first_cannot_be_read_by_lagging_node() -> None:
    """Why the procedure adds the new key second first: A=[k2,k1], B=[k1] fails a->b."""
    a = Sealer(ring(K2, K1), "prod")
    b = Sealer(ring(K1), "prod")
    assert reason(b, a.seal(b"x", NOW)) == "decrypt"
    assert a.open(b.seal(b"y", NOW), NOW) == b"y"


def test_reload_keeps_replay_windows() -> None:
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod")
    pkt = a.seal(b"x", NOW)
    b.open(pkt, NOW)
    b.reload(ring(K2, K1))
    assert reason(b, pkt) == "replay"


# ------------------------------------------------------------ replay and staleness


def test_replay_of_same_packet() -> None:
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod")
    pkt = a.seal(b"once", NOW)
    assert b.open(pkt, NOW) == b"once"
    assert reason(b, pkt) == "replay"


def test_reordering_within_window_is_accepted() -> None:
    a = Sealer(ring(K1), "prod", window=64)
    b = Sealer(ring(K1), "prod", window=64)
    pkts = [a.seal(str(i).encode(), NOW) for i in range(100)]
    assert b.open(pkts[99], NOW) == b"99"
    assert b.open(pkts[40], NOW) == b"40"  # 59 behind: inside the window
    assert reason(b, pkts[40]) == "replay"
    assert reason(b, pkts[35]) == "replay"  # 64 behind: fell out of the window
    assert b.open(pkts[98], NOW) == b"98"


def test_streams_have_separate_windows() -> None:
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod")
    s1, s2 = a.new_stream(), a.new_stream()
    assert s1.stream_id != s2.stream_id and s1.stream_id != 0
    assert b.open_info(s1.seal(b"1", NOW), NOW).counter == 0
    assert b.open_info(s2.seal(b"2", NOW), NOW).counter == 0
    assert b.open_info(a.seal(b"d", NOW), NOW).stream == 0


def test_stale_and_future_packets() -> None:
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod", max_skew=30)
    assert reason(b, a.seal(b"old", NOW - 31)) == "stale"
    assert reason(b, a.seal(b"future", NOW + 31)) == "stale"
    assert b.open(a.seal(b"ok", NOW - 29), NOW) == b"ok"


def test_forgotten_stream_still_protected_by_send_time() -> None:
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod", max_streams=2)
    pkt = a.seal(b"x", NOW)
    b.open(pkt, NOW)
    for _ in range(3):  # evict a's datagram stream from b's LRU
        b.open(a.new_stream().seal(b"y", NOW), NOW)
    assert b.open(pkt, NOW + 1) == b"x"  # forgotten: accepted once more...
    assert reason(b, pkt, NOW + 61) == "stale"  # ...but never after max_skew


def test_replay_window_unit() -> None:
    w = ReplayWindow(8)
    for n in (5, 3, 7, 0):
        assert not w.seen(n)
        w.mark(n)
    assert w.seen(5) and w.seen(3) and w.seen(7)
    assert w.seen(0)  # 7 below the top: inside the window, already marked
    assert not w.seen(1)
    w.mark(20)
    assert w.seen(12)  # 8 below top: outside
    assert not w.seen(13) and not w.seen(19)
    assert w.seen(20)


def test_sealer_validates_arguments() -> None:
    with pytest.raises(ValueError):
        Sealer(ring(K1), "c", instance_id=b"short")
    with pytest.raises(ValueError):
        Sealer(ring(K1), "c", max_skew=0)


# ----------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_open_random_bytes_only_raises_crypto_error(data: bytes) -> None:
    b = Sealer(ring(K1), "prod")
    with pytest.raises(CryptoError):
        b.open(data, NOW)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_forgeries_with_a_valid_header_prefix_fail_decrypt(body: bytes) -> None:
    """Random bodies behind our version byte and key hint reach the AEAD and fail there."""
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod")
    prefix = a.seal(b"", NOW)[:5]  # version + key hint
    packet = prefix + body
    with pytest.raises(CryptoError) as ei:
        b.open(packet, NOW)
    assert ei.value.reason == ("short" if len(packet) < OVERHEAD else "decrypt")


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=64), st.integers(0, 200), st.integers(0, 255))
def test_mutated_sealed_packets_never_open(msg: bytes, pos: int, xor: int) -> None:
    a = Sealer(ring(K1), "prod")
    b = Sealer(ring(K1), "prod")
    pkt = bytearray(a.seal(msg, NOW))
    if xor == 0 or pos >= len(pkt):
        assert b.open(bytes(pkt), NOW) == msg
        return
    pkt[pos] ^= xor
    with pytest.raises(CryptoError):
        b.open(bytes(pkt), NOW)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3000), max_size=200))
def test_window_accepts_each_counter_at_most_once(counters: list[int]) -> None:
    w = ReplayWindow(1024)
    accepted: set[int] = set()
    for n in counters:
        if not w.seen(n):
            assert n not in accepted
            accepted.add(n)
            w.mark(n)
        else:
            assert n in accepted or n <= w.top - 1024
