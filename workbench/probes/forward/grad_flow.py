"""`grad.flow`: one training step, and which trainable tensors got no gradient — with the cause named.

Normal cases are not flagged: on the first step of a fresh LoRA, `lora_B` is all zeros, so every `lora_A`
gradient is exactly zero (dL/dA = B^T ...). Names are normalized across wrappers (`module.` from DDP,
`base_model.model.` from PEFT) so they read the same as in the user's code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections import Counter
from typing import Any

import torch
from torch import nn

from workbench.display.nodes import Details, Display, Table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.batch import remember_forward, target_inputs
from workbench.model.bnb_cpu_layout import (
    bitsandbytes_version,
    held_layout_note,
    keep_training_layout,
    packed_for_cpu_inference,
    packed_training_fix,
)
from workbench.model.checkpointing import checkpointing_state
from workbench.model.components import ComponentClassifier
from workbench.model.cpu_half_matmul import describe, fp32_half_matmul, slow_half_dtypes_of
from workbench.model.dtypes import compute_dtype_of
from workbench.model.forward import autocast as autocast_in
from workbench.model.forward import device_type_of
from workbench.model.heads import loss_of
from workbench.model.memory import ResourceError
from workbench.model.offload import offload_sentence, offloaded_parameters
from workbench.probes.forward.gradient_causes import BENIGN, cause_of_cut, library_source, tower_of
from workbench.probes.forward.known_crashes import known_crash, raising_frame
from workbench.probes.forward.loss_dependence import loss_moves_with, loss_response, shifted, zero_factors_blocking
from workbench.probes.forward.loss_reach import LossReachTracer, trainable_names

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
    expected: str | None = None  # why this is normal (a key of gradient_causes.BENIGN), None when it is a break
    cause: str | None = None  # why no gradient came: a BENIGN key, or checkpoint_cut | code_cut | cut | untraced |
    #                           loss_moves (zero although the loss moves with it) | mutual_zeros (all zero, held
    #                           at zero by other all-zero tensors that are held by it: none can move first)
    where: str | None = None  # the evidence: the cut's file:line, the modeling file whose design it is, the choice
    #                           a shift flips (file:line) or the padding_idx read

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
    unused: list[str] = dataclasses.field(default_factory=list)  # trainable tensors this batch's loss never reads
    unexercised: list[str] = dataclasses.field(default_factory=list)  # vision tensors a batch without image skips
    backward_kernels: str | None = None  # set when half-precision products were computed in fp32 (CPU only)
    packed_for_inference: list[str] = dataclasses.field(default_factory=list)  # 4-bit layers handed over packed
    layout_note: str | None = None  # set when bitsandbytes' CPU inference repack was held back for the diagnosis
    zero_factors: list[str] = dataclasses.field(default_factory=list)  # all-zero tensors shown to block gradients
    offloaded: list[str] = dataclasses.field(default_factory=list)  # trainable tensors accelerate holds offloaded:
    #                                                                  not judged (model/offload.py)
    # the step's crash matched a row of known_crashes.KNOWN_CRASHES: the model's own code raises it for any batch
    known_crash: dict[str, Any] | None = None
    raised_at: str | None = None  # where an unmatched crash was raised (innermost transformers frame), file:line
    # why the zero gradients were not asked whether the loss moves with them (memory.room_for_a_copy)
    not_asked: str | None = None

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([r.as_row() for r in self.rows])

    def summary(self) -> dict[str, dict[str, int]]:
        out: dict[str, Counter] = {}
        for r in self.rows:
            out.setdefault(f"{r.component}/{r.role}", Counter())[r.status] += 1
        return {k: dict(v) for k, v in out.items()}

    def by_cause(self) -> dict[str, list[GradRow]]:
        out: dict[str, list[GradRow]] = {}
        for r in self.rows:
            if r.status != "ok":
                out.setdefault(r.cause or "untraced", []).append(r)
        return out

    def _cause(self, missing: list[GradRow]) -> tuple[str, str]:
        cp = self.checkpointing
        if cp["enabled"] and cp["use_reentrant"] is not False and not cp["input_grad_hook"]:
            return ("reentrant gradient checkpointing without enable_input_require_grads(): the checkpointed blocks "
                    "receive inputs that do not require grad, so nothing inside them gets a gradient",
                    "model.enable_input_require_grads() before training, or gradient_checkpointing_kwargs="
                    "{'use_reentrant': False}")
        causes = {r.cause for r in missing}
        if "mutual_zeros" in causes:
            mutual = [r for r in missing if r.cause == "mutual_zeros"]
            names = [r.name for r in mutual]
            # found by one step with them shifted (too many zero gradients to shift each alone), or alone
            released = mutual[0].where is not None
            # the zero gradients read as the loss's own indifference: behind these zeros, or by design
            behind = [r.name for r in self.rows if r.cause == ("behind_zeros" if released else "loss_independent")]
            more = ""
            if behind:
                why = ("these are zero, and one once these are shifted" if released else
                       "they are zero, the loss not moving with them alone")
                more = f"; {len(behind)} more get an exactly zero gradient while {why} (e.g. {behind[0]})"
            how = ("each gets an exactly zero gradient while they are zero and a nonzero one in a training step run "
                   "with them shifted together by 1 % (too many zero gradients to shift each alone)" if released else
                   "each is a factor of the other's gradient, so none moves this batch's loss alone (shifted by 1 %, "
                   "it stays bit-identical) and together they move it")
            return (f"{len(names)} tensors all zero in this checkpoint hold each other's gradient at zero "
                    f"({', '.join(names[:6])}{', …' if len(names) > 6 else ''}): {how}. None of them can move "
                    f"first: they never train{more}",
                    f"Initialize them with nonzero values before training — at most one factor of a product may "
                    f"start at zero, as PEFT starts lora_B — e.g. torch.nn.init.normal_(model.get_parameter("
                    f"'{names[0]}'), std=0.02); if they come from a saved checkpoint, "
                    "its weights were lost on the way (check how they were saved)")
        if "checkpoint_cut" in causes:
            names = [r.name for r in missing if r.cause == "checkpoint_cut"]
            tower = tower_of(names)
            return (f"reentrant gradient checkpointing cuts {len(names)} tensors under `{tower}`: its checkpointed "
                    "blocks receive inputs that do not require grad (the input-grad hook covers the text "
                    "embeddings, not this tower's input), so torch.utils.checkpoint runs them without grad and "
                    "nothing inside them gets a gradient (huggingface/trl#835, unslothai/unsloth#2142)",
                    "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False}) "
                    "(or TrainingArguments(gradient_checkpointing_kwargs={'use_reentrant': False})); or make the "
                    f"input of `{tower}` require grad, on the base model before get_peft_model: "
                    f"model.get_submodule('{tower}').register_forward_pre_hook("
                    "lambda m, args: tuple(a.requires_grad_(True) if torch.is_tensor(a) and a.is_floating_point() "
                    "else a for a in args))")
        if "code_cut" in causes:
            row = next(r for r in missing if r.cause == "code_cut")
            return (f"code outside the library cuts them from autograd at {row.where} (.detach(), .data or "
                    "torch.no_grad): the loss reads their values, but no gradient can flow back",
                    f"Remove the detach at {row.where}, or freeze these tensors if they are not meant to train.")
        if "loss_moves" in causes:
            return ("the loss moves when they are shifted by 1 %, yet their gradient is exactly zero: a backward on "
                    "their path drops it (a custom autograd.Function, a straight-through estimator, a hook)",
                    "Check the backward of the custom operations between these tensors and the loss.")
        return ("these tensors are off the forward path, or custom code detaches them (.detach(), torch.no_grad)",
                "Check that the modules run in forward and that no custom code detaches their activations.")

    def findings(self) -> list[Finding]:
        grouped = self.by_cause()
        evidence: dict[str, Any] = {"loss": self.loss, "checkpointing": self.checkpointing,
                                    "per_component": self.summary(),
                                    "missing": [r.as_row() for r in self.rows if r.status != "ok" and not r.expected][:40],
                                    "expected_zero": len(grouped.get("lora_b_zero", [])),
                                    "inputs": self.inputs_how, "never_run": self.unused[:40],
                                    "not_exercised": self.unexercised[:40],
                                    "no_gradient_by_design": {
                                        cause: [{"name": r.name, "where": r.where} for r in rows][:40]
                                        for cause, rows in grouped.items()
                                        if cause in ("selection_only", "library_no_grad", "loss_independent",
                                                     "choice_only", "padding_row_only", "behind_zeros")}}
        if self.zero_factors:
            evidence["zero_factors"] = self.zero_factors[:40]
        if self.not_asked:
            evidence["zero_gradients_not_explained"] = self.not_asked
        if self.backward_kernels:
            evidence["backward_kernels"] = self.backward_kernels
        if self.layout_note:
            evidence["bitsandbytes_cpu_layout"] = self.layout_note
        if self.offloaded:
            evidence["offloaded_not_judged"] = self.offloaded[:40]
            evidence["offloaded_count"] = len(self.offloaded)
        if self.packed_for_inference and not self.error:
            return [self._packed_finding(evidence)]
        if self.error and self.known_crash:
            return [self._known_crash_finding(evidence)]
        if self.error:
            if self.raised_at:
                evidence["raised_at"] = self.raised_at
            cause, fix = self._cause([])
            known = "does not require grad" in self.error
            return [Finding("grad.flow", "fail" if known else "error",
                            "The training step cannot backpropagate" if known else "The training step failed",
                            f"{self.error}" + (f" — cause: {cause}." if known else ""), evidence,
                            fix if known else "Read the exception; fix the model or the inputs.")]
        trainable = len(self.rows)
        if not trainable and self.offloaded:
            return [Finding("grad.flow", "skip", "Every trainable tensor is offloaded: no gradient can be read",
                            f"{offload_sentence(self.offloaded)}. accelerate runs each offloaded module on a "
                            "temporary copy of its weights loaded for that forward, so a backward's gradient lands "
                            "on the copy and never on the parameter: whether gradients flow cannot be read here. "
                            f"Loss {self.loss:.4f} (the forward and backward ran).", evidence,
                            "To check gradient flow, diagnose the model loaded as you train it, without cpu/disk "
                            "offload (a device_map on GPUs only, more --max-memory, or 4-bit): gradients of offloaded "
                            "weights never reach their parameters.")]
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
                            + ", ".join(f"{k}: {v}" for k, v in self.summary().items()) + f". Cause: {cause}."
                            + (f" Whether the loss moves with the zero ones was not asked: {self.not_asked}."
                               if self.not_asked else ""),
                            evidence, fix)]
        off_path = sum(len(rows) for cause, rows in grouped.items() if cause != "lora_b_zero")
        offloaded = (f". Not judged: {offload_sentence(self.offloaded)}; their gradient lands on the temporary "
                     "copy accelerate loads for each forward, never on the parameter" if self.offloaded else "")
        title = (f"All {trainable} trainable tensors receive a gradient" if not off_path and not self.offloaded else
                 f"All {trainable} trainable tensors not offloaded receive a gradient" if not off_path else
                 f"All {trainable - off_path} trainable tensors on this batch's loss path receive a gradient")
        return [Finding("grad.flow", "info" if off_path or self.offloaded else "pass", title,
                        f"loss {self.loss:.4f}" + "".join(self._explain(cause, rows) for cause, rows in grouped.items())
                        + offloaded + (f". Inputs: {self.inputs_how}" if self.inputs_how else ""), evidence)]

    def _explain(self, cause: str, rows: list[GradRow]) -> str:
        first = rows[0]
        if cause == "lora_b_zero":
            return f"; {len(rows)} {BENIGN[cause]}"
        where = f", {first.where}" if first.where else ""
        blocked = (f"; the exact zeros of {', '.join(self.zero_factors[:3])} (zero in this checkpoint) are what "
                   "block them: the gradient comes once those move" if cause == "loss_independent"
                   and self.zero_factors else "")
        return f"; {len(rows)} {BENIGN[cause]} (e.g. {first.name}{where}){blocked}"

    def _known_crash_finding(self, evidence: dict[str, Any]) -> Finding:
        """The step raised in the model's own code, for a reason recorded with its source (known_crashes): a
        user's training step under this set-up raises the same, whatever its batch."""
        crash = self.known_crash or {}
        installed = ", ".join(f"{k} {v}" for k, v in crash["installed"].items() if v)
        rerun = crash.get("without_autocast")
        checked = ("" if rerun is None else
                   f" The same step without autocast runs (loss {rerun['loss']:.4f})." if rerun.get("loss") is not None
                   else f" The same step without autocast raises too: {rerun['error']}.")
        where = f" (`{crash['module']}`)" if crash.get("module") else ""
        return Finding("grad.flow", "fail",
                       f"The training step raises in transformers' own {crash['class']}{where}: a known "
                       f"incompatibility of this set-up",
                       f"{crash['exception']} at {crash['source']}: `{crash['code']}`. Cause: {crash['cause']}. "
                       f"Raised for: {crash['condition']}. Seen on {crash['seen_on']}; installed here: {installed}; "
                       f"{crash['reference']}.{checked}",
                       {**evidence, "known_crash": crash}, crash["fix"])

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


