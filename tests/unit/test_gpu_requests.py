"""GPU request rules (Koordinator's DeviceShare), flag parsing and byte sizes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.model import GpuRequest
from swarm.policy import gpu, gpu_inventory
from swarm.policy.gpu import GpuRequestError, parse_bytes, request_from_flags, validate

GiB = 2**30


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((None, None, None, None), None),
        ((30, None, None, None), GpuRequest(core=30, memory_ratio=30)),
        ((100, None, None, None), GpuRequest(core=100, memory_ratio=100)),
        ((300, None, None, None), GpuRequest(core=300, memory_ratio=300)),
        ((None, 50, 8 * GiB, None), GpuRequest(core=50, memory_bytes=8 * GiB)),
        ((None, 50, None, 25), GpuRequest(core=50, memory_ratio=25)),
        ((None, 200, None, 200), GpuRequest(core=200, memory_ratio=200)),
        ((None, 200, None, 100), GpuRequest(core=200, memory_ratio=100)),
        ((None, 200, 10 * GiB, None), GpuRequest(core=200, memory_bytes=10 * GiB)),
    ],
)
def test_valid_flags(
    flags: tuple[int | None, int | None, int | None, int | None], expected: GpuRequest | None
) -> None:
    assert request_from_flags(*flags) == expected


@pytest.mark.parametrize(
    ("flags", "rule", "words"),
    [
        ((150, None, None, None), gpu.RULE_MULTIPLE_OF_100, "multiple of 100"),
        ((0, None, None, None), gpu.RULE_POSITIVE, "positive"),
        ((-5, None, None, None), gpu.RULE_POSITIVE, "positive"),
        ((50, 50, None, None), gpu.RULE_EXCLUSIVE, "--gpu cannot be combined"),
        ((50, None, None, 10), gpu.RULE_EXCLUSIVE, "--gpu cannot be combined"),
        ((None, 50, None, None), gpu.RULE_CORE_NEEDS_MEMORY, "needs gpu-memory"),
        ((None, None, GiB, None), gpu.RULE_MEMORY_NEEDS_CORE, "need --gpu-core"),
        ((None, None, None, 50), gpu.RULE_MEMORY_NEEDS_CORE, "need --gpu-core"),
        ((None, 50, GiB, 50), gpu.RULE_MEMORY_XOR_RATIO, "not both"),
        ((None, 250, None, 200), gpu.RULE_MULTIPLE_OF_100, "whole GPUs"),
        ((None, 200, None, 150), gpu.RULE_MULTIPLE_OF_100, "gpu-memory-ratio"),
        ((None, 50, None, 200), gpu.RULE_RATIO_WITHIN_CORE, "exceeds"),
        ((None, 200, None, 300), gpu.RULE_RATIO_WITHIN_CORE, "exceeds"),
        ((None, 50, 0, None), gpu.RULE_POSITIVE, "gpu-memory must be positive"),
        ((None, 50, -1, None), gpu.RULE_POSITIVE, "positive"),
        ((None, 0, None, 10), gpu.RULE_POSITIVE, "gpu-core must be positive"),
        ((None, 50, None, 0), gpu.RULE_POSITIVE, "gpu-memory-ratio must be positive"),
    ],
)
def test_invalid_flags_name_the_rule(
    flags: tuple[int | None, int | None, int | None, int | None], rule: str, words: str
) -> None:
    with pytest.raises(GpuRequestError) as info:
        request_from_flags(*flags)
    assert info.value.rule == rule
    assert words in str(info.value)
    assert rule in str(info.value)


def test_non_integers_are_rejected_with_a_rule() -> None:
    with pytest.raises(GpuRequestError) as info:
        validate(GpuRequest(core=True))
    assert info.value.rule == gpu.RULE_TYPE
    with pytest.raises(GpuRequestError) as info:
        validate(GpuRequest(core=50, memory_ratio=2.5))  # type: ignore[arg-type]
    assert info.value.rule == gpu.RULE_TYPE


def _oracle(gpu_: int | None, core: int | None, mem: int | None, ratio: int | None) -> bool:
    """An independent restatement of the rules: is this flag combination valid?"""

    def pct_ok(v: int) -> bool:
        return v > 0 and (v <= 100 or v % 100 == 0)

    if gpu_ is not None:
        return core is None and mem is None and ratio is None and pct_ok(gpu_)
    if core is None:
        return mem is None and ratio is None
    if not pct_ok(core) or (mem is None) == (ratio is None):
        return False
    if mem is not None:
        return mem > 0
    assert ratio is not None
    span = core if core % 100 == 0 else 100
    return pct_ok(ratio) and ratio <= max(span, 100)


opt_pct = st.none() | st.integers(-10, 1000)


@settings(max_examples=300, deadline=None)
@given(opt_pct, opt_pct, st.none() | st.integers(-1, 2**40), opt_pct)
def test_flags_agree_with_oracle(
    g: int | None, core: int | None, mem: int | None, ratio: int | None
) -> None:
    ok = _oracle(g, core, mem, ratio)
    try:
        req = request_from_flags(g, core, mem, ratio)
    except GpuRequestError as e:
        assert not ok, f"valid flags rejected: {e}"
        assert e.rule in gpu.RULES
        return
    assert ok
    if req is not None:
        validate(req)  # anything built is valid on its own
        assert (req.memory_bytes is None) != (req.memory_ratio is None)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1000000", 1_000_000),
        (1_000_000, 1_000_000),
        ("0", 0),
        ("512M", 512 * 2**20),
        ("512m", 512 * 2**20),
        ("8GiB", 8 * 2**30),
        ("8 gib", 8 * 2**30),
        ("8Gi", 8 * 2**30),
        ("80GB", 80 * 10**9),
        ("1.5G", 3 * 2**29),
        ("2KiB", 2048),
        ("2KB", 2000),
        ("100B", 100),
        ("1T", 2**40),
        (" 4 MiB ", 4 * 2**20),
        (".5K", 512),
    ],
)
def test_parse_bytes(text: str | int, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "cannot read"),
        ("abc", "cannot read"),
        ("-5G", "cannot read"),
        ("8 GiBs", "unknown size unit"),
        ("8XB", "unknown size unit"),
        ("1e9", "cannot read"),
        ("1,5G", "cannot read"),
        (-1, "negative"),
        (True, "expected a size"),
        (1.5, "expected a size"),
        (None, "expected a size"),
    ],
)
def test_parse_bytes_errors(text: object, words: str) -> None:
    with pytest.raises(gpu.ByteSizeError) as info:
        parse_bytes(text)  # type: ignore[arg-type]
    assert words in str(info.value)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**50), st.sampled_from(["", "B", "K", "KiB", "MB", "G", "GiB", "TB"]))
def test_parse_bytes_integer_amounts(n: int, unit: str) -> None:
    assert parse_bytes(f"{n}{unit}") == n * gpu_inventory._UNITS[unit.lower()]


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=12))
def test_parse_bytes_never_crashes_otherwise(text: str) -> None:
    try:
        assert parse_bytes(text) >= 0
    except gpu.ByteSizeError:
        pass
