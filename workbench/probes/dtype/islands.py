"""fp32 islands: floating tensors whose dtype differs from the compute dtype.

They are harmless while autocast covers the forward, and crash it where autocast does not reach (DataParallel
replica threads, FSDP mixed precision casting parameters but not buffers): a bf16 activation meets an fp32
norm or buffer, becomes fp32, and the next bf16 matmul raises `float != BFloat16`. Known-intentional ones
(rotary frequencies, `_keep_in_fp32_modules`, PEFT adapter weights kept in fp32, the all-fp32 state of
prepare_model_for_kbit_training) and contained ones (`containment`: the module holding the tensor, traced in a
forward of the diagnosis batch, hands back the compute dtype) are reported as info.

Rotary buffers are recognised by the module that owns them, not by their name (Gemma 3 registers
`sliding_attention_inv_freq` beside `full_attention_inv_freq`): a non-persistent buffer of a rotary module, one whose
class is a `...RotaryEmbedding` or that carries transformers' `rope_type`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import torch
from torch import nn

from workbench.display.nodes import Bold, Display, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.components import ComponentClassifier, unwrap_model
from workbench.model.dtypes import (
    OffDtypeTensor,
    compute_dtype_of,
    dtype_name,
    keep_in_fp32_matcher,
    off_compute_dtype,
)
from workbench.model.tied import tied_aliases, tied_notes
from workbench.probes.dtype.containment import (
    NOT_TRACED,
    TracedForward,
    class_built_dtypes,
    returns_input_dtype,
    traced_containment,
)


@dataclasses.dataclass
class Island:
    name: str
    kind: str  # parameter | buffer
    dtype: str
    component: str
    module_frozen: bool
    intentional: str | None  # why it is fp32 on purpose, or None

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(repr=False)
class Islands(ProbeResult):
    compute_dtype: str
    islands: list[Island]
    quantized: bool
    tied: dict[str, str] = dataclasses.field(default_factory=dict)  # alias -> canonical: one tensor, listed once
    half_precision: list[str] = dataclasses.field(default_factory=list)  # k-bit: non-quantized fp16/bf16 params
    kbit_upcast: str | None = None  # "peft 0.21.2: prepare_model_for_kbit_training" when its fp32 state is intact

    @property
    def suspicious(self) -> list[Island]:
        return [i for i in self.islands if not i.intentional]

    def to_frame(self):
        import pandas as pd

        frame = pd.DataFrame([i.as_row() for i in self.islands],
                             columns=["name", "kind", "dtype", "component", "module_frozen", "intentional"])
        return frame.fillna({"intentional": ""})

    def details(self):
        head = Paragraph("Compute dtype ", Bold(self.compute_dtype), f": {len(self.suspicious)} suspicious, "
                         f"{len(self.islands) - len(self.suspicious)} intentional island(s).")
        return Display(head, Table.from_frame(self.to_frame().head(200)))

    def findings(self) -> list[Finding]:
        sus = self.suspicious
        by_component = Counter((i.component, i.dtype) for i in sus)
        evidence = {
            "compute_dtype": self.compute_dtype,
            "suspicious": [i.as_row() for i in sus[:40]],
            "suspicious_count": len(sus),
            "suspicious_by_component": {f"{c}/{d}": n for (c, d), n in sorted(by_component.items())},
            "intentional": [i.as_row() for i in self.islands if i.intentional][:20],
        }
        if self.tied:
            evidence["tied"] = tied_notes(self.tied)
        if self.half_precision:
            evidence["half_precision_parameters"] = self.half_precision[:20]
        if self.kbit_upcast:
            evidence["intentional_upcast_by"] = self.kbit_upcast
        if not self.islands:
            return [Finding("dtype.fp32_islands", "pass", f"Every floating tensor is {self.compute_dtype}",
                            "No parameter or buffer differs from the compute dtype.", evidence)]
        if not sus:
            reasons = sorted({i.intentional for i in self.islands if i.intentional})
            how = "on purpose or contained" if any(r.startswith("contained") for r in reasons) else "on purpose"
            return [Finding("dtype.fp32_islands", "info",
                            f"{len(self.islands)} tensor(s) differ from {self.compute_dtype}, all {how}",
                            "; ".join(reasons), evidence)]
        first = sus[0]
        cause = ""
        if self.quantized and self.half_precision:
            cause = (f" This k-bit model mixes them with {len(self.half_precision)} non-quantized half-precision "
                     f"parameter(s) (e.g. {self.half_precision[0]}): not the all-fp32 state peft's "
                     "prepare_model_for_kbit_training leaves (that one is intentional), but what older trl's "
                     "peft_module_casting_to_bf16 made of it (norms fp32, lm_head / embed_tokens back to bf16).")
        frozen = sum(i.module_frozen for i in sus)
        return [Finding(
             "dtype.fp32_islands", "warn",
             f"{len(sus)} floating tensor(s) are not {self.compute_dtype}, e.g. {first.name} ({first.dtype})",
             f"{frozen} of them in frozen modules, {sum(i.kind == 'buffer' for i in sus)} buffers; by component: "
             + ", ".join(f"{k} {v}" for k, v in evidence["suspicious_by_component"].items()) + "."
             + " They promote activations to fp32 wherever autocast does not cover the forward (DataParallel "
               "replica threads, FSDP mixed precision, which casts parameters but never buffers), and the next "
             + f"{self.compute_dtype} matmul raises 'float != BFloat16'." + cause,
             evidence,
             "Train under autocast (TrainingArguments(bf16=True)) and keep the Trainer from wrapping the model in "
             "DataParallel (one visible GPU, or torchrun/DDP); or cast frozen modules to the compute dtype, e.g. "
             f"`model.get_submodule('{first.name.rsplit('.', 1)[0]}').to(torch.{self.compute_dtype})`.",
         )]


def _adapter_parameter_names(model: nn.Module) -> set[str]:
    """Names of PEFT adapter weights, asked from PEFT's own tuner layers (their adapter_layer_names)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return set()
    names: set[str] = set()
    for mod_name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            for attr in module.adapter_layer_names:
                holder = getattr(module, attr, None)
                if holder is None:
                    continue
                for pname, _ in holder.named_parameters():
                    names.add(f"{mod_name}.{attr}.{pname}")
    return names