def _role(name: str) -> str:
    return "lora_A" if ".lora_A." in name else "lora_B" if ".lora_B." in name else "other"


def _lora_b_is_zero(model: nn.Module, a_name: str) -> bool:
    b_name = a_name.replace(".lora_A.", ".lora_B.")
    params = dict(model.named_parameters())
    return b_name in params and not bool(params[b_name].detach().abs().sum())


def _read_gradients(model: nn.Module, read) -> list:
    """Hooks that hand each trainable tensor's gradient to `read(name, (status, norm))` (`_gradient_norm`) as it is
    accumulated, then drop it: a full fine-tune would otherwise hold a second model-sized buffer of gradients just
    so that we can look at them. Returns the hooks' handles, to remove."""
    handles = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            def record(param, name=name):
                read(name, _gradient_norm(param.grad.detach()))
                param.grad = None
            handles.append(p.register_post_accumulate_grad_hook(record))
    return handles


@contextlib.contextmanager
def _seeded(model: nn.Module):
    """The step's dropout and layerdrop draws fixed, the global random state restored after: which layers a
    layerdrop skips (and so which tensors get no gradient) must not depend on which probes ran before this one."""
    cuda = sorted({p.device for p in model.parameters() if p.device.type == "cuda"}, key=str)
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(0)
        yield


