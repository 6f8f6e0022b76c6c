"""The probes of notebook 03 (PEFT attribute preservation): `peft.attributes` and `peft.layer_status`.

The Trainer and accelerate decide placement, DataParallel and quantized-training rules from attributes of the
model they are handed. Each wrapping step (k-bit preparation, PEFT, the Trainer, trl's SFTTrainer) hands on a
different object; this probe reads every such attribute after every step and says which were kept on the
object itself, which only reach through `__getattr__` forwarding (PeftModel forwards to its base model), and
which were lost or changed.
"""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any

import torch
from torch import nn

from workbench.display.nodes import Bullets, Display, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.declared_quantization import raise_if_declared_quantization_unapplied
from workbench.model.guard import restored
from workbench.model.loading import load_pretrained
from workbench.model.module_tree import as_loaded, tree_copy, why_the_chain_loads
from workbench.model.setups import WRAPPING_STEPS, add_fresh_lora, prepare_for_kbit_training
from workbench.model.shared import make_room_for_a_copy, prepare_shared
from workbench.model.trainer_attributes import ATTRIBUTES, MISSING, TRAINER_READ, AttributeSnapshot, snapshot


@dataclasses.dataclass(repr=False)
class AttributeResult(ProbeResult):
    snapshots: list[AttributeSnapshot]
    skipped: list[str]
    raw_from: str = ""  # where the raw model came from: a copy of the shared model's tree, or a load and why

    def changes(self) -> list[dict[str, str]]:
        """Trainer-read attributes whose value differs from the raw model's at a later step."""
        raw = self.snapshots[0]
        out = []
        for snap in self.snapshots[1:]:
            for name in TRAINER_READ:
                before, after = raw.values[name], snap.values[name]
                if before != after and not (name == "hf_device_map" and before == MISSING):
                    out.append({"attribute": name, "step": snap.step, "raw model": before, "now": after,
                                "how": snap.how[name]})
        return out

    def to_frame(self):
        import pandas as pd

        rows = {}
        for snap in self.snapshots:
            column = {name: snap.values[name] + ("  ↪ forwarded" if snap.how[name] == "forwarded" else "")
                      for name in ATTRIBUTES}
            column["object"] = snap.object_type
            column["trainable / total params"] = f"{snap.trainable:,} / {snap.total:,}"
            rows[snap.step] = column
        return pd.DataFrame(rows)

    def findings(self) -> list[Finding]:
        changes = self.changes()
        forwarded = sorted({f"{n} ({s.step})" for s in self.snapshots for n, h in s.how.items()
                            if h == "forwarded" and n in TRAINER_READ})
        evidence = {"steps": [dataclasses.asdict(s) for s in self.snapshots], "changes": changes,
                    "forwarded": forwarded, "skipped_steps": self.skipped, "raw_model_from": self.raw_from}
        if changes:
            first = changes[0]
            return [Finding("peft.attributes", "fail",
                            f"{first['attribute']} changes from {first['raw model']} to {first['now']} at "
                            f"'{first['step']}'",
                            f"{len(changes)} Trainer-read attribute change(s) across wrapping: "
                            + "; ".join(f"{c['attribute']} at {c['step']}: {c['raw model']} → {c['now']}"
                                        for c in changes[:6])
                            + ". The Trainer then decides DataParallel, placement and quantized-training rules on "
                              "values that no longer describe the model.", evidence,
                            "Set such attributes on the object the Trainer receives (after the last wrap), or fix "
                            "the wrapper so it forwards them; prefer passing _n_gpu=1 / a real device_map over "
                            "setting flags by hand.")]
        detail = "Every attribute the Trainer reads keeps its value through each step."
        if forwarded:
            detail += f" Reached only through __getattr__ forwarding: {', '.join(forwarded[:8])}."
        return [Finding("peft.attributes", "info", "Trainer-read attributes survive every wrapping step", detail,
                        evidence)]

    def details(self):
        return Display(Table.from_frame(self.to_frame().reset_index(names="attribute")),
                       Paragraph(f"The raw model: {self.raw_from}.") if self.raw_from else None,
                       Paragraph("Steps not run:") if self.skipped else None, Bullets(self.skipped))


