"""What an experiment hands back, and how it is written: CSV, markdown, the doc page."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs


def fmt(x: Any, digits: int = 3) -> str:
    """Numbers for tables: `digits` significant digits, ints as ints, nan as '-'."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        if math.isinf(x):
            return "inf"
        if x != 0 and (abs(x) >= 10**digits or abs(x) < 10 ** -(digits - 1)):
            return f"{x:.{digits}g}"
        return f"{x:.{digits}g}" if abs(x) >= 1 else f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return str(x)


@attrs.frozen
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    @classmethod
    def of(cls, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
        return cls(tuple(headers), tuple(tuple(r) for r in rows))

    def csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.headers)
        for r in self.rows:
            w.writerow([repr(x) if isinstance(x, float) else x for x in r])
        return buf.getvalue()

    def markdown(self, digits: int = 3) -> str:
        head = "| " + " | ".join(self.headers) + " |"
        sep = "| " + " | ".join("---" for _ in self.headers) + " |"
        body = ["| " + " | ".join(fmt(x, digits) for x in r) + " |" for r in self.rows]
        return "\n".join([head, sep, *body])

    def column(self, name: str) -> list[Any]:
        i = self.headers.index(name)
        return [r[i] for r in self.rows]


@attrs.define
class Outcome:
    """One experiment's results: tables (the first is the main CSV), figures, prose."""

    name: str
    title: str
    setup: str  # markdown: parameters, staleness model, what is compared
    tables: list[tuple[str, Table]] = attrs.Factory(list)  # (file stem, table)
    figures: list[tuple[str, str]] = attrs.Factory(list)  # (file name, caption)
    findings: str = ""  # markdown: what it shows, vs the published result
    checks: dict[str, bool] = attrs.Factory(dict)  # claims the issue asks to verify
    seconds: float = 0.0
    extra: dict[str, Any] = attrs.Factory(dict)

    def section(self, fig_prefix: str = "") -> str:
        """The markdown section for docs/experiments.md (figure paths prefixed)."""
        out = [f"## {self.title}", "", self.setup.strip(), ""]
        for stem, table in self.tables:
            out += [f"*{stem}.csv*", "", table.markdown(), ""]
        for name, caption in self.figures:
            out += [f"![{caption}]({fig_prefix}{name})", "", f"*{caption}*", ""]
        if self.findings:
            out += [self.findings.strip(), ""]
        if self.checks:
            out.append("Checks:")
            out.append("")
            for claim, ok in self.checks.items():
                out.append(f"- [{'x' if ok else ' '}] {claim}")
            out.append("")
        out.append(f"<sub>run time {self.seconds:.0f} s</sub>")
        out.append("")
        return "\n".join(out)

    def write(self, out: Path) -> list[Path]:
        """Write every table as CSV and the section as NAME.md; figures are written by
        the experiment itself. Returns the files written."""
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for stem, table in self.tables:
            p = out / f"{stem}.csv"
            p.write_text(table.csv(), encoding="utf-8")
            written.append(p)
        p = out / f"{self.name}.md"
        p.write_text(self.section(), encoding="utf-8")
        written.append(p)
        return written


def doc_page(outcomes: Sequence[Outcome], fig_dir: str, intro: str) -> str:
    """docs/experiments.md: the intro, then every experiment's section."""
    parts = [intro.strip(), ""]
    for o in outcomes:
        parts.append(o.section(fig_prefix=fig_dir.rstrip("/") + "/"))
    return "\n".join(parts)


T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_ci(xs: Sequence[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95 % confidence interval (t distribution;
    nan with one value)."""
    n = len(xs)
    mu = sum(xs) / n
    if n < 2:
        return mu, math.nan
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (n - 1))
    return mu, T975.get(n - 1, 1.96) * sd / math.sqrt(n)


def length_table(
    cells: Sequence[tuple[str, float, float]], count: int
) -> tuple[Table, tuple[str, float]]:
    """Run length (issue 24): each cell's value at `count` tasks and at twice that
    (same seed), as a table, and the cell that moved most with its change in %."""
    rows = [(name, a, b, 100.0 * (b / a - 1.0) if a else math.nan) for name, a, b in cells]
    table = Table.of(["cell", f"at {count:,} tasks", f"at {2 * count:,}", "change %"], rows)
    worst = max(rows, key=lambda r: -1.0 if math.isnan(r[3]) else abs(r[3]))
    return table, (str(worst[0]), float(worst[3]))