HALF = (torch.float16, torch.bfloat16)


def kbit_upcast_reason(model: nn.Module, adapter_names: set[str],
                       compute_dtype: torch.dtype) -> tuple[str | None, list[str], str]:
    """(why the fp32 parameters of a k-bit model are intentional, or None; the non-quantized fp16/bf16 parameters;
    the peft release named as evidence).

    peft's `prepare_model_for_kbit_training` casts every parameter that is fp16/bf16 and not a packed `Params4bit`
    to fp32 (peft/utils/other.py): its result has no half-precision parameter left outside the k-bit layers, and
    those layers cast their input to their compute dtype and their output back (bitsandbytes' Linear4bit returns
    `.to(inp_dtype)`), so activations stay fp32 from the embedding to the head and meet no bf16 weight. That state
    is intentional. A k-bit model with fp32 parameters *and* non-quantized half ones (older trl's
    `peft_module_casting_to_bf16`: norms fp32, lm_head / embed_tokens back to bf16) is not: without autocast an
    fp32 norm's output reaches a bf16 head and the matmul raises.
    """
    half: list[str] = []
    fp32 = 0
    seen: set[int] = set()
    # a k-bit layer's own bias: bitsandbytes casts it in place to the dtype it computes in on every forward
    # (bitsandbytes/nn/modules.py, Linear4bit.forward: `bias.data = bias.data.to(x.dtype)`; Linear8bitLt alike),
    # so after one forward it is half precision whatever prepare_model_for_kbit_training left
    kbit_biases = {id(m.bias) for m in model.modules()
                   if type(m).__name__ in ("Linear4bit", "Linear8bitLt") and getattr(m, "bias", None) is not None}
    for name, p in model.named_parameters():
        if id(p) in seen or name in adapter_names or not p.dtype.is_floating_point or id(p) in kbit_biases:
            continue
        seen.add(id(p))
        if p.dtype in HALF:
            half.append(name)
        elif p.dtype == torch.float32:
            fp32 += 1
    try:
        from importlib.metadata import version

        peft = f"peft {version('peft')}"
    except Exception:  # noqa: BLE001 - peft absent: the state is still the one its function leaves
        peft = "peft"
    if half or not fp32:
        return None, half, peft
    return (f"k-bit model with all {fp32} non-quantized parameters in fp32, the state {peft}'s "
            "prepare_model_for_kbit_training leaves on purpose (it casts every non-quantized fp16/bf16 parameter "
            f"to fp32): activations stay fp32 between the k-bit layers, which compute in {dtype_name(compute_dtype)} "
            "and return their input's dtype, so no fp32 output meets a half-precision weight"), half, peft


