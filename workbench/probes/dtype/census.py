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
import math
import re
from collections import defaultdict
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from workbench.model.components import ComponentClassifier
from workbench.model.tied import tied_aliases, tied_notes
from workbench.findings import Finding
from workbench.report.text import TextRepr

COLUMNS = ["component", "kind", "dtype", "tensors", "elements", "bytes", "trainable"]


@dataclasses.dataclass(repr=False)
class DtypeCensus(TextRepr):
    label: str  # e.g. "loaded (bf16)", "predicted 4bit", "real 4bit"
    rows: list[dict[str, Any]]
    component_map: dict[str, str]
    tied: dict[str, str] = dataclasses.field(default_factory=dict)  # alias -> canonical name, counted once

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

    def dtypes_by_component(self, kind: str = "parameter") -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for (component, dtype), n in sorted(self.counts(kind).items()):
            out[component][dtype] = n
        return dict(out)

    def summary(self, kind: str = "parameter") -> str:
        """The seeds' one-line form: 'vision: bfloat16 261 + uint8 130; language: ...'."""
        return "; ".join(
            f"{comp}: " + " + ".join(f"{d} {n}" for d, n in dtypes.items())
            for comp, dtypes in self.dtypes_by_component(kind).items()
        )

    def plot(self, ax=None, value: str = "tensors"):
        """Stacked bars: one bar per component, one colour per dtype (parameters and buffers together)."""
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

    def display(self):
        from workbench.report.display import Details, Display, Heading, Paragraph, Table
        from workbench.report.html import figure

        return Display(Heading(self.label), Paragraph(self.summary()),
                       Paragraph(self.tied_note()) if self.tied else None,
                       figure(self.plot, f"{self.label}: tensors per component by dtype"),
                       Details("table", Table.from_frame(self.to_frame())))


def _count(rows: dict, component: str, kind: str, dtype: str, elements: int, nbytes: int, trainable: bool) -> None:
    row = rows.setdefault((component, kind, dtype), [0, 0, 0, 0])
    row[0] += 1
    row[1] += elements
    row[2] += nbytes
    row[3] += int(trainable)


def _rows(counted: dict) -> list[dict[str, Any]]:
    return [dict(zip(COLUMNS, [c, k, d, *vals])) for (c, k, d), vals in sorted(counted.items())]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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


