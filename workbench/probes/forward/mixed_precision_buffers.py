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

from workbench.display.nodes import Display, Table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.components import ComponentClassifier
from workbench.model.dtypes import compute_dtype_of, dtype_name, off_compute_dtype
from workbench.model.forward import run_forward, target_inputs
from workbench.probes.dtype.tracer import DtypeTracer


@dataclasses.dataclass(repr=False)
class BufferResult(ProbeResult):
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

    def details(self):
        return Display(Table.from_records(self.buffers[:100]))


def mixed_precision_buffer_probe(prepared, target) -> BufferResult:
    model = prepared.model
    compute = compute_dtype_of(model)
    name = str(compute).removeprefix("torch.")
    classifier = ComponentClassifier.from_model(model)
    buffers = [{"buffer": off.name, "dtype": dtype_name(off.tensor.dtype), "component": classifier.component_of(off.name),
                "module_frozen": off.module_frozen, "rotary": off.rotary}
               for off in off_compute_dtype(model, compute, kinds=("buffer",))]
    buffers.sort(key=lambda b: (b["rotary"], not b["module_frozen"], b["buffer"]))  # frozen modules first
    inputs, _ = target_inputs(model, target)
    saved: dict[nn.Parameter, torch.dtype] = {}
    was_training = model.training
    try:
        for p in model.parameters():
            if p.dtype.is_floating_point and p.dtype != compute:
                saved[p] = p.dtype
                p.data = p.data.to(compute)
        model.train()
        with DtypeTracer(model) as tracer:
            _out, exc = run_forward(model, inputs, "no autocast", compute)
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