def fp32_islands(model: nn.Module, compute_dtype: torch.dtype | None = None,
                 classifier: ComponentClassifier | None = None, inputs: dict | None = None) -> Islands:
    compute_dtype = compute_dtype or compute_dtype_of(model)
    classifier = classifier or ComponentClassifier.from_model(model)
    inner, prefix = unwrap_model(model)
    keep_fp32 = keep_in_fp32_matcher(inner)
    adapter_names = _adapter_parameter_names(model)
    quantized = bool(getattr(inner, "is_loaded_in_4bit", False) or getattr(inner, "is_loaded_in_8bit", False))
    kbit_reason, half, peft = kbit_upcast_reason(model, adapter_names, compute_dtype) if quantized else (None, [], "")
    compute = dtype_name(compute_dtype)
    reasons: dict[str, str | None] = {}
    offs = list(off_compute_dtype(model, compute_dtype))  # a tied parameter is one island, not two
    for off in offs:
        reasons[off.name] = _declared_reason(off, inner, prefix, keep_fp32, adapter_names, kbit_reason)
    direct: dict[int, bool] = {}  # per module, asked only when needed
    for off in offs:
        if reasons[off.name] is None and off.kind == "parameter":
            if id(off.module) not in direct:
                direct[id(off.module)] = returns_input_dtype(off.module, compute_dtype)
            if direct[id(off.module)]:
                reasons[off.name] = (f"contained: {type(off.module).__name__} returns its input's dtype (called on "
                                     f"a {compute} input it returned {compute}), so its "
                                     f"{dtype_name(off.tensor.dtype)} weight never reaches the activations")
    open_holders = {off.module_name for off in offs if reasons[off.name] is None}
    traced = (traced_containment(model, inputs, compute_dtype, open_holders) if inputs and open_holders
              else NOT_TRACED)
    for off in offs:
        verdict = traced.verdicts.get(off.module_name)
        if reasons[off.name] is None and verdict is not None and verdict.contained:
            reasons[off.name] = verdict.reason(off.module_name, type(off.module).__name__, compute,
                                               dtype_name(off.tensor.dtype))
    _explain_untraced_buffers(offs, reasons, traced, inner, prefix, compute_dtype)
    _explain_class_built_parameters(offs, reasons, traced, inner, prefix, compute_dtype)
    islands = [Island(off.name, off.kind, dtype_name(off.tensor.dtype), classifier.component_of(off.name),
                      off.module_frozen, reasons[off.name]) for off in offs]
    # frozen modules first, buffers before parameters: the DataParallel-replica and FSDP buffer leaks come from there
    islands.sort(key=lambda i: (i.intentional is not None, not i.module_frozen, i.kind != "buffer", i.name))
    upcast = f"{peft}: prepare_model_for_kbit_training" if kbit_reason else None
    return Islands(compute, islands, quantized, tied_aliases(model), half, upcast)


def _declared_reason(off: OffDtypeTensor, inner: nn.Module, prefix: str, keep_fp32, adapter_names: set[str],
                     kbit_reason: str | None) -> str | None:
    """Why a tensor is off the compute dtype on purpose, read from the model's, PEFT's or the k-bit state's own
    contract; None when nothing declares it."""
    inner_name = off.name[len(prefix) + 1:] if prefix and off.name.startswith(prefix + ".") else off.name
    if off.rotary:
        return (f"rotary position frequencies ({type(off.module).__name__}, recomputed from the config) are kept "
                "in fp32 on purpose (position precision)")
    if keep_fp32(inner_name):
        return f"{type(inner).__name__}._keep_in_fp32_modules declares it fp32"
    if off.name in adapter_names:
        return "PEFT keeps adapter weights in fp32 (autocast_adapter_dtype) and casts activations around them"
    if kbit_reason and off.tensor.dtype == torch.float32:
        if off.kind == "parameter":
            return kbit_reason
        return ("an fp32 buffer in a k-bit model whose non-quantized parameters are all fp32 (peft's "
                "prepare_model_for_kbit_training): the activations between the k-bit layers are fp32 like it, so "
                "it promotes nothing")
    return None