def _gradient_norm(grad: torch.Tensor) -> tuple[str, float]:
    """("ok" | "zero", the L2 norm). Taken in the gradient's own dtype: torch accumulates a half-precision norm in
    fp32 and rounds only the result, where a cast first copies the whole gradient (0.7 s over a 2.6 GB bf16
    Llama's). A result that is zero, infinite or below the dtype's smallest normal number (fp16 from 6e-5) can be
    that rounding's doing: taken again in fp32 — except a zero whose gradient holds only zeros (its smallest and
    largest element 0, a read 25× cheaper than the copy), which is exactly zero: the case of every gradient of a
    model that gets none, where those copies were 15 of a 7B-shaped checkpoint's 58 s step."""
    norm = float(grad.norm())
    if grad.dtype != torch.float32 and not torch.finfo(grad.dtype).tiny <= norm < math.inf:
        if norm == 0 and grad.layout == torch.strided and (  # aminmax takes no sparse gradient (sparse=True)
                grad.numel() == 0 or all(float(v) == 0 for v in torch.aminmax(grad))):
            return "zero", 0.0
        norm = float(grad.float().norm())
    return ("ok" if norm > 0 else "zero"), norm


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
    loss_value, error, promoted, crash, raised_at, not_asked = None, None, None, None, None, None
    seen: dict[str, tuple[str, float]] = {}  # each trainable tensor's (status, norm), read as it is accumulated
    handles = _read_gradients(model, seen.__setitem__)
    # how each trainable tensor reaches the loss, traced op by op: for those that get no gradient, the cause
    tracer = LossReachTracer(trainable_names(model.named_parameters()))
    reach = None

    def autocast():
        return autocast_in(device_type_of(model), compute_dtype_of(model))

    try:
        with _seeded(model), autocast(), tracer:
            output = model(**inputs)
            loss = loss_of(output)
        if compute_dtype_of(model) in (torch.bfloat16, torch.float16):  # the forward matrix's train / autocast cell
            remember_forward(model, target, inputs, "train", "autocast", output, "grad.flow's training step")
        del output
        reach = tracer.reach_of(loss)
        loss_value = float(loss.detach().float())
        if not math.isfinite(loss_value):  # NaN != NaN: every shift would read as "the loss moves"
            raise FloatingPointError(f"the loss of this batch is {loss_value} (every label masked, or the forward "
                                     "overflowed), so no gradient verdict is possible")
        with _seeded(model), _backward_kernels(model) as promoted:
            loss.backward()
    except Exception as exc:  # noqa: BLE001 - e.g. "element 0 of tensors does not require grad"
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
        crash = known_crash(model, exc)  # the model's own code, for any batch (a user's step too), or None
        frame = raising_frame(exc) if crash is None else None
        raised_at = f"{frame['file']}:{frame['line']} ({frame['function']}): {frame['code']}" if frame else None
        del exc, frame  # the traceback's frames hold the step's activations
    finally:
        for handle in handles:
            handle.remove()
    if crash is not None and compute_dtype_of(model) in (torch.bfloat16, torch.float16):
        crash["without_autocast"] = _step_without_autocast(model, inputs)
    has_pixels = any(k.startswith(("pixel_values", "image")) for k in inputs)
    rows: list[GradRow] = []
    zero_factors: list[str] = []
    offloaded = offloaded_parameters(model)
    trainable_set = {n for n, p in model.named_parameters() if p.requires_grad}
    if error is None:
        rows = _classified_rows(model, seen, reach, classifier, has_pixels, skip=set(offloaded))
        try:
            zero_factors = _explain_zero_gradients(model, rows, inputs, autocast)
        except ResourceError as exc:  # the copy a shift keeps would not fit: unexplained, and the report says why
            zero_factors, not_asked = [], str(exc)
        except Exception:  # noqa: BLE001 - a forward the step ran once should run again; if not, stay unexplained
            zero_factors = []
    model.train(was_training)
    model.zero_grad(set_to_none=True)
    return GradFlowResult(rows, loss_value, error, checkpointing_state(model), has_pixels, how,
                          [r.name for r in rows if r.cause == "not_read"],
                          [r.name for r in rows if r.cause == "no_image"],
                          describe(promoted), packed, held_layout_note(model), zero_factors,
                          [normalize_name(n) for n in offloaded if n in trainable_set], crash, raised_at, not_asked)


