"""The probes of notebook 01 (dtype distribution): the loaded census, the 4-bit/8-bit census, fp32 islands."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path
from typing import Any

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.batch import BatchNotAccepted, target_inputs
from workbench.model.components import ComponentClassifier, component_overrides
from workbench.model.tied import tied_notes
from workbench.probes.dtype.census import DtypeCensus, census_differences, dtype_census, predicted_quantized_census
from workbench.probes.dtype.headers import CheckpointResult
from workbench.probes.dtype.islands import Islands, fp32_islands

DEFAULT_REAL_QUANT_MAX_BYTES = 128 * 1024**2  # the prediction is the answer; a real load verifies it only when cheap


def loaded_census_probe(prepared, target, static: CheckpointResult | None = None) -> DtypeCensus:
    """The census of the prepared model, beside the checkpoint's header census when that ran."""
    label = f"loaded ({target.setup} set-up, quant {target.quant})"
    census = dtype_census(prepared.model, label=label, overrides=component_overrides(target))
    return dataclasses.replace(census, checkpoint=static.censuses[0] if static else None)


@dataclasses.dataclass(repr=False)
class QuantizedCensusResult(ProbeResult):
    predictions: dict[str, DtypeCensus]
    reals: dict[str, DtypeCensus | str]  # a census, or why there is none
    comparison: Any = None  # pandas DataFrame: one row per scenario (headers, loaded, predicted, real)

    def findings(self) -> list[Finding]:
        """pass when every real load agrees with its prediction; warn naming the cells that differ."""
        evidence: dict[str, Any] = {}
        differences: dict[str, list] = {}
        lines = []
        for quant, predicted in self.predictions.items():
            evidence[f"predicted_{quant}"] = predicted.dtypes_by_component("parameter")
            if predicted.tied:
                evidence[f"tied_{quant}"] = tied_notes(predicted.tied)
            real = self.reals.get(quant)
            if isinstance(real, DtypeCensus):
                evidence[f"real_{quant}"] = real.dtypes_by_component("parameter")
                diff = census_differences(predicted, real)
                if diff:
                    differences[quant] = diff
                lines.append(f"{quant}: {predicted.summary()} (real load {'differs' if diff else 'agrees'})")
            else:
                lines.append(f"{quant}: {predicted.summary()} (predicted only: {real or 'not loaded'})")
        evidence["differences"] = differences
        tied = next((p.tied_note() for p in self.predictions.values() if p.tied), "")
        if tied:
            lines.append(tied)
        if differences:
            return [Finding("dtype.quantized_census", "warn", "Quantized census: prediction and real load disagree",
                            "; ".join(lines), evidence,
                            "The installed transformers/bitsandbytes quantize differently than their meta-device "
                            "replacement predicts; trust the real census and report the difference.")]
        return [Finding("dtype.quantized_census", "pass", "Census under 4-bit / 8-bit quantization",
                        "; ".join(lines), evidence)]

    def details(self):
        from workbench.display.nodes import Display, Heading, Table

        return Display(Heading("Parameter dtypes per component, by scenario"), Table.from_frame(self.comparison))


def _real_quantized_census(target, quant: str, overrides) -> DtypeCensus | str:
    from workbench.model.loading import load_pretrained

    try:
        model = load_pretrained(target.model_dir, quant=quant, trust_remote_code=target.trust_remote_code,
                                why=f"dtype.quantized_census: the real {quant} bitsandbytes load its meta-device "
                                    "prediction is checked against (only under real_quant_max_bytes)")
    except Exception as exc:  # noqa: BLE001 - bitsandbytes may not load on this machine: say so, keep the prediction
        return f"real {quant} load failed here: {type(exc).__name__}: {str(exc)[:200]}"
    try:
        return dtype_census(model, label=f"real {quant} (bitsandbytes)", overrides=overrides)
    finally:
        del model
        gc.collect()


def quantized_census_probe(target, loaded: DtypeCensus | None = None, static: CheckpointResult | None = None,
                            real_max_bytes: int | None = None,
                            compare: list[str] | tuple[str, ...] | None = None) -> QuantizedCensusResult:
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
        rows.append({"scenario": loaded.label,
                     **_summaries(loaded.dtypes_by_component(), loaded.tied)})
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
    return QuantizedCensusResult(predictions, reals, pd.DataFrame(rows).fillna(""))


def with_loaded_row(quantized: QuantizedCensusResult, loaded: DtypeCensus | None) -> QuantizedCensusResult:
    """The comparison table with the loaded model's row, once the model is loaded (after the real quantized
    loads, so that no two copies are ever resident); without it (the set-up could not load the model) as it is."""
    import pandas as pd

    if loaded is None:
        return quantized

    row = {"scenario": loaded.label, **_summaries(loaded.dtypes_by_component(), loaded.tied)}
    headers = quantized.comparison[quantized.comparison["scenario"].str.startswith("checkpoint headers")]
    rest = quantized.comparison.drop(headers.index)
    table = pd.concat([headers, pd.DataFrame([row]), rest], ignore_index=True).fillna("")
    return QuantizedCensusResult(quantized.predictions, quantized.reals, table)


def _summaries(by_component: dict[str, dict[str, int]], tied: dict[str, str] | None = None) -> dict[str, str]:
    cells = {comp: " + ".join(f"{d} {n}" for d, n in dtypes.items()) for comp, dtypes in by_component.items()}
    if tied:
        cells["tied (counted once)"] = "; ".join(tied_notes(tied))
    return cells


def fp32_island_probe(prepared, target=None) -> Islands:

    overrides = component_overrides(target) if target is not None else None
    classifier = ComponentClassifier.from_model(prepared.model, overrides)
    inputs = None
    if target is not None:  # buffers are asked whether they reach the activations, on a batch the model accepts
        try:
            inputs, _how = target_inputs(prepared.model, target)
        except BatchNotAccepted:
            inputs = None  # no batch runs: buffers stay unexplained (the forward checks say why)
    return fp32_islands(prepared.model, classifier=classifier, inputs=inputs)
