"""The sharing policy's configuration: classes, groups, quotas; every error names its key."""

from __future__ import annotations

import pytest

from swarm.policy.sharing import Sharing, SharingError, parse


def test_defaults_are_the_four_classes_with_normal_by_default() -> None:
    s = parse(None, None)
    assert dict(s.classes) == {"low": 10, "normal": 50, "high": 100, "system": 1000}
    assert s.default_priority == 50
    assert s.name_of(100) == "high" and s.name_of(77) == "77"


def test_configured_classes_and_groups() -> None:
    s = parse(
        {"batch": 1, "prod": 500, "urgent": 900},
        {
            "eng": {"quota-min": 4, "quota-max": 20},
            "ml": {"parent": "eng", "quota-min": 3, "members": ["alice"], "max-priority": "prod"},
        },
        default_class="batch",
    )
    assert s.default_priority == 1
    ml = s.group("ml")
    assert ml is not None and ml.max_priority == 500 and ml.parent == "eng"
    assert s.may_use_group("alice", 1000, "ml", frozenset()) is None
    assert "not a member" in (s.may_use_group("bob", 1001, "ml", frozenset({"ml"})) or "")
    assert s.may_use_group("root", 0, "ml", frozenset()) is None  # root may use any group
    # an unconfigured group: its Unix members may use it
    assert s.may_use_group("bob", 1001, "staff", frozenset({"staff"})) is None
    assert s.may_use_group("bob", 1001, "wheel", frozenset({"staff"})) is not None
    assert s.may_use_priority(1000, "ml", 500) is None
    assert "up to prod" in (s.may_use_priority(1000, "ml", 900) or "")


def test_system_class_is_for_root_only() -> None:
    s = Sharing()
    assert "root only" in (s.may_use_priority(1000, "", 1000) or "")
    assert s.may_use_priority(0, "", 1000) is None
    assert s.may_use_priority(1000, "", 100) is None  # high: allowed by default


@pytest.mark.parametrize(
    ("prio", "groups", "key"),
    [
        ({"a": "x"}, None, "priorities.a"),
        ({"a": 1, "b": 1}, None, "priorities"),
        ({"bad name": 1}, None, "priorities.bad name"),
        (None, {"g": {"colour": 1}}, "groups.g.colour"),
        (None, {"g": {"max-priority": "nope"}}, "groups.g.max-priority"),
        (None, {"g": {"quota-min": 5, "quota-max": 2}}, "groups.g.quota-min"),
        (None, {"g": {"parent": "h"}}, "groups.g.parent"),
        (None, {"g": {"parent": "h"}, "h": {"parent": "g"}}, "groups.g.parent"),
        (
            None,
            {
                "p": {"quota-min": 4},
                "a": {"parent": "p", "quota-min": 3},
                "b": {"parent": "p", "quota-min": 2},
            },
            "groups.p.quota-min",
        ),
        (None, {"g": {"quota-max": {"gpu": 1}}}, "groups.g.quota-max.gpu"),
        (None, {"g": {"members": "alice"}}, "groups.g.members"),
        (None, {"../etc": {}}, "groups.../etc"),
    ],
)
def test_a_bad_key_is_named(prio: object, groups: object, key: str) -> None:
    with pytest.raises(SharingError) as e:
        parse(prio, groups)  # type: ignore[arg-type]
    assert e.value.key == key


def test_default_class_must_exist() -> None:
    with pytest.raises(SharingError) as e:
        parse({"a": 1}, None)
    assert e.value.key == "default-priority"