def _step_without_autocast(model: nn.Module, inputs: dict) -> dict[str, Any]:
    """The same training step with no autocast (TrainingArguments(bf16=False)): {'loss': ...} when it runs, else
    {'error': ...}. Checks the fix a known crash's row gives before the report states it."""
    model.zero_grad(set_to_none=True)
    try:
        loss = loss_of(model(**inputs))
        with (fp32_half_matmul(slow_half_dtypes_of(model)) if device_type_of(model) == "cpu"
              else contextlib.nullcontext()):
            loss.backward()
        return {"loss": float(loss.detach().float())}
    except Exception as exc:  # noqa: BLE001 - the answer is the exception
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    finally:
        model.zero_grad(set_to_none=True)


def _classified_rows(model: nn.Module, seen: dict, reach, classifier, has_pixels: bool,
                     skip: set[str] = frozenset()) -> list[GradRow]:
    """One row per trainable tensor, less those in `skip` (offloaded: their gradient cannot be read)."""
    owners = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    rows = []
    for name, p in model.named_parameters():
        if not p.requires_grad or name in skip:
            continue
        status, norm = seen.get(name, ("none", None))
        row = GradRow(normalize_name(name), classifier.component_of(name), _role(name), status, norm)
        if status == "zero" and row.role == "lora_A" and _lora_b_is_zero(model, name):
            row.cause = "lora_b_zero"
        elif status == "zero" and name in reach.padding_only:
            row.cause, row.where = "padding_row_only", f"padding_idx={reach.padding_only[name]}"
        elif status == "none" and row.component == "vision" and not has_pixels:
            row.cause = "no_image"
        elif status == "none":
            how, site = reach.why_no_gradient(name)
            if how in ("never_read", "not_on_loss"):
                row.cause = "not_read"
            elif how == "selection_only":
                row.cause, row.where = "selection_only", library_source(owners.get(id(p)))
            elif how == "cut":
                row.cause, row.where = cause_of_cut(site), site.describe() if site else None
            else:
                row.cause = how
        row.expected = row.cause if row.cause in BENIGN else None
        rows.append(row)
    return rows


