"""Dependencies' pure parts (issue 23): `--after` and when it holds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.policy import depends as dp

A, B = "t0000000000000001", "t0000000000000002"


def test_the_grammar() -> None:
    got = dp.parse_after([f"ok:{A},{B}", f"any:{A}[3]", f"NotOk:{B}"])
    assert got == (
        dp.After(dp.Cond.OK, (dp.Parent(A), dp.Parent(B))),
        dp.After(dp.Cond.ANY, (dp.Parent(A, 3),)),
        dp.After(dp.Cond.NOTOK, (dp.Parent(B),)),
    )
    assert [a.text() for a in got] == [f"ok:{A},{B}", f"any:{A}[3]", f"notok:{B}"]


@pytest.mark.parametrize(
    ("clause", "says"),
    [
        (A, "is not COND:ID"),
        (f"later:{A}", "unknown condition"),
        ("ok:", "is not a task id"),
        ("ok:../etc", "is not a task id"),
        (f"ok:{A}[x]", "is not a task id"),
        (f"ok:{A},{A}", "names a parent twice"),
    ],
)
def test_bad_clauses_are_refused_naming_the_field(clause: str, says: str) -> None:
    with pytest.raises(dp.DependencyError, match=r"^after: ") as e:
        dp.parse_after([clause])
    assert says in str(e.value)


def test_a_task_cannot_wait_for_itself() -> None:
    with pytest.raises(dp.DependencyError, match="cannot wait for itself"):
        dp.check_not_self(dp.parse_after([f"ok:{A}[2]"]), A)


def verdict(clauses: list[str], states: dict[str, str | None]) -> tuple[dp.Verdict, str]:
    return dp.judge(dp.parse_after(clauses), lambda p: states.get(p.text()))


def test_ok_any_notok() -> None:
    assert verdict([f"ok:{A},{B}"], {A: "succeeded"})[0] is dp.Verdict.WAIT
    assert verdict([f"ok:{A},{B}"], {A: "succeeded", B: "succeeded"})[0] is dp.Verdict.READY
    v, why = verdict([f"ok:{A},{B}"], {B: "failed"})  # A still running: already hopeless
    assert v is dp.Verdict.NEVER and f"{B} ended failed" in why
    assert verdict([f"any:{A}"], {A: "cancelled"})[0] is dp.Verdict.READY
    assert verdict([f"notok:{A}"], {A: "lost"})[0] is dp.Verdict.READY
    v, why = verdict([f"notok:{A}"], {A: "succeeded"})
    assert v is dp.Verdict.NEVER and "needs it to fail" in why
    # every clause must hold
    assert (
        verdict([f"ok:{A}", f"notok:{B}"], {A: "succeeded", B: "succeeded"})[0] is dp.Verdict.NEVER
    )
    assert verdict([f"ok:{A}", f"any:{B}"], {A: "succeeded"})[0] is dp.Verdict.WAIT


def test_a_whole_array_as_a_parent() -> None:
    assert dp.array_final(["succeeded", None]) is None
    assert dp.array_final(["succeeded", "succeeded"]) == "succeeded"
    assert dp.array_final(["succeeded", "cancelled", "failed"]) == "failed"


def test_find_cycle() -> None:
    assert dp.find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    cyc = dp.find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]})
    assert cyc is not None and cyc[0] == cyc[-1] and set(cyc) == {"a", "b", "c"}
    chain = {str(i): [str(i + 1)] for i in range(50_000)}  # no recursion limit
    assert dp.find_cycle(chain) is None
    chain["50000"] = ["0"]
    assert dp.find_cycle(chain) is not None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["ok", "any", "notok"]), min_size=1, max_size=4),
    st.lists(
        st.sampled_from([None, "succeeded", "failed", "cancelled", "lost"]), min_size=4, max_size=4
    ),
)
def test_judge_agrees_with_the_definition(conds: list[str], states: list[str | None]) -> None:
    ids = [f"t000000000000000{i}" for i in range(4)]
    clauses = [f"{c}:{ids[i]}" for i, c in enumerate(conds)]
    v, _ = dp.judge(dp.parse_after(clauses), lambda p: states[ids.index(p.task_id)])

    def holds(c: str, s: str | None) -> bool | None:
        if s is None:
            return None
        return {"ok": s == "succeeded", "any": True, "notok": s != "succeeded"}[c]

    each = [holds(c, states[i]) for i, c in enumerate(conds)]
    want = (
        dp.Verdict.NEVER if False in each else dp.Verdict.WAIT if None in each else dp.Verdict.READY
    )
    assert v is want
