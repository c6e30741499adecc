"""Submit request validation: clear errors naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from swarm import request_checks, wire


def _spec(**fields: Any) -> Any:
    base: dict[str, Any] = {"argv": ["echo", "hi"]}
    base.update(fields)
    return request_checks.submit_spec(
        wire.Fields(base, "submit request"), uid=1000, user="u", home="n1", now=5.0
    )


def test_valid_submit_fills_identity_from_the_server() -> None:
    s = _spec(name="x", env={"A": "1"}, cwd="/tmp", weight=2.5)
    assert s.uid == 1000 and s.user == "u" and s.home == "n1" and s.submitted_at == 5.0
    assert s.argv == ("echo", "hi") and s.weight == 2.5 and s.id.startswith("t")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"argv": []}, "argv must not be empty"),
        ({"env": {"1BAD": "x"}}, "invalid environment variable name"),
        ({"env": {"SWARM_TASK_ID": "x"}}, "reserved"),
        ({"cwd": "relative/dir"}, "absolute"),
        ({"weight": 0}, "weight must be > 0"),
        ({"weight": -1}, "weight must be > 0"),
        ({"id": "has space"}, "invalid task id"),
        ({"uid": 0}, "unknown field"),
        ({"mem": 0}, "mem must be > 0"),
        ({"argv": ["a\x00b"]}, "NUL"),
    ],
)
def test_bad_submits(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(wire.SchemaError, match=message):
        _spec(**fields)
