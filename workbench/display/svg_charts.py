"""The charts a healthy diagnosis draws, as inline SVG: stacked horizontal bars and a line over integer steps.

    stacked_bars_svg({"decoder": {"bfloat16": 288}, "head": {"bfloat16": 1, "float32": 1}}, "tensors", title=...)
    line_svg([(0, 9.1), (1, 8.7)], "decoder block", "bits", title=..., marks=[(4, "4 bits", "#ef6c00", True)])

The report's HTML draws them in microseconds and without matplotlib, whose import alone (~0.3 s on 2 cores) would
be the costliest step of a notebook that needs one chart; they stay sharp at any zoom. Every name is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from workbench.display.nodes import esc

# matplotlib's "tab10" cycle, the colours the same chart drawn with pandas' .plot shows
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
BAR, GAP, LABEL_CHARS, WIDTH = 18, 8, 24, 440  # pixels, characters of a row's label kept
DASHED = ' stroke-dasharray="5,4"'


def nice_step(largest: float, ticks: int = 5) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks up to `largest`."""
    if largest <= 0:
        return 1.0
    raw = largest / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def stacked_bars_svg(rows: dict[str, dict[str, float]], unit: str, title: str = "") -> str:
    """`rows`: label -> {series: value}, drawn top to bottom in the order given; series coloured in first-seen
    order. `unit`: the axis' label."""
    series = list(dict.fromkeys(s for values in rows.values() for s in values))
    colour = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)}
    largest = max((sum(v.values()) for v in rows.values()), default=0)
    step = nice_step(largest)
    end = step * max(1, math.ceil(largest / step))
    left, top = 8 + 7 * min(LABEL_CHARS, max((len(r) for r in rows), default=0)), 22 if title else 6
    height = top + len(rows) * (BAR + GAP) + 34 + 16 * math.ceil(len(series) / 4)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + WIDTH + 30}" height="{height}" '
             f'font-family="sans-serif" font-size="11" role="img">']
    if title:
        parts.append(f'<text x="{left}" y="14" font-size="12" font-weight="bold">{esc(title)}</text>')
    for i, (label, values) in enumerate(rows.items()):
        y, x = top + i * (BAR + GAP), left
        parts.append(f'<text x="{left - 6}" y="{y + BAR - 5}" text-anchor="end">{esc(label[:LABEL_CHARS])}</text>')
        for name, value in values.items():
            width = WIDTH * value / end
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{BAR}" fill="{colour[name]}">'
                         f'<title>{esc(label)} · {esc(name)}: {value:,g} {esc(unit)}</title></rect>')
            x += width
    axis = top + len(rows) * (BAR + GAP)
    parts.append(f'<line x1="{left}" y1="{axis}" x2="{left + WIDTH}" y2="{axis}" stroke="#555"/>')
    for k in range(round(end / step) + 1):
        x = left + WIDTH * k * step / end
        parts.append(f'<line x1="{x:.1f}" y1="{axis}" x2="{x:.1f}" y2="{axis + 4}" stroke="#555"/>'
                     f'<text x="{x:.1f}" y="{axis + 15}" text-anchor="middle" fill="#444">{k * step:,g}</text>')
    parts.append(f'<text x="{left + WIDTH / 2}" y="{axis + 28}" text-anchor="middle" fill="#444">{esc(unit)}</text>')
    for i, name in enumerate(series):
        x, y = left + (i % 4) * 110, axis + 36 + 16 * (i // 4)
        parts.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{colour[name]}"/>'
                     f'<text x="{x + 14}" y="{y + 9}">{esc(name)}</text>')
    return "".join(parts) + "</svg>"


def line_svg(points: Sequence[tuple[int, float]], xlabel: str, ylabel: str, title: str = "",
             marks: Sequence[tuple[float, str, str, bool]] = ()) -> str:
    """`points`: (integer step, value), drawn as a line with a dot per point; a value that is not finite (the fp16
    headroom of an all-zero residual is inf) is left out, as matplotlib leaves it out. `marks`: horizontal reference
    lines (value, label, colour, dashed), named in the legend; the value axis spans them and every point drawn."""
    points = [(x, v) for x, v in points if math.isfinite(v)]
    values = [v for _, v in points] + [m[0] for m in marks]
    low, high = min(values, default=0.0), max(values, default=1.0)
    step = nice_step(high - low or 1.0)
    low, high = step * math.floor(low / step), step * math.ceil(high / step)
    high = high if high > low else low + step
    steps = [x for x, _ in points]
    first, last = min(steps, default=0), max(steps, default=1)
    last = last if last > first else first + 1
    left, top, plot_w, plot_h = 60, 22 if title else 8, WIDTH, 150

    def x_of(x: float) -> float:
        return left + plot_w * (x - first) / (last - first)

    def y_of(v: float) -> float:
        return top + plot_h * (high - v) / (high - low)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + plot_w + 30}" height="{top + plot_h + 60}" '
             f'font-family="sans-serif" font-size="11" role="img">']
    if title:
        parts.append(f'<text x="{left}" y="14" font-size="12" font-weight="bold">{esc(title)}</text>')
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#555"/>')
    for k in range(round((high - low) / step) + 1):
        value = low + k * step
        y = y_of(value)
        parts.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}" stroke="#555"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#444">{value:,g}</text>')
    tick = max(1, math.ceil(nice_step(last - first, 10)))
    for x in range(first, last + 1, tick):
        parts.append(f'<line x1="{x_of(x):.1f}" y1="{top + plot_h}" x2="{x_of(x):.1f}" y2="{top + plot_h + 4}" '
                     f'stroke="#555"/><text x="{x_of(x):.1f}" y="{top + plot_h + 15}" text-anchor="middle" '
                     f'fill="#444">{x}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h + 29}" text-anchor="middle" fill="#444">'
                 f'{esc(xlabel)}</text><text x="12" y="{top + plot_h / 2}" text-anchor="middle" fill="#444" '
                 f'transform="rotate(-90 12 {top + plot_h / 2})">{esc(ylabel)}</text>')
    for value, label, colour, dashed in marks:
        parts.append(f'<line x1="{left}" y1="{y_of(value):.1f}" x2="{left + plot_w}" y2="{y_of(value):.1f}" '
                     f'stroke="{colour}"{DASHED if dashed else ""}/>')
    if points:
        path = " ".join(f"{x_of(x):.1f},{y_of(v):.1f}" for x, v in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{PALETTE[0]}" stroke-width="1.5"/>')
        parts.extend(f'<circle cx="{x_of(x):.1f}" cy="{y_of(v):.1f}" r="3" fill="{PALETTE[0]}"><title>{x}: {v:,g}'
                     '</title></circle>' for x, v in points)
    for i, (_, label, colour, dashed) in enumerate(marks):
        x, y = left + i * 110, top + plot_h + 40
        parts.append(f'<line x1="{x}" y1="{y}" x2="{x + 16}" y2="{y}" stroke="{colour}"'
                     f'{DASHED if dashed else ""}/><text x="{x + 20}" y="{y + 4}">{esc(label)}'
                     '</text>')
    return "".join(parts) + "</svg>"
