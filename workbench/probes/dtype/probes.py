"""The probes of notebook 01 (dtype distribution), each a result that displays itself and yields findings."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path
from typing import Any

from workbench.probes.dtype.census import (DtypeCensus, census_finding, dtype_census, predicted_quantized_census,
                              quantized_finding)
from workbench.probes.dtype.headers import CheckpointResult, component_overrides
from workbench.model.components import ComponentClassifier
from workbench.model.tied import tied_notes
from workbench.findings import Finding, worst_verdict
from workbench.probes.dtype.islands import Islands, fp32_islands
from workbench.report.text import TextRepr

DEFAULT_REAL_QUANT_MAX_BYTES = 128 * 1024**2  # the prediction is the answer; a real load verifies it only when cheap


@dataclasses.dataclass(repr=False)
class LoadedCensusResult(TextRepr):
    census: DtypeCensus
    static: CheckpointResult | None

    def findings(self) -> list[Finding]:
        return [census_finding(self.census, self.static.censuses[0] if self.static else None)]

    def display(self):
        return self.census.display()


def loaded_census_probe(prepared, target, static: CheckpointResult | None = None) -> LoadedCensusResult:
    label = f"loaded ({target.setup} set-up, quant {target.quant})"
    return LoadedCensusResult(dtype_census(prepared.model, label=label, overrides=component_overrides(target)),
                              static)


@dataclasses.dataclass(repr=False)
class QuantizedResult(TextRepr):
    predictions: dict[str, DtypeCensus]
    reals: dict[str, DtypeCensus | str]  # a census, or why there is none
    comparison: Any  # pandas DataFrame: the seeds' table, one row per scenario

    def findings(self) -> list[Finding]:
        return [quantized_finding(self.predictions, self.reals)]

    def display(self):
        from workbench.report.display import Display, Heading, Table

        return Display(Heading("Parameter dtypes per component, by scenario"), Table.from_frame(self.comparison))


def _real_quantized_census(target, quant: str, overrides) -> DtypeCensus | str:
    from workbench.model.loading import load_pretrained

    try:
        model = load_pretrained(target.model_dir, quant=quant, trust_remote_code=target.trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - bitsandbytes may not load on this machine: say so, keep the prediction
        return f"real {quant} load failed here: {type(exc).__name__}: {str(exc)[:200]}"
    try:
        return dtype_census(model, label=f"real {quant} (bitsandbytes)", overrides=overrides)
    finally:
        del model
        gc.collect()


def quantized_census_probe(target, loaded: LoadedCensusResult | None = None, static: CheckpointResult | None = None,
                            real_max_bytes: int | None = None,
                            compare: list[str] | tuple[str, ...] | None = None) -> QuantizedResult:
    """4-bit and 8-bit censuses predicted on meta; verified by a real load when the checkpoint is small enough.
    `real_max_bytes` and `compare` default to the parameters file's real_quant_max_bytes and compare."""
    import pandas as pd

    from workbench.model.loading import auto_config

    if real_max_bytes is None:
        real_max_bytes = int(target.params.get("real_quant_max_bytes", DEFAULT_REAL_QUANT_MAX_BYTES))
    if compare is None:
        compare = target.params.get("compare", [])

    overrides = component_overrides(target)
    config = auto_config(target.model_dir, trust_remote_code=target.trust_remote_code)
    weight_bytes = sum(i.weight_bytes for i in static.inspections[:1]) if static else None
    predictions, reals = {}, {}
    for quant in ("4bit", "8bit"):
        predictions[quant] = predicted_quantized_census(config, quant, overrides=overrides)
        if weight_bytes is None:
            reals[quant] = "not loaded: the checkpoint's size is unknown (its header census did not run)"
        elif weight_bytes > real_max_bytes:
            reals[quant] = (f"not loaded: {weight_bytes / 1e9:.1f} GB of weights is above real_quant_max_bytes "
                            f"({real_max_bytes / 1e9:.1f} GB)")
        else:
            reals[quant] = _real_quantized_census(target, quant, overrides)

    rows = []
    if static:
        for census in static.censuses:
            rows.append({"scenario": f"checkpoint headers ({census.rows[0]['source'] if census.rows else ''})",
                         **_summaries(census.dtypes_by_component(), census.tied)})
    if loaded:
        rows.append({"scenario": loaded.census.label,
                     **_summaries(loaded.census.dtypes_by_component(), loaded.census.tied)})
    for quant in predictions:
        rows.append({"scenario": predictions[quant].label,
                     **_summaries(predictions[quant].dtypes_by_component(), predictions[quant].tied)})
        real = reals[quant]
        rows.append({"scenario": real.label if isinstance(real, DtypeCensus) else f"real {quant}",
                     **(_summaries(real.dtypes_by_component(), real.tied) if isinstance(real, DtypeCensus)
                        else {"note": real})})
    for other in compare:
        other_config = auto_config(other, trust_remote_code=target.trust_remote_code)
        rows.append({"scenario": f"{Path(other).name}: predicted 4bit",
                     **_summaries(predicted_quantized_census(other_config, "4bit", overrides=overrides)
                                  .dtypes_by_component())})
    return QuantizedResult(predictions, reals, pd.DataFrame(rows).fillna(""))


def with_loaded_row(quantized: QuantizedResult, loaded: LoadedCensusResult) -> QuantizedResult:
    """The comparison table with the loaded model's row, once the model is loaded (after the real quantized
    loads, so that no two copies are ever resident)."""
    import pandas as pd

    row = {"scenario": loaded.census.label, **_summaries(loaded.census.dtypes_by_component(), loaded.census.tied)}
    headers = quantized.comparison[quantized.comparison["scenario"].str.startswith("checkpoint headers")]
    rest = quantized.comparison.drop(headers.index)
    table = pd.concat([headers, pd.DataFrame([row]), rest], ignore_index=True).fillna("")
    return QuantizedResult(quantized.predictions, quantized.reals, table)


def _summaries(by_component: dict[str, dict[str, int]], tied: dict[str, str] | None = None) -> dict[str, str]:
    cells = {comp: " + ".join(f"{d} {n}" for d, n in dtypes.items()) for comp, dtypes in by_component.items()}
    if tied:
        cells["tied (counted once)"] = "; ".join(tied_notes(tied))
    return cells


@dataclasses.dataclass(repr=False)
class IslandResult(TextRepr):
    report: Islands

    def findings(self) -> list[Finding]:
        return [self.report.finding()]

    def display(self):
        return self.report.display()


def fp32_island_probe(prepared, target=None) -> IslandResult:
    from workbench.model.components import ComponentClassifier

    overrides = component_overrides(target) if target is not None else None
    classifier = ComponentClassifier.from_model(prepared.model, overrides)
    return IslandResult(fp32_islands(prepared.model, classifier=classifier))
