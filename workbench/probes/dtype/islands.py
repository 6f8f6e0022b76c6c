"""fp32 islands: floating tensors whose dtype differs from the compute dtype.

They are harmless while autocast covers the forward, and crash it where autocast does not reach (DataParallel
replica threads, FSDP mixed precision casting parameters but not buffers): a bf16 activation meets an fp32
norm or buffer, becomes fp32, and the next bf16 matmul raises `float != BFloat16`. Known-intentional ones
(rotary frequencies, `_keep_in_fp32_modules`, PEFT adapter weights kept in fp32) are reported as info.

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
from workbench.model.dtypes import compute_dtype_of, dtype_name, keep_in_fp32_matcher, off_compute_dtype
from workbench.model.forward import run_forward
from workbench.model.tied import tied_aliases, tied_notes
from workbench.probes.dtype.tracer import DtypeTracer


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


def returns_input_dtype(module: nn.Module, compute_dtype: torch.dtype) -> bool:
    """Whether a module hands back the dtype it is given whatever its own tensors' dtype, asked by calling it on a
    tiny input of the compute dtype. Only leaf-like modules whose input width is known are asked: norm-like ones
    (their parameters 1-D: Gemma 3's RMSNorm computes in fp32 and returns `output.type_as(x)`, Llama's returns
    `weight * x.to(input_dtype)`, fp32 for an fp32 weight) and layers with `in_features` (bitsandbytes' Linear4bit
    casts its fp32 bias to its compute dtype and returns `.to(inp_dtype)`; a plain fp32 Linear raises)."""
    own = [p for _, p in module.named_parameters(recurse=False)]
    if not own or len(own) != sum(1 for _ in module.parameters()):
        return False
    width = getattr(module, "in_features", None)
    if not isinstance(width, int):
        if any(p.dim() != 1 for p in own):
            return False
        width = own[0].shape[0]
    device = own[0].device
    if device.type == "meta":
        return False
    try:
        with torch.no_grad():
            out = module(torch.randn(1, 2, width, dtype=compute_dtype, device=device))
    except Exception:  # noqa: BLE001 - a module that cannot take a plain tensor: not known to be contained
        return False
    return isinstance(out, torch.Tensor) and out.dtype == compute_dtype


def buffer_owners_returning_compute(model: nn.Module, inputs: dict, compute_dtype: torch.dtype,
                                    owners: set[str]) -> set[str]:
    """Of the modules named in `owners` (holders of an off-dtype buffer), those that, in one eval forward of
    `inputs` without autocast, return the compute dtype whenever they are given it: their buffer never reaches
    the activations (CodeGen's fp32 `embed_positions` table, whose attention computes in fp32 and casts back)."""
    name = dtype_name(compute_dtype)
    was_training = model.training
    model.eval()
    try:
        with DtypeTracer(model) as tracer:
            _out, exc = run_forward(model, inputs, "no autocast", compute_dtype)
    finally:
        model.train(was_training)
    if exc is not None:
        return set()
    verdict: dict[str, bool] = {}
    for call in tracer.calls:
        if call.path in owners and call.outputs and name in call.inputs:
            verdict[call.path] = verdict.get(call.path, True) and all(o == name for o in call.outputs)
    return {path for path, kept in verdict.items() if kept}


def fp32_islands(model: nn.Module, compute_dtype: torch.dtype | None = None,
                 classifier: ComponentClassifier | None = None, inputs: dict | None = None) -> Islands:
    compute_dtype = compute_dtype or compute_dtype_of(model)
    classifier = classifier or ComponentClassifier.from_model(model)
    inner, prefix = unwrap_model(model)
    keep_fp32 = keep_in_fp32_matcher(inner)
    adapter_names = _adapter_parameter_names(model)
    quantized = bool(getattr(inner, "is_loaded_in_4bit", False) or getattr(inner, "is_loaded_in_8bit", False))
    kbit_reason, half, peft = kbit_upcast_reason(model, adapter_names, compute_dtype) if quantized else (None, [], "")
    islands: list[Island] = []
    contained: dict[int, bool] = {}  # per module, asked only when needed
    buffers_kept: set[str] = set()
    if inputs is not None:
        owners = {off.module_name for off in off_compute_dtype(model, compute_dtype, kinds=("buffer",))
                  if not off.rotary}
        buffers_kept = buffer_owners_returning_compute(model, inputs, compute_dtype, owners) if owners else set()
    for off in off_compute_dtype(model, compute_dtype):  # a tied parameter is one island, not two
        module, name, tensor = off.module, off.name, off.tensor
        inner_name = name[len(prefix) + 1:] if prefix and name.startswith(prefix + ".") else name
        why = None
        if off.rotary:
            why = (f"rotary position frequencies ({type(module).__name__}, recomputed from the config) are kept "
                   "in fp32 on purpose (position precision)")
        elif keep_fp32(inner_name):
            why = f"{type(inner).__name__}._keep_in_fp32_modules declares it fp32"
        elif name in adapter_names:
            why = "PEFT keeps adapter weights in fp32 (autocast_adapter_dtype) and casts activations around them"
        elif off.kind == "parameter" and kbit_reason and tensor.dtype == torch.float32:
            why = kbit_reason
        elif off.kind == "buffer" and off.module_name in buffers_kept:
            why = (f"contained: {type(module).__name__} returned {dtype_name(compute_dtype)} for "
                   f"{dtype_name(compute_dtype)} inputs in a forward of the diagnosis batch, so its "
                   f"{dtype_name(tensor.dtype)} buffer never reaches the activations")
        elif off.kind == "parameter":
            if id(module) not in contained:
                contained[id(module)] = returns_input_dtype(module, compute_dtype)
            if contained[id(module)]:
                why = (f"contained: {type(module).__name__} returns its input's dtype (called on a "
                       f"{dtype_name(compute_dtype)} input it returned {dtype_name(compute_dtype)}), so its "
                       f"{dtype_name(tensor.dtype)} weight never reaches the activations")
        islands.append(Island(name, off.kind, dtype_name(tensor.dtype), classifier.component_of(name),
                              off.module_frozen, why))
    # frozen modules first, buffers before parameters: the DataParallel-replica and FSDP buffer leaks come from there
    islands.sort(key=lambda i: (i.intentional is not None, not i.module_frozen, i.kind != "buffer", i.name))
    upcast = f"{peft}: prepare_model_for_kbit_training" if kbit_reason else None
    return Islands(dtype_name(compute_dtype), islands, quantized, tied_aliases(model), half, upcast)
