"""The metrics module's pure parts: listen addresses and the optional dependency."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm.config import ConfigError
from swarm.runtime import metrics


def test_listen_addresses() -> None:
    assert metrics.parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert metrics.parse_listen("[::1]:9100") == ("::1", 9100)
    assert metrics.parse_listen(":9100") == ("0.0.0.0", 9100)
    assert metrics.parse_listen("0.0.0.0:0") == ("0.0.0.0", 0)
    for bad in ("9100", "host:", "host:port", "h:70000", ""):
        with pytest.raises(ConfigError, match="metrics"):
            metrics.parse_listen(bad)


@given(st.text(max_size=60))
def test_any_listen_text_is_parsed_or_refused(text: str) -> None:
    try:
        host, port = metrics.parse_listen(text)
    except ConfigError:
        return
    assert 0 <= port <= 65535 and isinstance(host, str)


def test_without_prometheus_client_only_metrics_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigError, match=r"pip install 'swarm\[metrics\]'"):
        metrics.require_client()
