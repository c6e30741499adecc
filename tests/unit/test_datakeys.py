"""The data-key digest: a Bloom filter with no false negatives, stable across
processes, near its stated false-positive rate; and the key rule."""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.policy import datakeys as dk

NAME_FIRST = string.ascii_letters + string.digits + "_"
NAME_REST = NAME_FIRST + ".:-"

names = st.builds(
    lambda a, b: a + b,
    st.sampled_from(NAME_FIRST),
    st.text(alphabet=NAME_REST, max_size=127),
)
path_parts = st.text(alphabet=string.ascii_letters + string.digits + "._- ", min_size=1).filter(
    lambda s: s != ".."
)
paths = st.lists(path_parts, min_size=1, max_size=8).map(lambda ps: "/" + "/".join(ps))
keys = st.one_of(names, paths).filter(dk.valid_data_key)


@settings(max_examples=300, deadline=None)
@given(st.sets(keys, max_size=200))
def test_no_false_negatives(members: set[str]) -> None:
    d = dk.digest(members)
    if not members:
        assert d == b""
    else:
        assert len(d) == dk.DIGEST_BYTES
    for key in members:
        assert dk.may_hold(d, key)


@given(keys)
def test_empty_digest_holds_nothing(key: str) -> None:
    assert not dk.may_hold(b"", key)
    assert not dk.may_hold(dk.digest([]), key)


def test_wrong_length_holds_nothing() -> None:
    full = b"\xff" * dk.DIGEST_BYTES
    assert dk.may_hold(full, "imagenet")
    assert not dk.may_hold(full[:-1], "imagenet")
    assert not dk.may_hold(full + b"\xff", "imagenet")


def test_digest_is_stable() -> None:
    """Fixed bytes: the digest is compared across machines and Python processes, so a
    change here breaks every mixed-version cluster."""
    expected = (
        "0000000400100000000000001000000000000000000000000000000000000000"
        "0000000000000000000000000000000002000001001000000004000002000000"
    )
    assert dk.digest(["imagenet", "/data/x"]).hex() == expected
    assert dk.digest(["/data/x", "imagenet", "imagenet"]).hex() == expected


def test_measured_false_positive_rate() -> None:
    rng = random.Random(21)
    members = [f"set-{rng.getrandbits(64):016x}" for _ in range(50)]
    d = dk.digest(members)
    trials = 10_000
    hits = sum(dk.may_hold(d, f"other-{rng.getrandbits(64):016x}") for _ in range(trials))
    expected = dk.false_positive_rate(50)
    assert expected / 2 <= hits / trials <= expected * 2, (hits, expected)


def test_false_positive_rate_formula() -> None:
    assert dk.false_positive_rate(0) == 0.0
    assert dk.false_positive_rate(-3) == 0.0
    assert dk.false_positive_rate(50) == pytest.approx(0.010934, rel=1e-3)
    rates = [dk.false_positive_rate(n) for n in (1, 10, 100, 1000)]
    assert rates == sorted(rates) and rates[-1] < 1.0


@pytest.mark.parametrize(
    "key",
    [
        "imagenet",
        "_x",
        "a",
        "coco:2017",
        "llama-3.1.v2",
        "x" * 128,
        "/",
        "/data/x",
        "/data/my set/x.tar",
        "/data/.hidden",
        "/data/x/",
        "/" + "a" * 255,
    ],
)
def test_valid_keys(key: str) -> None:
    assert dk.valid_data_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "",
        "-x",
        ".x",
        ":x",
        "x" * 129,
        "has space",
        "a/b",
        "relative/path",
        "name\n",
        "na\x00me",
        "/data\n/x",
        "/data/\x00",
        "/data//x",
        "//data",
        "/data/../etc/shadow",
        "/..",
        "/data/..",
        "/" + "a" * 256,
        "imagenét",
    ],
)
def test_invalid_keys(key: str) -> None:
    assert not dk.valid_data_key(key)


def test_rule_text_names_the_limits() -> None:
    assert "256" in dk.DATA_KEY_RULE and ".." in dk.DATA_KEY_RULE and "//" in dk.DATA_KEY_RULE
