import sys
import xml.etree.ElementTree as ET

import pytest
import torch
from torch import nn

from workbench.display.svg_charts import PALETTE, nice_step, stacked_bars_svg
from workbench.probes.dtype.census import dtype_census

SVG = "{http://www.w3.org/2000/svg}"


def bars_of(svg: str) -> dict[str, list[tuple[float, str]]]:
    """row label -> [(width, colour)] of its bars, read back from the SVG (each bar's tooltip names its row)."""
    out: dict[str, list[tuple[float, str]]] = {}
    for rect in ET.fromstring(svg).iter(f"{SVG}rect"):
        title = rect.find(f"{SVG}title")
        if title is not None:
            out.setdefault(title.text.split(" · ")[0], []).append((float(rect.get("width")), rect.get("fill")))
    return out


def test_bars_are_stacked_in_proportion_with_one_colour_per_series():
    svg = stacked_bars_svg({"decoder": {"bfloat16": 300}, "head": {"bfloat16": 50, "float32": 100}}, "tensors",
                           title="loaded: tensors per component by dtype")
    bars = bars_of(svg)
    assert sum(w for w, _ in bars["head"]) == pytest.approx(bars["decoder"][0][0] / 2, abs=0.15)
    assert bars["head"][1][0] == pytest.approx(2 * bars["head"][0][0], abs=0.15)
    assert bars["decoder"][0][1] == bars["head"][0][1] == PALETTE[0] and bars["head"][1][1] == PALETTE[1]
    texts = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]
    assert {"decoder", "head", "bfloat16", "float32", "tensors", "loaded: tensors per component by dtype"} <= set(texts)
    assert "300" in texts  # the axis reaches the longest bar


def test_names_are_escaped():
    svg = stacked_bars_svg({"<script>": {"a&b": 1}}, "x<y")
    ET.fromstring(svg)  # still well-formed
    assert "<script>" not in svg and "&lt;script&gt;" in svg


@pytest.mark.parametrize("largest, step", [(300, 100), (7, 2), (1, 0.2), (0, 1), (45_000, 10_000)])
def test_ticks_are_round(largest, step):
    assert nice_step(largest) == pytest.approx(step)


def test_the_census_chart_needs_no_matplotlib(monkeypatch):
    model = nn.Sequential(nn.Linear(4, 4).to(torch.bfloat16), nn.LayerNorm(4))
    census = dtype_census(model)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # any import of it raises ImportError
    html = census.details().html()
    bars = bars_of(html[html.index("<svg"):html.index("</svg>") + 6])
    drawn = {row: len(widths) for row, widths in bars.items()}
    assert drawn == {row: len(dtypes) for row, dtypes in census.dtypes_by_component(None).items()}


def test_a_line_puts_higher_values_higher_and_spans_its_marks():
    from workbench.display.svg_charts import line_svg

    svg = ET.fromstring(line_svg([(0, 9.0), (1, 3.0), (2, 6.0)], "block", "bits", "headroom",
                                 [(4, "4 bits", "#ef6c00", True), (-1, "floor", "#c62828", False)]))
    dots = {c.find(f"{SVG}title").text: float(c.get("cy")) for c in svg.iter(f"{SVG}circle")}
    assert dots["0: 9"] < dots["2: 6"] < dots["1: 3"]  # SVG's y grows downwards
    frame = next(svg.iter(f"{SVG}rect"))
    marks = [float(line.get("y1")) for line in svg.iter(f"{SVG}line")  # across the plot, not the legend's swatches
             if line.get("stroke") in ("#ef6c00", "#c62828") and line.get("x2") != line.get("x1")
             and float(line.get("x2")) - float(line.get("x1")) == float(frame.get("width"))]
    assert len(marks) == 2
    top, bottom = float(frame.get("y")), float(frame.get("y")) + float(frame.get("height"))
    assert all(top <= y <= bottom for y in marks + list(dots.values()))
    texts = {t.text for t in svg.iter(f"{SVG}text")}
    assert {"block", "bits", "headroom", "4 bits", "floor", "0", "1", "2"} <= texts


def test_values_that_are_not_finite_are_left_out_as_matplotlib_leaves_them():
    """An all-zero residual's fp16 headroom is inf (a checkpoint whose weights are all 0); a NaN activation's, -inf
    and NaN where it is read so: the points that are finite are drawn, the others left out, and a chart of none of
    them still draws its marks."""
    import math

    from workbench.display.svg_charts import line_svg

    svg = ET.fromstring(line_svg([(0, math.inf), (1, 5.0), (2, math.nan), (3, -math.inf), (4, 7.0)], "block", "bits",
                                 marks=[(4, "4 bits", "#ef6c00", True)]))
    assert [c.find(f"{SVG}title").text for c in svg.iter(f"{SVG}circle")] == ["1: 5", "4: 7"]
    assert "nan" not in ET.tostring(svg, encoding="unicode") and "inf" not in ET.tostring(svg, encoding="unicode")
    empty = ET.fromstring(line_svg([(0, math.inf), (1, math.inf)], "block", "bits", marks=[(0, "overflow", "red", False)]))
    assert not list(empty.iter(f"{SVG}circle")) and "overflow" in {t.text for t in empty.iter(f"{SVG}text")}