def _explain_untraced_buffers(offs: list[OffDtypeTensor], reasons: dict[str, str | None], traced: TracedForward,
                              inner: nn.Module, prefix: str, compute_dtype: torch.dtype) -> None:
    """Buffers left unexplained whose module the traced forward never reached (a tower the batch does not feed,
    or no batch at all): contained where another module of the same class was traced and contained (the same
    code), else the class's own choice where the class, loaded in the compute dtype, builds it in this dtype
    too (a position or frequency table computed in fp32 at construction). A buffer the trace saw promote stays
    suspicious, and so does one the class would not hold in this dtype (the user's doing)."""
    pending = [off for off in offs if reasons[off.name] is None and off.kind == "buffer"
               and off.module_name not in traced.reached]
    if not pending or traced.raised:  # a forward that raised may have stopped short of them: no excuse for any
        return
    compute = dtype_name(compute_dtype)
    unseen = ("the diagnosis forward did not reach its module" if traced.ran
              else "no forward of a diagnosis batch ran")
    contained_classes = {type(off.module): off.module_name for off in offs
                         if off.module_name in traced.verdicts and traced.verdicts[off.module_name].contained}
    class_dtypes: dict[str, torch.dtype] | None = None
    for off in pending:
        twin = contained_classes.get(type(off.module))
        if twin is not None:
            reasons[off.name] = (f"contained: `{twin}`, another {type(off.module).__name__}, kept its "
                                 f"{dtype_name(off.tensor.dtype)} tensor from the activations in a forward of the "
                                 "diagnosis batch (the same code); this one was not reached by that batch")
            continue
        if class_dtypes is None:
            class_dtypes = class_built_dtypes(inner, compute_dtype)
        inner_name = off.name[len(prefix) + 1:] if prefix and off.name.startswith(prefix + ".") else off.name
        if class_dtypes.get(inner_name) == off.tensor.dtype:
            reasons[off.name] = (f"built in {dtype_name(off.tensor.dtype)} by {type(inner).__name__} itself (its "
                                 f"own {compute} load holds it so: {type(off.module).__name__} computes it at "
                                 f"construction); {unseen}, so whether it stays out of the activations is not "
                                 "traced")


def _explain_class_built_parameters(offs: list[OffDtypeTensor], reasons: dict[str, str | None],
                                    traced: TracedForward, inner: nn.Module, prefix: str,
                                    compute_dtype: torch.dtype) -> None:
    """Parameters left unexplained that the class itself builds in their dtype whatever the load dtype (its own
    load in the compute dtype, rebuilt on meta, holds them so: HunYuan-MoE's router `wg` is
    `nn.Linear(..., dtype=torch.float32)` and upcasts its input; Zamba's `A_log` is used as `A_log.float()`), when
    the traced forward of the diagnosis batch ran in the compute dtype without raising (the class computes there in
    that dtype on purpose), or when no batch ran at all (said so: not traced). A class whose own fp32 parameters break the forward (XLNet, DeBERTa) stays suspicious,
    and so does a parameter the class would build in the compute dtype (the user's cast)."""
    pending = [off for off in offs if reasons[off.name] is None and off.kind == "parameter"]
    if not pending or traced.raised:  # a forward that raised on them is the class's break, not its choice
        return
    class_dtypes = class_built_dtypes(inner, compute_dtype)
    compute = dtype_name(compute_dtype)
    for off in pending:
        inner_name = off.name[len(prefix) + 1:] if prefix and off.name.startswith(prefix + ".") else off.name
        if class_dtypes.get(inner_name) != off.tensor.dtype:
            continue
        built = f"built in {dtype_name(off.tensor.dtype)} by {type(inner).__name__} itself (its own {compute} load holds it so)"
        reasons[off.name] = (
            f"{built}, and the {compute} forward of the diagnosis batch runs: {type(off.module).__name__} computes in "
            f"{dtype_name(off.tensor.dtype)} there on purpose" if traced.ran else
            f"{built}; no forward of a diagnosis batch ran, so whether it stays out of the activations is not traced")
