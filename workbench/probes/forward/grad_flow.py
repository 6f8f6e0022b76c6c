"""`grad.flow`: one training step, and which trainable tensors got no gradient — with the cause named.

Normal cases are not flagged: on the first step of a fresh LoRA, `lora_B` is all zeros, so every `lora_A`
gradient is exactly zero (dL/dA = B^T ...). Names are normalized across wrappers (`module.` from DDP,
`base_model.model.` from PEFT) so they read the same as in the user's code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections import Counter
from typing import Any

import torch
from torch import nn

from workbench.display.nodes import Details, Display, Table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.batch import target_inputs
from workbench.model.bnb_cpu_layout import (
    bitsandbytes_version,
    held_layout_note,
    keep_training_layout,
    packed_for_cpu_inference,
    packed_training_fix,
)
from workbench.model.checkpointing import checkpointing_state
from workbench.model.components import ComponentClassifier
from workbench.model.cpu_half_matmul import describe, fp32_half_matmul
from workbench.model.dtypes import compute_dtype_of
from workbench.model.forward import device_type_of
from workbench.model.heads import loss_of

WRAPPER_PREFIXES = re.compile(r"^(module\.)*(base_model\.model\.)?")


def normalize_name(name: str) -> str:
    return WRAPPER_PREFIXES.sub("", name)


@dataclasses.dataclass
class GradRow:
    name: str
    component: str
    role: str  # lora_A | lora_B | other
    status: str  # ok | zero | none
    norm: float | None
    expected: str | None = None  # why this is normal

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(repr=False)
class GradFlowResult(ProbeResult):
    rows: list[GradRow]
    loss: float | None
    error: str | None
    checkpointing: dict[str, Any]
    has_pixels: bool
    inputs_how: str = ""
    unused: list[str] = dataclasses.field(default_factory=list)  # trainable tensors whose module never ran
    unexercised: list[str] = dataclasses.field(default_factory=list)  # vision tensors a batch without image skips
    backward_kernels: str | None = None  # set when half-precision products were computed in fp32 (CPU only)
    packed_for_inference: list[str] = dataclasses.field(default_factory=list)  # 4-bit layers handed over packed
    layout_note: str | None = None  # set when bitsandbytes' CPU inference repack was held back for the diagnosis

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([r.as_row() for r in self.rows])

    def summary(self) -> dict[str, dict[str, int]]:
        out: dict[str, Counter] = {}
        for r in self.rows:
            out.setdefault(f"{r.component}/{r.role}", Counter())[r.status] += 1
        return {k: dict(v) for k, v in out.items()}

    def _cause(self, missing: list[GradRow]) -> tuple[str, str]:
        cp = self.checkpointing
        if cp["enabled"] and cp["use_reentrant"] is not False and not cp["input_grad_hook"]:
            return ("reentrant gradient checkpointing without enable_input_require_grads(): the checkpointed blocks "
                    "receive inputs that do not require grad, so nothing inside them gets a gradient",
                    "model.enable_input_require_grads() before training, or gradient_checkpointing_kwargs="
                    "{'use_reentrant': False}")
        return ("these tensors are off the forward path, or custom code detaches them (.detach(), torch.no_grad)",
                "Check that the modules run in forward and that no custom code detaches their activations.")

    def findings(self) -> list[Finding]:
        evidence: dict[str, Any] = {"loss": self.loss, "checkpointing": self.checkpointing,
                                    "per_component": self.summary(),
                                    "missing": [r.as_row() for r in self.rows if r.status != "ok" and not r.expected][:40],
                                    "expected_zero": sum(1 for r in self.rows if r.expected and r.status == "zero"),
                                    "inputs": self.inputs_how, "never_run": self.unused[:40],
                                    "not_exercised": self.unexercised[:40]}
        if self.backward_kernels:
            evidence["backward_kernels"] = self.backward_kernels
        if self.layout_note:
            evidence["bitsandbytes_cpu_layout"] = self.layout_note
        if self.packed_for_inference and not self.error:
            return [self._packed_finding(evidence)]
        if self.error:
            cause, fix = self._cause([])
            known = "does not require grad" in self.error
            return [Finding("grad.flow", "fail" if known else "error",
                            "The training step cannot backpropagate" if known else "The training step failed",
                            f"{self.error}" + (f" — cause: {cause}." if known else ""), evidence,
                            fix if known else "Read the exception; fix the model or the inputs.")]
        trainable = len(self.rows)
        if not trainable:
            return [Finding("grad.flow", "skip", "No trainable tensor",
                            "Nothing is trainable in this set-up, so no training step was run (the plain set-up "
                            "loads a model, and an adapter, for inference).",
                            evidence, "Use a LoRA set-up (qlora, sft) or unfreeze what you mean to train.")]
        missing = [r for r in self.rows if r.status != "ok" and not r.expected]
        if missing:
            cause, fix = self._cause(missing)
            first = missing[0]
            return [Finding("grad.flow", "fail",
                            f"{len(missing)} of {trainable} trainable tensors get no gradient, e.g. {first.name}",
                            "Gradients None or zero by component: "
                            + ", ".join(f"{k}: {v}" for k, v in self.summary().items()) + f". Cause: {cause}.",
                            evidence, fix)]
        expected = sum(1 for r in self.rows if r.expected and r.status == "zero")
        unused = len(self.unused) + len(self.unexercised)
        title = (f"All {trainable} trainable tensors receive a gradient" if not unused else
                 f"All {trainable - unused} trainable tensors on the forward path receive a gradient")
        return [Finding("grad.flow", "info" if unused else "pass", title,
                        f"loss {self.loss:.4f}" + (f"; {expected} lora_A gradients are exactly zero because their "
                                                   "lora_B is still zero (normal on a fresh LoRA's first step)"
                                                   if expected else "")
                        + (f"; {len(self.unused)} belong to modules whose output never reaches the loss in this "
                           f"architecture (e.g. {self.unused[0]}): they cannot learn — freeze them, or under DDP "
                           "pass find_unused_parameters=True" if self.unused else "")
                        + (f"; {len(self.unexercised)} vision-tower tensors (e.g. {self.unexercised[0]}) were not "
                           "exercised: no image batch this model accepts could be built, so the tower's gradients "
                           "are not checked (pass your own batch as forward_inputs)" if self.unexercised else "")
                        + (f". Inputs: {self.inputs_how}" if self.inputs_how else ""), evidence)]

    def _packed_finding(self, evidence: dict[str, Any]) -> Finding:
        names = self.packed_for_inference
        evidence = {**evidence, "packed_for_cpu_inference": names[:40], "bitsandbytes": bitsandbytes_version()}
        step = self.findings_after_unpacking()
        return Finding("grad.flow", "fail",
                       f"{len(names)} 4-bit layers were handed to training packed for CPU inference: no gradient "
                       f"flows back through them, e.g. {names[0]}",
                       f"bitsandbytes {bitsandbytes_version()} repacked these weights for its AVX-512 bf16 CPU "
                       "inference kernel during an eval forward without grad (an evaluation loop before training "
                       "does it); its gemv_4bit has no autograd kernel, so a training step after that leaves every "
                       "LoRA before these layers without a gradient. The step here ran after putting them back in "
                       f"the training layout: {step.title.lower()}.", evidence, packed_training_fix(names))

    def findings_after_unpacking(self) -> Finding:
        """The verdict of the step itself, which ran on the training layout."""
        return dataclasses.replace(self, packed_for_inference=[]).findings()[0]

    def details(self):
        import pandas as pd

        summary = pd.DataFrame([{"component/role": k, **v} for k, v in self.summary().items()]).fillna(0)
        bad = self.to_frame()
        bad = bad[bad["status"] != "ok"] if not bad.empty else bad
        return Display(Table.from_frame(summary),
                       Details("tensors without a gradient", Table.from_frame(bad.head(200))) if not bad.empty
                       else None)


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def _role(name: str) -> str:
    return "lora_A" if ".lora_A." in name else "lora_B" if ".lora_B." in name else "other"


def _lora_b_is_zero(model: nn.Module, a_name: str) -> bool:
    b_name = a_name.replace(".lora_A.", ".lora_B.")
    params = dict(model.named_parameters())
    return b_name in params and not bool(params[b_name].detach().abs().sum())


def grad_flow_probe(prepared, target) -> GradFlowResult:
    model = prepared.model
    if not any(p.requires_grad for p in model.parameters()):  # e.g. an adapter loaded for inference (plain)
        return GradFlowResult([], None, None, checkpointing_state(model), False, "no step run: nothing trainable")
    # weights a set-up (or an earlier unguarded eval forward) left in bitsandbytes' CPU inference layout: named,
    # then put back, so the step below measures what training gets once that is fixed
    packed = list(getattr(prepared, "packed_at_setup", ())) or packed_for_cpu_inference(model)
    keep_training_layout(model)
    inputs, how = target_inputs(model, target)
    classifier = ComponentClassifier.from_model(model)
    was_training = model.training
    model.train()
    model.zero_grad(set_to_none=True)
    loss_value, error, promoted = None, None, None
    # read each gradient as it is accumulated, then drop it: a full fine-tune would otherwise hold a second
    # model-sized buffer of gradients just so that we can look at them
    seen: dict[str, tuple[str, float]] = {}
    handles = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            def record(param, name=name):
                norm = float(param.grad.detach().float().norm())
                seen[name] = ("ok" if norm > 0 else "zero", norm)
                param.grad = None
            handles.append(p.register_post_accumulate_grad_hook(record))
    # where each module holding trainable tensors sits on the graph: never run, run with an output that never
    # reaches the loss (the architecture's choice: CLIP's post_layernorm under LLaVA, which reads hidden states), or
    # run detached (no_grad, reentrant checkpointing without input grads: a real break, left to the findings)
    holders = {id(m) for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))}
    ran: set[int] = set()
    reached: dict[int, bool] = {}

    def watch(module, _args, output):
        ran.add(id(module))
        tensor = _first_tensor(output)
        if tensor is not None and tensor.requires_grad:
            reached.setdefault(id(module), False)
            tensor.register_hook(lambda grad, key=id(module): reached.__setitem__(key, True))

    for module in model.modules():
        if id(module) in holders:
            handles.append(module.register_forward_hook(watch))
    try:
        with torch.autocast(device_type_of(model), dtype=compute_dtype_of(model)):
            out = model(**inputs)
        loss = loss_of(out)
        loss_value = float(loss.detach().float())
        with (fp32_half_matmul() if device_type_of(model) == "cpu" else contextlib.nullcontext()) as promoted:
            loss.backward()
    except Exception as exc:  # noqa: BLE001 - e.g. "element 0 of tensors does not require grad"
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    has_pixels = any(k.startswith(("pixel_values", "image")) for k in inputs)
    owners = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    rows, unused, unexercised = [], [], []
    if error is None:
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            status, norm = seen.get(name, ("none", None))
            role = _role(name)
            component = classifier.component_of(name)
            expected = ("lora_B is all zeros on the first step" if status == "zero" and role == "lora_A"
                        and _lora_b_is_zero(model, name) else None)
            owner = owners.get(id(p))
            if status == "none" and component == "vision" and not has_pixels:
                expected = "the batch holds no image: the vision tower is not exercised"
                unexercised.append(normalize_name(name))
            elif status == "none" and owner is not None:
                if id(owner) not in ran:
                    expected = "its module never runs in this model's forward"
                elif reached.get(id(owner)) is False:
                    expected = "its module runs but its output never reaches the loss"
                if expected:
                    unused.append(normalize_name(name))
            rows.append(GradRow(normalize_name(name), component, role, status, norm, expected))
    model.zero_grad(set_to_none=True)
    return GradFlowResult(rows, loss_value, error, checkpointing_state(model), has_pixels, how, unused, unexercised,
                          describe(promoted), packed, held_layout_note(model))
