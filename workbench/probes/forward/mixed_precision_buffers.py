"""`forward.mixed_precision_buffers`: what FSDP's MixedPrecisionPolicy leaves behind.

`fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=bf16))` casts parameters to the compute dtype for the
forward but never buffers. A frozen module whose fp32 buffer enters its arithmetic (Gemma-4's vision `std_bias` /
`std_scale`) then turns bf16 activations back into fp32 (trainable modules' buffers are left alone just the same), and the next bf16 matmul raises. This probe
simulates the policy on the prepared model — floating parameters cast to the compute dtype, buffers left alone — runs the
forward under the dtype tracer, and restores every parameter afterwards. Parameters the class's own dtype plan
keeps in fp32 at the compute dtype (`_keep_in_fp32_modules_strict`; `_keep_in_fp32_modules` only under fp16, as
transformers loads them) stay as they are, as they would in a unit of their own with an fp32 policy (Inkling2's router computes `hidden.float()` against `mlp.gate.weight`: cast, the class itself breaks). A break in
a library class's own code (`library_dtype_break`: MRA's attention returns fp32) is named as the class's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from workbench.display.nodes import Display, Table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.batch import accepted_batch, remember_forward, target_inputs
from workbench.model.components import ComponentClassifier, unwrap_model
from workbench.model.dtypes import (
    compute_dtype_of,
    dtype_name,
    dtype_plan_matcher,
    keep_in_fp32_matcher,
    off_compute_dtype,
)
from workbench.model.forward import run_forward
from workbench.model.tracer import DtypeTracer
from workbench.probes.forward.library_dtype_break import library_break_fix, library_dtype_break


@dataclasses.dataclass(repr=False)
class BufferResult(ProbeResult):
    compute_dtype: str
    buffers: list[dict[str, Any]]  # floating buffers off the compute dtype, frozen modules first
    promoting: list[dict[str, Any]]  # of those, modules whose traced output left the compute dtype
    error: str | None  # the simulated forward raised
    diagnosis: dict[str, Any] | None
    inputs_how: str = ""
    kept_fp32: list[str] = dataclasses.field(default_factory=list)  # declared-fp32 parameters left uncast
    library_break: dict[str, Any] | None = None  # the simulated forward breaks in a library class's own code

    def findings(self) -> list[Finding]:
        evidence = {"compute_dtype": self.compute_dtype, "buffers": self.buffers[:40], "promoting": self.promoting,
                    "forward_error": self.error, "diagnosis": self.diagnosis, "inputs": self.inputs_how,
                    "simulated": "FSDP2 MixedPrecisionPolicy(param_dtype): parameters cast, buffers untouched",
                    "kept_fp32_parameters": self.kept_fp32[:20], "library_class": self.library_break}
        fix = (f"Cast frozen modules' buffers to {self.compute_dtype} before fully_shard (e.g. "
               f"module.to(torch.{self.compute_dtype}) for frozen, unsharded submodules), or keep those modules out "
               "of the mixed-precision unit.")
        defects = [p for p in self.promoting if not p.get("intent")]
        producer = (self.diagnosis or {}).get("producer")
        owners = {b["buffer"].rsplit(".", 1)[0]: b for b in self.buffers if not b["rotary"] and not b.get("intent")}
        if self.error and not defects and producer in owners:  # the raise comes from a buffer's module
            defects = [{**owners[producer], "module": producer, "out": (self.diagnosis or {}).get("input_dtype")}]
        if defects:
            first = defects[0]
            return [Finding("forward.mixed_precision_buffers", "fail",
                            f"Under FSDP-style mixed precision, {first['buffer']} promotes activations to "
                            f"{first.get('out') or 'float32'}",
                            (f"The forward fails: {self.error}. " if self.error else "")
                            + (f"Traced: {self.diagnosis['summary']}." if self.diagnosis else ""), evidence, fix)]
        library = self.library_break
        if self.error and library:
            return [Finding("forward.mixed_precision_buffers", "warn",
                            f"Under FSDP-style mixed precision the forward breaks in transformers' own "
                            f"{library['class']}, not in a buffer",
                            f"{self.error}. {library['how']} ({library['source']}, transformers "
                            f"{library['transformers']}): with every parameter in {self.compute_dtype}, the module "
                            "that receives it raises. No buffer is at fault.", evidence,
                            library_break_fix(library, self.compute_dtype))]
        if self.error:  # the batch runs as prepared, but not with every parameter cast: not a buffer's doing
            return [Finding("forward.mixed_precision_buffers", "error",
                            "The forward with parameters cast to the compute dtype fails, and not in a buffer's module",
                            f"{self.error}. The same batch runs the model as prepared; casting every floating "
                            f"parameter to {self.compute_dtype} breaks it elsewhere"
                            + (f" (traced: {self.diagnosis['summary']})" if self.diagnosis else "") + ".",
                            evidence, "Read the exception: FSDP2's param_dtype would cast these parameters too.")]
        if self.buffers:
            intended = [p for p in self.promoting if p.get("intent")]
            note = (f" {len(intended)} change their module's output dtype on purpose ("
                    + "; ".join(f"{p['buffer']}: {p['intent']}" for p in intended[:3]) + ")." if intended else "")
            return [Finding("forward.mixed_precision_buffers", "info",
                            f"{len(self.buffers)} buffer(s) stay out of {self.compute_dtype}, none promotes by accident",
                            "They keep their dtype under FSDP mixed precision and do not change the activations' "
                            "dtype by accident (e.g. rotary inv_freq)." + note, evidence)]
        return [Finding("forward.mixed_precision_buffers", "pass", "No floating buffer outside the compute dtype",
                        "FSDP mixed precision would leave nothing in another dtype.", evidence)]

    def details(self):
        return Display(Table.from_records(self.buffers[:100]))


def mixed_precision_buffer_probe(prepared, target) -> BufferResult:
    model = prepared.model
    compute = compute_dtype_of(model)
    name = str(compute).removeprefix("torch.")
    classifier = ComponentClassifier.from_model(model)
    inner, prefix = unwrap_model(model)
    keep_fp32 = keep_in_fp32_matcher(inner)
    declared = f"{type(inner).__name__} declares it in _keep_in_fp32_modules(_strict)"

    def intent(off) -> str | None:
        short = off.name[len(prefix) + 1:] if prefix and off.name.startswith(prefix + ".") else off.name
        return declared if keep_fp32(short) else None

    buffers = [{"buffer": off.name, "dtype": dtype_name(off.tensor.dtype), "component": classifier.component_of(off.name),
                "module_frozen": off.module_frozen, "rotary": off.rotary, "intent": intent(off)}
               for off in off_compute_dtype(model, compute, kinds=("buffer",))]
    buffers.sort(key=lambda b: (b["rotary"], not b["module_frozen"], b["buffer"]))  # frozen modules first
    batch, how = target_inputs(model, target)  # a batch the model accepts, or BatchNotAccepted: an `error`
    # FSDP2's MixedPrecisionPolicy casts floating forward inputs to param_dtype too (cast_forward_inputs=True)
    inputs = {k: v.to(compute) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in batch.items()}
    saved: dict[nn.Parameter, torch.dtype] = {}
    kept: list[str] = []
    # what the class's own dtype plan keeps in fp32 at this compute dtype (`_keep_in_fp32_modules_strict`;
    # `_keep_in_fp32_modules` only for fp16): DeepSeek-V4's non-strict compressor is bf16 in a bf16 load
    planned = dtype_plan_matcher(inner, compute)
    was_training = model.training
    try:
        for pname, p in model.named_parameters():
            short = pname[len(prefix) + 1:] if prefix and pname.startswith(prefix + ".") else pname
            if p.dtype.is_floating_point and p.dtype != compute and planned(short) == torch.float32:
                kept.append(pname)  # the class keeps it in fp32: its own unit, its own policy
            elif p.dtype.is_floating_point and p.dtype != compute:
                saved[p] = p.dtype
                p.data = p.data.to(compute)
        as_prepared = not saved and all(inputs[k] is v for k, v in batch.items())
        # nothing cast: this forward is the model as prepared, train mode, no autocast, on the batch, traced — where
        # another step ran that already (02's replica thread), its trace is read instead of running it again
        _summary, _by, traced_before = accepted_batch(model, target).forwards.get(("train", "no autocast"),
                                                                                 (None, None, None))
        if as_prepared and traced_before is not None:
            tracer, exc = traced_before, None
        else:
            model.train()
            with DtypeTracer(model) as tracer:
                out, exc = run_forward(model, inputs, "no autocast", compute)
            if exc is None and as_prepared:  # the forward matrix's traced cell, which reads it rather than run it
                remember_forward(model, target, batch, "train", "no autocast", out, "forward.mixed_precision_"
                                 "buffers' traced forward", tracer=tracer)
            del out
        library = library_dtype_break(model, tracer, compute) if exc is not None else None  # parameters still cast
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
    return BufferResult(name, buffers, promoting, error, tracer.diagnosis() if exc is not None else None, how,
                        kept, library)
