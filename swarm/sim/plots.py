"""PNG figures for the experiments (matplotlib, the optional `sim` extra).

Small on purpose (about 7x4 inches at 80 dpi, a few dozen KB): they are committed
under docs/experiments/. matplotlib is imported inside the functions so that the
simulator itself runs without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

DPI = 80
SIZE = (7.0, 4.0)


@attrs.frozen
class Series:
    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    style: str = "o-"  # matplotlib format string
    lw: float = 1.5
    color: str | None = None  # None: the next colour of the cycle


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed (install the `sim` extra)."""


def _plt():  # type: ignore[no-untyped-def]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - the dev extra has it
        raise PlotUnavailable("plots need matplotlib: pip install 'swarm[sim]'") from e
    return plt


def _finish(  # type: ignore[no-untyped-def]
    plt, fig, ax, path: Path, title: str, xlabel: str | None, ylabel: str, grid_axis: str = "both"
) -> Path:
    """Titles, grid and legend in one style for every plot; write the PNG."""
    ax.set_title(title, fontsize=11)
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis=grid_axis, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def lines(
    path: Path,
    series: Sequence[Series],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    ylim: tuple[float | None, float | None] | None = None,
    hline: tuple[float, str] | None = None,
    note: str = "",
) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for s in series:
        extra = {} if s.color is None else {"color": s.color}
        ax.plot(list(s.xs), list(s.ys), s.style, label=s.label, lw=s.lw, ms=4, **extra)
    if hline is not None:
        ax.axhline(hline[0], color="grey", ls=":", lw=1, label=hline[1])
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if ylim is not None:
        ax.set_ylim(*ylim)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="grey")
    return _finish(plt, fig, ax, path, title, xlabel, ylabel)


def scatter(
    path: Path,
    groups: Sequence[Series],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    hline: tuple[float, str] | None = None,
) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for g in groups:
        extra = {} if g.color is None else {"color": g.color}
        ax.plot(list(g.xs), list(g.ys), g.style, label=g.label, ms=4, alpha=0.6, lw=0, **extra)
    if hline is not None:
        ax.axhline(hline[0], color="grey", ls=":", lw=1, label=hline[1])
    if logx:
        ax.set_xscale("log", base=2)
    return _finish(plt, fig, ax, path, title, xlabel, ylabel)


def bars(
    path: Path,
    categories: Sequence[str],
    groups: Sequence[tuple[str, Sequence[float]]],
    *,
    title: str,
    ylabel: str,
) -> Path:
    """Grouped bars: one group of bars per category, one colour per (label, values)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    k = max(1, len(groups))
    width = 0.8 / k
    for i, (label, values) in enumerate(groups):
        xs = [j + (i - (k - 1) / 2) * width for j in range(len(categories))]
        ax.bar(xs, list(values), width=width, label=label)
    ax.set_xticks(list(range(len(categories))))
    ax.set_xticklabels(list(categories), fontsize=8)
    return _finish(plt, fig, ax, path, title, None, ylabel, grid_axis="y")
