"""fp32 islands: floating tensors whose dtype differs from the compute dtype.

They are harmless while autocast covers the forward, and crash it where autocast does not reach (DataParallel
replica threads, FSDP mixed precision casting parameters but not buffers): a bf16 activation meets an fp32
norm or buffer, becomes fp32, and the next bf16 matmul raises `float != BFloat16`. Known-intentional ones
(rotary `inv_freq`, `_keep_in_fp32_modules`, PEFT adapter weights kept in fp32) are reported as info.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import torch
from torch import nn

from workbench.probes.dtype.census import dtype_name, keep_in_fp32_matcher
from workbench.model.components import ComponentClassifier, unwrap_model
from workbench.findings import Finding
from workbench.report.text import TextRepr

ROTARY_BUFFERS = ("inv_freq", "original_inv_freq")


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
class Islands(TextRepr):
    compute_dtype: str
    islands: list[Island]
    quantized: bool

    @property
    def suspicious(self) -> list[Island]:
        return [i for i in self.islands if not i.intentional]

    def to_frame(self):
        import pandas as pd

        frame = pd.DataFrame([i.as_row() for i in self.islands],
                             columns=["name", "kind", "dtype", "component", "module_frozen", "intentional"])
        return frame.fillna({"intentional": ""})

    def display(self):
        from workbench.report.display import Bold, Display, Paragraph, Table

        head = Paragraph("Compute dtype ", Bold(self.compute_dtype), f": {len(self.suspicious)} suspicious, "
                         f"{len(self.islands) - len(self.suspicious)} intentional island(s).")
        return Display(head, Table.from_frame(self.to_frame().head(200)))

    def finding(self) -> Finding:
        sus = self.suspicious
        by_component = Counter((i.component, i.dtype) for i in sus)
        evidence = {
            "compute_dtype": self.compute_dtype,
            "suspicious": [i.as_row() for i in sus[:40]],
            "suspicious_count": len(sus),
            "suspicious_by_component": {f"{c}/{d}": n for (c, d), n in sorted(by_component.items())},
            "intentional": [i.as_row() for i in self.islands if i.intentional][:20],
        }
        if not self.islands:
            return Finding("dtype.fp32_islands", "pass", f"Every floating tensor is {self.compute_dtype}",
                           "No parameter or buffer differs from the compute dtype.", evidence)
        if not sus:
            reasons = sorted({i.intentional for i in self.islands if i.intentional})
            return Finding("dtype.fp32_islands", "info",
                           f"{len(self.islands)} tensor(s) differ from {self.compute_dtype}, all on purpose",
                           "; ".join(reasons), evidence)
        first = sus[0]
        cause = (" In a k-bit model, peft's prepare_model_for_kbit_training upcasts non-quantized parameters to "
                 "fp32 on purpose, for training under autocast (older trl then cast norms to fp32 and lm_head "
                 "back to bf16)." if self.quantized else "")
        frozen = sum(i.module_frozen for i in sus)
        return Finding(
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
        )


def compute_dtype_of(model: nn.Module) -> torch.dtype:
    """The quantization's compute dtype if quantized, else the dtype holding most floating parameter elements."""
    inner, _ = unwrap_model(model)
    qconfig = getattr(getattr(inner, "config", None), "quantization_config", None)
    compute = getattr(qconfig, "bnb_4bit_compute_dtype", None) if qconfig is not None else None
    if isinstance(qconfig, dict):
        compute = qconfig.get("bnb_4bit_compute_dtype")
    if isinstance(compute, str):
        compute = getattr(torch, compute, None)
    if isinstance(compute, torch.dtype) and getattr(inner, "is_loaded_in_4bit", False):
        return compute
    sizes: Counter = Counter()
    for p in model.parameters():
        if p.dtype.is_floating_point:
            sizes[p.dtype] += p.numel()
    return sizes.most_common(1)[0][0] if sizes else torch.float32


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


def fp32_islands(model: nn.Module, compute_dtype: torch.dtype | None = None,
                 classifier: ComponentClassifier | None = None) -> Islands:
    compute_dtype = compute_dtype or compute_dtype_of(model)
    classifier = classifier or ComponentClassifier.from_model(model)
    inner, prefix = unwrap_model(model)
    keep_fp32 = keep_in_fp32_matcher(inner)
    adapter_names = _adapter_parameter_names(model)
    islands: list[Island] = []
    for mod_name, module in model.named_modules():
        own_params = list(module.named_parameters(recurse=False))
        subtree_frozen = not any(p.requires_grad for p in module.parameters())
        tensors = [("parameter", n, t) for n, t in own_params] + \
                  [("buffer", n, t) for n, t in module.named_buffers(recurse=False)]
        for kind, short, tensor in tensors:
            if not tensor.dtype.is_floating_point or tensor.dtype == compute_dtype:
                continue
            name = f"{mod_name}.{short}" if mod_name else short
            inner_name = name[len(prefix) + 1:] if prefix and name.startswith(prefix + ".") else name
            if kind == "buffer" and short in ROTARY_BUFFERS:
                why = "rotary position frequencies are kept in fp32 on purpose (position precision)"
            elif keep_fp32(inner_name):
                why = f"{type(inner).__name__}._keep_in_fp32_modules declares it fp32"
            elif name in adapter_names:
                why = "PEFT keeps adapter weights in fp32 (autocast_adapter_dtype) and casts activations around them"
            else:
                why = None
            islands.append(Island(name, kind, dtype_name(tensor.dtype), classifier.component_of(name),
                                  subtree_frozen, why))
    # frozen modules first, buffers before parameters: the seeds' and FSDP's leaks come from there
    islands.sort(key=lambda i: (i.intentional is not None, not i.module_frozen, i.kind != "buffer", i.name))
    quantized = bool(getattr(inner, "is_loaded_in_4bit", False) or getattr(inner, "is_loaded_in_8bit", False))
    return Islands(dtype_name(compute_dtype), islands, quantized)