def _trainer_model(model: nn.Module, gpus: int) -> nn.Module:
    from transformers import Trainer, TrainingArguments

    with tempfile.TemporaryDirectory(prefix="workbench-peft-") as out:
        args = TrainingArguments(output_dir=out, report_to=[], use_cpu=not torch.cuda.is_available())
        _ = args.device
        args._n_gpu = gpus
        return Trainer(model=model, args=args).model


def peft_attribute_probe(target) -> AttributeResult:
    """Walk the raw model through the wrapping steps, snapshotting after each one. Under the plain and qlora set-ups
    no model is loaded (`_chain_without_a_load`); under any other set-up, an explicit device map, or a module tree
    that refuses the copy, the raw model is a load of its own, freed on return (the notebook runs this step before
    `prepare_model` then: never two copies resident), and its `why` says which."""
    why_load = why_the_chain_loads(target)
    if why_load is None:
        result, why_load = _chain_without_a_load(target)
        if result is not None:
            return result
        make_room_for_a_copy(target)
    load = dict(quant=target.quant, device_map=target.device_map, max_memory=target.max_memory,
                trust_remote_code=target.trust_remote_code)
    model = load_pretrained(target.model_dir, **load,
                            why=f"peft.attributes: the raw model the wrapping chain walks ({why_load})")
    return _walk_chain(model, target, f"a load of its own ({why_load})")


def _chain_without_a_load(target) -> tuple[AttributeResult | None, str]:
    """The chain from the shared model: under qlora, the set-up's own steps as it snapshotted them and the Trainer's
    on a copy of its module tree; under plain, the chain walked on a copy of the tree as from_pretrained returned it
    (`module_tree.as_loaded`). Both under `guard.restored`. (None, why) where it cannot be had so."""
    shared = prepare_shared(target).model
    recorded = WRAPPING_STEPS.get(shared)  # the qlora set-up's own steps, snapshotted as it ran them
    if target.setup != "plain" and recorded is None:
        return None, f"the {target.setup} set-up's steps were not snapshotted"
    with restored(shared):
        try:
            raw = tree_copy(shared) if recorded else as_loaded(shared)
        except Exception as exc:  # noqa: BLE001 - a module that refuses deepcopy or unload: a load of its own
            return None, f"the prepared model's module tree could not be copied ({type(exc).__name__}: {str(exc)[:160]})"
        if recorded:
            trainer = snapshot(f"Trainer (n_gpu={target.gpus})", _trainer_model(raw, target.gpus))
            return AttributeResult([*recorded, trainer], [], "the qlora set-up's own steps, snapshotted as it ran "
                                   "them, and a copy of its module tree for the Trainer (no load)"), ""
        return _walk_chain(raw, target, "a copy of the shared model's module tree (no load)"), ""


def _walk_chain(model, target, raw_from: str) -> AttributeResult:
    from peft import PeftModel

    skipped: list[str] = []
    raise_if_declared_quantization_unapplied(model)  # PEFT would raise "compress_statistics" on these layers
    snaps = [snapshot("raw model", model)]
    if target.quant != "none":
        model = prepare_for_kbit_training(model)  # as the qlora set-up prepares it
        snaps.append(snapshot("prepare_model_for_kbit_training", model))
    else:
        skipped.append("prepare_model_for_kbit_training: not a k-bit model")
    if target.adapter_dir:
        model = PeftModel.from_pretrained(model, str(target.adapter_dir), is_trainable=True)
        snaps.append(snapshot("PeftModel.from_pretrained", model))
    else:
        model = add_fresh_lora(model)
        snaps.append(snapshot("get_peft_model", model))
    snaps.append(snapshot(f"Trainer (n_gpu={target.gpus})", _trainer_model(model, target.gpus)))
    del model
    import gc

    gc.collect()
    return AttributeResult(snaps, skipped, raw_from)


