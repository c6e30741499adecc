"""The report of a chaos run: one row per scenario, the faults of each with their
detection and convergence times, every violation by invariant, and the seed to replay."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .invariants import (
    ADOPTED,
    ALL,
    ARRAY_WHOLE,
    CONSTRAINT,
    COPIED,
    DEP_ORDER,
    ENCRYPTED,
    EVERY_RUN,
    GANG_PARTIAL,
    GANG_WHOLE,
    LATE_ONCE,
    OLD_HOME_WAITS,
    PRIORITY,
    RESTART_RERUN,
    SCALE,
)
from .scenario import ScenarioResult

BEGIN = "<!-- chaos-report:begin -->"
END = "<!-- chaos-report:end -->"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def markdown(results: Sequence[ScenarioResult], meta: dict[str, Any]) -> str:
    ok = all(r.passed for r in results)
    mode = f"{meta.get('mode')} mode"
    if meta.get("mode") == "loopback":
        mode += f" ({meta.get('mode_reason')}: only process faults and the transport shim)"
    lines = [
        f"Suite `{meta.get('suite')}`, {mode}, seed {meta.get('seed')}, "
        f"{meta.get('started')}, {meta.get('wall_s', 0):.0f} s in all, agents built from "
        f"{meta.get('code')}, {meta.get('host_cpus')} CPUs: "
        f"**{'PASSED' if ok else 'FAILED'}**.",
        "",
        "| scenario | seed | nodes | faults | submitted | acked | completed "
        "| succeeded / failed / lost(no-retry) | dup exec (marks / journal starts) | lost "
        "| detect s (median / max) "
        "| views agree after heal s (median / max) | after the last heal s "
        "| handoffs | transfers | share changes | invariants |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        st = r.states
        verdict = "all hold" if r.passed else "FAIL: " + ", ".join(r.violated or ["harness"])
        lines.append(
            f"| {r.name} | {r.seed} | {r.nodes} | {len(r.faults)} | {r.attempted} | {r.acked} "
            f"| {r.completed} "
            f"| {st.get('succeeded', 0)} / {st.get('failed', 0)} / {st.get('lost', 0)} "
            f"| {r.dup_exec} / {r.dup_starts} | {r.lost} | {r.detect_summary} "
            f"| {r.converge_summary} | {_fmt(r.final_converge_s)} | {r.handoffs} "
            f"| {r.transfers} | {r.drains} | {verdict} |"
        )
    checked = ", ".join(f"`{x}`" for x in ALL)
    prio = ", ".join(f"`{x}`" for x in PRIORITY)
    scale = ", ".join(f"`{x}`" for x in SCALE)
    lines += [
        "",
        f"Invariants checked: {checked}; `{ENCRYPTED}` in keyed scenarios; {prio} in the "
        f"priority scenario; `{CONSTRAINT}` in the labelled one; {scale} in the elastic "
        f"one; `{ADOPTED}` where a node is lost for good (home-loss); `{GANG_PARTIAL}` and "
        f"`{GANG_WHOLE}` in the gang scenario; `{ARRAY_WHOLE}` and `{DEP_ORDER}` in the "
        f"arrays scenario; `{LATE_ONCE}` in the late-binding one; "
        + ", ".join(f"`{x}`" for x in EVERY_RUN)
        + f" in every scenario; `{RESTART_RERUN}` where restarts are the only fault; "
        f"`{OLD_HOME_WAITS}` and `{COPIED}` where kills, restarts and losses are.",
        "",
    ]
    for r in results:
        lines.append(f"### {r.name} (seed {r.seed}, {r.wall_s:.0f} s)")
        lines.append("")
        if r.description:
            lines += [r.description[:1].upper() + r.description[1:] + ".", ""]
        refused = ", ".join(f"{k} {v}" for k, v in sorted(r.refused.items())) or "none"
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r.acked_by_kind.items()))
        lines.append(
            f"{r.attempted} submissions, {r.acked} acknowledged ({kinds}); not acknowledged: "
            f"{refused}. Replay: `python -m chaos.run --scenario {r.name} --seed {r.seed}`."
        )
        lines.append("")
        if r.faults:
            lines.append("| fault | at s | held s | detected after s | views agree after heal s |")
            lines.append("|---|---|---|---|---|")
            for f in r.faults:
                note = f" ({f.note})" if f.note else ""
                lines.append(
                    f"| {f.fault} | {f.start:.1f} | {f.hold:.1f} | {_fmt(f.detect_s)} "
                    f"| {_fmt(f.converge_s)}{note} |"
                )
            lines.append("")
        for n in r.notes:
            lines.append(f"- {n}")
        if r.error:
            lines.append(f"- harness error: {r.error}")
        for v in r.violations[:30]:
            lines.append(f"- VIOLATION {v}")
        if len(r.violations) > 30:
            lines.append(f"- ... {len(r.violations) - 30} more in report.json")
        lines.append("")
    return "\n".join(lines)


def write(out: Path, results: Sequence[ScenarioResult], meta: dict[str, Any]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js = out / "report.json"
    md = out / "report.md"
    js.write_text(
        json.dumps(
            {
                **meta,
                "passed": all(r.passed for r in results),
                "scenarios": [r.to_json() for r in results],
            },
            indent=2,
        )
    )
    md.write_text("# Chaos report\n\n" + markdown(results, meta) + "\n")
    return md, js


def update_docs(path: Path, results: Sequence[ScenarioResult], meta: dict[str, Any]) -> None:
    """Replace the figures between the report markers of docs/chaos.md."""
    text = path.read_text() if path.exists() else f"{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{markdown(results, meta)}\n{END}{tail}")