MAX_SEPARATE_CHECKS = 16  # zero-gradient tensors shifted one by one when shifting them together moves the loss


def _backward_kernels(model: nn.Module):
    """Where the step's backward runs: on a CPU without native half-precision GEMM, its half products in fp32."""
    if device_type_of(model) != "cpu":
        return contextlib.nullcontext()
    return fp32_half_matmul(slow_half_dtypes_of(model, compute_dtype_of(model)))


def _nonzero_gradients_when_shifted(model: nn.Module, inputs: dict, autocast, moved: list[nn.Parameter]) -> set[str]:
    """The names of the trainable tensors (normalized) whose gradient is nonzero in one training step run with the
    tensors `moved` shifted together (`loss_dependence.shifted`: put back bit for bit after)."""
    nonzero: set[str] = set()
    handles = _read_gradients(model, lambda name, got: nonzero.add(normalize_name(name)) if got[0] == "ok" else None)
    try:
        with shifted(moved), _seeded(model):
            with autocast():
                loss = loss_of(model(**inputs))
            with _backward_kernels(model):
                loss.backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return nonzero


def _mark_held_by_zeros(model: nn.Module, zero: list[GradRow], inputs: dict, autocast, params: dict,
                        all_zero: set[str]) -> None:
    """Too many zero gradients to shift each alone (over MAX_SEPARATE_CHECKS), the loss moving with them shifted
    together: one training step is run with the all-zero tensors among them shifted together instead. A tensor whose
    gradient is nonzero there has a backward that works, and its zero gradient is held by those zeros:
    `mutual_zeros` where it is one of them (none of them can move first), `behind_zeros` where it is not. A tensor
    still without a gradient there stays `loss_moves`."""
    stuck = [r for r in zero if r.name in all_zero]
    if len(stuck) < 2:
        return
    released = _nonzero_gradients_when_shifted(model, inputs, autocast, [params[r.name] for r in stuck])
    for r in zero:
        if r.name in released:
            r.cause = "mutual_zeros" if r.name in all_zero else "behind_zeros"
            r.where = f"a gradient once the {len(stuck)} all-zero tensors among them are shifted together"
            r.expected = r.cause if r.cause in BENIGN else None


