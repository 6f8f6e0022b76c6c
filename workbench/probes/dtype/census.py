"""Dtype census of a model: parameters and buffers per component, loaded for real or predicted on meta.

    >>> census = dtype_census(model)                    # doctest: +SKIP
    >>> census.dtypes_by_component()["vision"]          # doctest: +SKIP
    {'bfloat16': 261, 'uint8': 130}

`predicted_quantized_census` builds the model on the meta device and lets transformers' own bitsandbytes
quantizer replace its Linear layers, so the prediction follows the installed releases; which weights get packed
is the quantizer's `param_needs_quantization`, and their storage dtype is the quantization config's.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from workbench.display.nodes import Details, Display, Figure, Heading, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.display.svg_charts import stacked_bars_svg
from workbench.findings import Finding
from workbench.model.components import ComponentClassifier
from workbench.model.dtypes import dtype_name
from workbench.model.quantized_prediction import predicted_tensors
from workbench.model.tied import tied_aliases, tied_notes

COLUMNS = ["component", "kind", "dtype", "tensors", "elements", "bytes", "trainable"]


@dataclasses.dataclass(repr=False)
class DtypeCensus(ProbeResult):
    label: str  # e.g. "loaded (bf16)", "predicted 4bit", "real 4bit"
    rows: list[dict[str, Any]]
    component_map: dict[str, str]
    tied: dict[str, str] = dataclasses.field(default_factory=dict)  # alias -> canonical name, counted once
    checkpoint: DtypeCensus | None = None  # the checkpoint's header census, beside the loaded model's (evidence)

    def findings(self) -> list[Finding]:
        """`dtype.census`: always pass; the census is evidence, not a verdict."""
        evidence: dict[str, Any] = {"parameters": self.dtypes_by_component("parameter"),
                                    "buffers": self.dtypes_by_component("buffer"),
                                    "component_map": self.component_map, "tied": self.tied}
        if self.checkpoint is not None:
            evidence["checkpoint_headers"] = self.checkpoint.dtypes_by_component()
        detail = self.summary("parameter")
        if self.tied:
            detail += f". {self.tied_note()}"
        if self.dtypes_by_component("parameter").get("other"):
            detail += (". Tensors in 'other' belong to no module the model's structure names (README: how "
                       "components are found); map them with a parameters file's components: patterns if that is "
                       "wrong.")
        return [Finding("dtype.census", "pass", f"Dtype census of the {self.label} model", detail, evidence)]

    def tied_note(self) -> str:
        """'tied (counted once): lm_head.weight = model.embed_tokens.weight', or '' when nothing is tied."""
        return "tied (counted once): " + "; ".join(tied_notes(self.tied)) if self.tied else ""

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=COLUMNS)

    def counts(self, kind: str | None = None) -> dict[tuple[str, str], int]:
        """(component, dtype) -> tensor count, over parameters, buffers or both."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for r in self.rows:
            if kind is None or r["kind"] == kind:
                out[(r["component"], r["dtype"])] += r["tensors"]
        return dict(out)

    def dtypes_by_component(self, kind: str | None = "parameter") -> dict[str, dict[str, int]]:
        """component -> {dtype: tensors} over parameters, buffers, or both (None: what `plot` and the report's chart
        draw)."""
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for (component, dtype), n in sorted(self.counts(kind).items()):
            out[component][dtype] = n
        return dict(out)

    def summary(self, kind: str = "parameter") -> str:
        """One line per component: 'vision: bfloat16 261 + uint8 130; language: ...'."""
        return "; ".join(
            f"{comp}: " + " + ".join(f"{d} {n}" for d, n in dtypes.items())
            for comp, dtypes in self.dtypes_by_component(kind).items()
        )

    def plot(self, ax=None, value: str = "tensors"):
        """Stacked bars as a matplotlib figure, for interactive use (`ax`: draw into your own): one bar per component,
        one colour per dtype (parameters and buffers together). The report draws the same bars as SVG
        (`dtypes_by_component(None)`), without importing matplotlib."""
        import matplotlib.pyplot as plt

        frame = self.to_frame()
        table = frame.pivot_table(index="component", columns="dtype", values=value, aggfunc="sum", fill_value=0)
        if ax is None:
            _, ax = plt.subplots(figsize=(6.5, 2.8))
        table.plot.barh(stacked=True, ax=ax, width=0.7)
        ax.set_title(f"{self.label}: {value} per component by dtype", fontsize=10)
        ax.set_xlabel(value)
        ax.set_ylabel("")
        ax.legend(fontsize=8, loc="lower right")
        ax.figure.tight_layout()
        return ax.figure

    def details(self):
        return Display(Heading(self.label), Paragraph(self.summary()),
                       Paragraph(self.tied_note()) if self.tied else None,
                       Figure(stacked_bars_svg(self.dtypes_by_component(None), "tensors",
                                               f"{self.label}: tensors per component by dtype"),
                              f"{self.label}: tensors per component by dtype"),
                       Details("table", Table.from_frame(self.to_frame())))


def _count(rows: dict, component: str, kind: str, dtype: str, elements: int, nbytes: int, trainable: bool) -> None:
    row = rows.setdefault((component, kind, dtype), [0, 0, 0, 0])
    row[0] += 1
    row[1] += elements
    row[2] += nbytes
    row[3] += int(trainable)


def _rows(counted: dict) -> list[dict[str, Any]]:
    return [dict(zip(COLUMNS, [c, k, d, *vals])) for (c, k, d), vals in sorted(counted.items())]


def dtype_census(model: nn.Module, classifier: ComponentClassifier | None = None, label: str = "loaded",
                 overrides: Mapping[str, Iterable[str]] | None = None) -> DtypeCensus:
    """Census of the model as it is in memory: parameters (incl. packed bitsandbytes weights) and buffers; a tied
    parameter is counted once, under the name `named_parameters()` keeps, its other names in `tied`."""
    classifier = classifier or ComponentClassifier.from_model(model, overrides)
    counted: dict = {}
    for name, p in model.named_parameters():
        _count(counted, classifier.component_of(name), "parameter", dtype_name(p.dtype), p.numel(),
               p.numel() * p.element_size(), p.requires_grad)
    for name, b in model.named_buffers():
        _count(counted, classifier.component_of(name), "buffer", dtype_name(b.dtype), b.numel(),
               b.numel() * b.element_size(), False)
    return DtypeCensus(label, _rows(counted), classifier.describe(), tied_aliases(model))


def predicted_quantized_census(config, quant: str, dtype: torch.dtype | None = None,
                               overrides: Mapping[str, Iterable[str]] | None = None) -> DtypeCensus:
    """What `from_pretrained(quantization_config=...)` will hold, predicted on the meta device (no weight read)."""
    skeleton, tensors = predicted_tensors(config, quant, dtype)
    classifier = ComponentClassifier.from_model(skeleton, overrides)
    counted: dict = {}
    for t in tensors:
        _count(counted, classifier.component_of(t.name), t.kind, dtype_name(t.dtype), t.elements, t.nbytes, False)
    return DtypeCensus(f"predicted {quant} (meta device)", _rows(counted), classifier.describe(),
                       tied_aliases(skeleton))


def census_differences(predicted: DtypeCensus, real: DtypeCensus) -> list[dict[str, Any]]:
    """(component, dtype) tensor counts that differ between two censuses; empty when they agree."""
    a, b = predicted.counts(), real.counts()
    return [{"component": c, "dtype": d, predicted.label: a.get((c, d), 0), real.label: b.get((c, d), 0)}
            for c, d in sorted(set(a) | set(b)) if a.get((c, d), 0) != b.get((c, d), 0)]