def with_setup_attributes(report: AttributeResult, prepared, target) -> AttributeResult:
    """The chain's report plus a column for what the user's own set-up hands the Trainer (`prepared` None: the set-up
    could not prepare the model, and the checks that need it say so)."""
    if target.setup in ("plain", "qlora") or prepared is None:
        return report
    return AttributeResult([*report.snapshots, snapshot(f"your set-up ({target.setup})", prepared.model)],
                           report.skipped)


@dataclasses.dataclass(repr=False)
class LayerStatusResult(ProbeResult):
    model_status: dict[str, Any] | None
    layers: list[dict[str, Any]]

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.layers)

    def findings(self) -> list[Finding]:
        if self.model_status is None:
            return [Finding("peft.layer_status", "skip", "No PEFT adapter in this set-up",
                            "The prepared model has no tuner layers; pass an adapter or a LoRA set-up.")]
        status = self.model_status
        evidence = {"model_status": status, "layers": self.layers[:60],
                    "dtype_differs": [r["layer"] for r in self.layers if r["A/B dtype"] != r["base compute dtype"]]}
        irregular = [k for k in ("enabled", "active_adapters", "requires_grad", "devices")
                     if "irregular" in str(status.get(k))]
        if irregular:
            return [Finding("peft.layer_status", "warn", f"Adapter layers are irregular in {', '.join(irregular)}",
                            "PEFT reports that not all adapter layers agree ("
                            + "; ".join(f"{k}={status.get(k)}" for k in irregular) + ").", evidence,
                            "Re-create the adapter state consistently: one active adapter, the same requires_grad "
                            "and device for every layer.")]
        if status.get("enabled") is False or not status.get("num_adapter_layers"):
            return [Finding("peft.layer_status", "warn", "Adapter layers are disabled or absent",
                            f"num_adapter_layers={status.get('num_adapter_layers')}, enabled={status.get('enabled')}",
                            evidence, "Enable the adapter (model.enable_adapter_layers()) or check target_modules.")]
        differ = len(evidence["dtype_differs"])
        return [Finding("peft.layer_status", "info" if differ else "pass",
                        f"{status.get('num_adapter_layers')} adapter layers, active {status.get('active_adapters')}, "
                        f"requires_grad {status.get('requires_grad')}",
                        (f"{differ} layer(s) keep LoRA A/B in a dtype other than their base layer's compute dtype "
                         "(PEFT casts activations around them)." if differ else
                         "LoRA A/B dtypes match their base layers' compute dtype.")
                        + f" Devices: {status.get('devices')}.", evidence)]

    def details(self):
        summary = Table(None, (self.model_status or {}).items(), row_headers=True)
        return Display(summary, Table.from_frame(self.to_frame().head(200)))


def _base_compute_dtype(layer: nn.Module) -> str:
    base = layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer
    compute = getattr(base, "compute_dtype", None)
    weight = getattr(base, "weight", None)
    if compute is None and weight is not None and weight.dtype.is_floating_point:
        compute = weight.dtype
    return str(compute).removeprefix("torch.") if compute is not None else "quantized"


def peft_layer_status_probe(prepared) -> LayerStatusResult:
    from peft import get_layer_status, get_model_status
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = prepared.model
    if not any(isinstance(m, BaseTunerLayer) for m in model.modules()):
        return LayerStatusResult(None, [])
    status = dataclasses.asdict(get_model_status(model))
    # get_layer_status names layers relative to the tuner model (PeftModel.base_model)
    modules = {**dict(model.named_modules()), **dict(getattr(model, "base_model", model).named_modules())}
    rows = []
    for layer in get_layer_status(model):
        module = modules.get(layer.name)
        ab = sorted({str(p.dtype).removeprefix("torch.") for n, p in module.named_parameters()
                     if "lora_" in n}) if module is not None else []
        rows.append({"layer": layer.name, "type": layer.module_type, "enabled": layer.enabled,
                     "active": ",".join(layer.active_adapters), "merged": ",".join(layer.merged_adapters),
                     "requires_grad": str(layer.requires_grad), "devices": str(layer.devices),
                     "quantization": layer.quantization_backend or "",
                     "A/B dtype": ",".join(ab), "base compute dtype": _base_compute_dtype(module)})
    return LayerStatusResult(status, rows)