def _mark_mutual_zeros(model: nn.Module, rows: list[GradRow], inputs: dict, autocast, params: dict,
                       all_zero: set[str]) -> None:
    """All-zero tensors whose own gradient is zero and that each leave the loss unmoved alone (`loss_independent`,
    or a lora_A behind its zero lora_B), yet move it shifted together: the two factors of one product, each the
    other's gradient. None of them can move first, so none ever trains: their cause becomes `mutual_zeros`, a break.
    A zero gate whose own gradient is nonzero is not one of them: it moves on the first step and releases what it
    holds (`zero_factors_blocking`)."""
    stuck = [r for r in rows if r.name in all_zero and r.status == "zero"
             and r.cause in ("loss_independent", "lora_b_zero")]
    if len(stuck) < 2 or not loss_moves_with(model, inputs, loss_of, autocast, [params[r.name] for r in stuck]):
        return
    for r in stuck:
        r.cause, r.expected, r.where = "mutual_zeros", None, None


def _explain_zero_gradients(model: nn.Module, rows: list[GradRow], inputs: dict, autocast) -> list[str]:
    """Zero gradients not yet explained: the truth where the loss does not move with the tensor, else a break.
    Returns the all-zero trainable tensors shown to be what holds those gradients at zero."""
    params = {normalize_name(n): p for n, p in model.named_parameters() if p.requires_grad}
    zero = [r for r in rows if r.status == "zero" and r.cause is None]
    if not zero:
        return []
    together = loss_response(model, inputs, loss_of, autocast, [params[r.name] for r in zero])
    too_many = len(zero) > MAX_SEPARATE_CHECKS
    if (not together.moves and not together.flipped_at) or too_many or len(zero) == 1:
        responses = {r.name: together for r in zero}
    else:
        responses = {r.name: loss_response(model, inputs, loss_of, autocast, [params[r.name]]) for r in zero}
    for r in zero:
        response = responses[r.name]
        r.cause = ("loss_moves" if response.moves else "choice_only" if response.flipped_at
                   else "loss_independent")
        r.where = response.flipped_at
        r.expected = r.cause if r.cause in BENIGN else None
    all_zero = {n for n, p in params.items() if p.is_floating_point() and not p.detach().any()}
    if too_many and together.moves:
        _mark_held_by_zeros(model, zero, inputs, autocast, params, all_zero)
    _mark_mutual_zeros(model, rows, inputs, autocast, params, all_zero)
    independent = [r for r in zero if r.cause == "loss_independent"]
    if not independent:
        return []
    # the checkpoint's exact zeros (zero-initialized gates and scales) that multiply their contribution away
    exact_zeros = {n: params[n] for n in sorted(all_zero) if ".lora_B." not in n and n not in {r.name for r in zero}
                   and n not in {r.name for r in rows if r.cause == "mutual_zeros"}}
    held = [params[r.name] for r in independent]

    def blocking(names: list[str]) -> list[str]:
        """The exact zeros among `names` that alone release the gradient, found by halving (a few forwards)."""
        if not zero_factors_blocking(model, inputs, loss_of, autocast, held, [exact_zeros[n] for n in names]):
            return []
        if len(names) == 1:
            return names
        half = len(names) // 2
        return (blocking(names[:half]) + blocking(names[half:])) or names

    return sorted(blocking(sorted(exact_zeros)))
