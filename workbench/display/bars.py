"""Horizontal stacked bars as inline SVG: one bar per row, one colour per series, a legend and a scaled axis.

    stacked_bars_svg({"decoder": {"bfloat16": 288}, "head": {"bfloat16": 1, "float32": 1}}, "tensors", title=...)

The report's HTML draws them in microseconds and without matplotlib, whose import alone (~0.35 s on 2 cores) would
be the costliest step of a notebook that needs one chart; they stay sharp at any zoom. Every name is escaped.
"""

from __future__ import annotations

import math

from workbench.display.nodes import esc

# matplotlib's "tab10" cycle, the colours the same chart drawn with pandas' .plot shows
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
BAR, GAP, LABEL_CHARS, WIDTH = 18, 8, 24, 440  # pixels, characters of a row's label kept


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
