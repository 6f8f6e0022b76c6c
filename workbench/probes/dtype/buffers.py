"""`forward.mixed_precision_buffers`: what FSDP's MixedPrecisionPolicy leaves behind.

`fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=bf16))` casts parameters to the compute dtype for the
forward but never buffers. A frozen module whose fp32 buffer enters its arithmetic (Gemma-4's vision `std_bias` /
`std_scale`) then turns bf16 activations back into fp32 (trainable modules' buffers are left alone just the same), and the next bf16 matmul raises. This probe simulates
the policy on the prepared model — floating parameters cast to the compute dtype, buffers left alone — runs the
forward under the dtype tracer, and restores every parameter afterwards.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from workbench.model.components import ComponentClassifier
from workbench.findings import Finding
from workbench.probes.dtype.islands import is_rotary_buffer
from workbench.probes.dtype.tracer import DtypeTracer
from workbench.report.text import TextRepr


@dataclasses.dataclass(repr=False)
class BufferResult(TextRepr):
    compute_dtype: str
    buffers: list[dict[str, Any]]  # floating buffers of frozen modules in another dtype
    promoting: list[dict[str, Any]]  # of those, modules whose traced output left the compute dtype
    error: str | None
    diagnosis: dict[str, Any] | None

    def findings(self) -> list[Finding]:
        evidence = {"compute_dtype": self.compute_dtype, "buffers": self.buffers[:40], "promoting": self.promoting,
                    "forward_error": self.error, "diagnosis": self.diagnosis,
                    "simulated": "FSDP2 MixedPrecisionPolicy(param_dtype): parameters cast, buffers untouched"}
        fix = (f"Cast frozen modules' buffers to {self.compute_dtype} before fully_shard (e.g. "
               f"module.to(torch.{self.compute_dtype}) for frozen, unsharded submodules), or keep those modules out "
               "of the mixed-precision unit.")
        if self.error or self.promoting:
            first = (self.promoting or [{}])[0]
            where = first.get("buffer") or (self.diagnosis or {}).get("producer") or "a frozen module"
            return [Finding("forward.mixed_precision_buffers", "fail",
                            f"Under FSDP-style mixed precision, {where} promotes activations to "
                            f"{first.get('out', 'float32')}",
                            (f"The forward fails: {self.error}. " if self.error else "")
                            + (f"Traced: {self.diagnosis['summary']}." if self.diagnosis else ""), evidence, fix)]
        if self.buffers:
            return [Finding("forward.mixed_precision_buffers", "info",
                            f"{len(self.buffers)} buffer(s) stay out of {self.compute_dtype}, none promotes",
                            "They keep their dtype under FSDP mixed precision but do not change the activations' "
                            "dtype (e.g. rotary inv_freq).", evidence)]
        return [Finding("forward.mixed_precision_buffers", "pass", "No floating buffer outside the compute dtype",
                        "FSDP mixed precision would leave nothing in another dtype.", evidence)]

    def display(self):
        from workbench.report.display import Display, Table
        from workbench.report.html import findings_block

        return Display(findings_block(self.findings()), Table.from_records(self.buffers[:100]))


def mixed_precision_buffer_probe(prepared, target) -> BufferResult:
    from workbench.model.inputs import sample_inputs
    from workbench.probes.dtype.islands import compute_dtype_of
    from workbench.probes.forward.scenarios import _run, with_labels

    model = prepared.model
    compute = compute_dtype_of(model)
    name = str(compute).removeprefix("torch.")
    classifier = ComponentClassifier.from_model(model)
    buffers = []
    for mod_name, module in model.named_modules():
        frozen = not any(p.requires_grad for p in module.parameters())
        for short, buf in module.named_buffers(recurse=False):
            if buf.dtype.is_floating_point and buf.dtype != compute:
                buffers.append({"buffer": f"{mod_name}.{short}", "dtype": str(buf.dtype).removeprefix("torch."),
                                "component": classifier.component_of(f"{mod_name}.{short}"),
                                "module_frozen": frozen, "rotary": is_rotary_buffer(module, short)})
    buffers.sort(key=lambda b: (b["rotary"], not b["module_frozen"], b["buffer"]))  # frozen modules first
    inputs, _ = sample_inputs(model, target.model_dir, inputs_file=target.params.get("forward_inputs"))
    inputs = with_labels(model, inputs)
    saved: dict[nn.Parameter, torch.dtype] = {}
    was_training = model.training
    try:
        for p in model.parameters():
            if p.dtype.is_floating_point and p.dtype != compute:
                saved[p] = p.dtype
                p.data = p.data.to(compute)
        model.train()
        with DtypeTracer(model) as tracer:
            _out, exc = _run(model, inputs, "no autocast", compute)
    finally:
        for p, dtype in saved.items():
            p.data = p.data.to(dtype)
        model.train(was_training)
    owners = {b["buffer"].rsplit(".", 1)[0]: b for b in buffers if not b["rotary"]}
    promoting = []
    for call in tracer.calls:
        owner = owners.get(call.path)
        if owner and call.outputs and call.outputs[0] != name and name in call.inputs:
            promoting.append({**owner, "module": call.path, "in": ",".join(call.inputs), "out": call.outputs[0]})
    error = f"{type(exc).__name__}: {str(exc)[:300]}" if exc is not None else None
    return BufferResult(name, buffers, promoting, error, tracer.diagnosis() if exc is not None else None)