def keep_in_fp32_matcher(model: nn.Module):
    """A predicate for parameter names that from_pretrained keeps in fp32 (`_keep_in_fp32_modules[_strict]`)."""
    names = set(getattr(model, "_keep_in_fp32_modules", None) or ()) | set(
        getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if not names:
        return lambda name: False
    pattern = re.compile(r"(^|\.)(" + "|".join(re.escape(n) for n in sorted(names)) + r")(\.|$)")
    return lambda name: bool(pattern.search(name))


def predicted_quantized_census(config, quant: str, dtype: torch.dtype | None = None,
                               overrides: Mapping[str, Iterable[str]] | None = None) -> DtypeCensus:
    """What `from_pretrained(quantization_config=...)` will hold, predicted on the meta device (no weight read)."""
    from workbench.model.loading import bnb_config, config_dtype, meta_model, model_class_for

    dtype = dtype or config_dtype(config)
    qconfig = bnb_config(quant, compute_dtype=dtype if dtype != torch.float32 else torch.bfloat16,
                         model_class=model_class_for(config))
    skeleton, hf_quantizer = meta_model(config, dtype, qconfig)
    if quant == "4bit":
        storage = getattr(qconfig, "bnb_4bit_quant_storage", None) or torch.uint8
        storage = getattr(torch, storage) if isinstance(storage, str) else storage
        bits_per_value = 4
    else:
        storage, bits_per_value = torch.int8, 8
    storage_bits = torch.finfo(storage).bits if storage.is_floating_point else torch.iinfo(storage).bits
    keep_fp32 = keep_in_fp32_matcher(skeleton)
    classifier = ComponentClassifier.from_model(skeleton, overrides)
    counted: dict = {}
    for name, p in skeleton.named_parameters():
        if hf_quantizer is not None and hf_quantizer.param_needs_quantization(skeleton, name):
            elements = math.ceil(p.numel() * bits_per_value / storage_bits)
            pdtype = storage
        else:
            elements = p.numel()
            pdtype = (torch.float32 if keep_fp32(name) else dtype) if p.dtype.is_floating_point else p.dtype
        _count(counted, classifier.component_of(name), "parameter", dtype_name(pdtype), elements,
               elements * pdtype.itemsize, False)
    for name, b in skeleton.named_buffers():
        _count(counted, classifier.component_of(name), "buffer", dtype_name(b.dtype), b.numel(),
               b.numel() * b.element_size(), False)
    return DtypeCensus(f"predicted {quant} (meta device)", _rows(counted), classifier.describe(),
                       tied_aliases(skeleton))


def census_differences(predicted: DtypeCensus, real: DtypeCensus) -> list[dict[str, Any]]:
    """(component, dtype) tensor counts that differ between two censuses; empty when they agree."""
    a, b = predicted.counts(), real.counts()
    return [{"component": c, "dtype": d, predicted.label: a.get((c, d), 0), real.label: b.get((c, d), 0)}
            for c, d in sorted(set(a) | set(b)) if a.get((c, d), 0) != b.get((c, d), 0)]


def census_finding(census: DtypeCensus, static: Any | None = None) -> Finding:
    evidence: dict[str, Any] = {"parameters": census.dtypes_by_component("parameter"),
                                "buffers": census.dtypes_by_component("buffer"),
                                "component_map": census.component_map, "tied": census.tied}
    if static is not None:
        evidence["checkpoint_headers"] = static.dtypes_by_component()
    unassigned = census.dtypes_by_component("parameter").get("other")
    detail = census.summary("parameter")
    if census.tied:
        detail += f". {census.tied_note()}"
    if unassigned:
        detail += ". Tensors in 'other' belong to no module the model's structure names (README: how components " \
                  "are found); map them with a parameters file's components: patterns if that is wrong."
    return Finding("dtype.census", "pass", f"Dtype census of the {census.label} model", detail, evidence)


def quantized_finding(predictions: dict[str, DtypeCensus], reals: dict[str, DtypeCensus | str]) -> Finding:
    """pass when every real load agrees with its prediction; warn naming the cells that differ."""
    evidence: dict[str, Any] = {}
    differences: dict[str, list] = {}
    lines = []
    for quant, predicted in predictions.items():
        evidence[f"predicted_{quant}"] = predicted.dtypes_by_component("parameter")
        if predicted.tied:
            evidence[f"tied_{quant}"] = tied_notes(predicted.tied)
        real = reals.get(quant)
        if isinstance(real, DtypeCensus):
            evidence[f"real_{quant}"] = real.dtypes_by_component("parameter")
            diff = census_differences(predicted, real)
            if diff:
                differences[quant] = diff
            lines.append(f"{quant}: {predicted.summary()} (real load {'differs' if diff else 'agrees'})")
        else:
            lines.append(f"{quant}: {predicted.summary()} (predicted only: {real or 'not loaded'})")
    evidence["differences"] = differences
    tied = next((p.tied_note() for p in predictions.values() if p.tied), "")
    if tied:
        lines.append(tied)
    if differences:
        return Finding("dtype.quantized_census", "warn", "Quantized census: prediction and real load disagree",
                       "; ".join(lines), evidence,
                       "The installed transformers/bitsandbytes quantize differently than their meta-device "
                       "replacement predicts; trust the real census and report the difference.")
    return Finding("dtype.quantized_census", "pass", "Census under 4-bit / 8-bit quantization", "; ".join(lines),
                   evidence)
