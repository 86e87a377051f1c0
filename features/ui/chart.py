"""The runs chart's geometry: rows stored (bars, left axis) and reject rate (a line, right
axis) per run, oldest to newest, computed here and drawn as inline SVG by
``templates/runs_chart.html.j2`` (no script: each point's figures are in its ``<title>``,
which a browser shows on hover; every text goes through the template's autoescape)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from features.ui.runs import Run

WIDTH, HEIGHT = 860, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 60, 16, 46


@dataclass(frozen=True)
class Point:
    """One run on the chart: its bar (x, y, width, height), its rate point (cx, cy)."""

    run: Run
    x: float
    y: float
    w: float
    h: float
    cx: float
    cy: float | None  # None: no rows read, no rate


@dataclass(frozen=True)
class Tick:
    at: float  # pixel on the axis
    label: str


@dataclass(frozen=True)
class Chart:
    points: list[Point]
    rows_ticks: list[Tick]  # left axis, rows stored
    rate_ticks: list[Tick]  # right axis, reject rate
    time_ticks: list[Tick]  # x axis, the runs' last commit
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM

    @property
    def line(self) -> str:
        """The reject rate's polyline points (``x,y x,y``), runs without a rate skipped."""
        return " ".join(f"{p.cx:.1f},{p.cy:.1f}" for p in self.points if p.cy is not None)


def _nice(top: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= ``top`` (> 0)."""
    power = 10.0 ** math.floor(math.log10(top))
    return next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= top)


def _count(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:g}{unit}"
    return f"{value:g}"


def runs_chart(runs: Sequence[Run]) -> Chart | None:
    """The chart of ``runs`` (oldest first); None when there is none."""
    if not runs:
        return None
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    bottom = HEIGHT - BOTTOM
    rows_top = _nice(max(max(r.stored for r in runs), 1))
    rates = [r.reject_rate for r in runs if r.reject_rate is not None]
    rate_top = _nice(max(max(rates, default=0.0), 0.01))
    step = plot_w / len(runs)
    points = []
    for i, r in enumerate(runs):
        h = plot_h * r.stored / rows_top
        rate = r.reject_rate
        cy = None if rate is None else bottom - plot_h * rate / rate_top
        x = LEFT + i * step
        points.append(Point(r, x + step * 0.15, bottom - h, step * 0.7, h, x + step * 0.5, cy))
    rows_ticks = [Tick(bottom - plot_h * k / 4, _count(rows_top * k / 4)) for k in range(5)]
    rate_ticks = [Tick(bottom - plot_h * k / 4, f"{100 * rate_top * k / 4:g}%") for k in range(5)]
    every = max(1, math.ceil(len(runs) / 6))
    time_ticks = [Tick(LEFT + (i + 0.5) * step, "—" if r.last is None else f"{r.last:%m-%d %H:%M}")
                  for i, r in enumerate(runs) if i % every == 0 or i == len(runs) - 1]
    return Chart(points, rows_ticks, rate_ticks, time_ticks)
