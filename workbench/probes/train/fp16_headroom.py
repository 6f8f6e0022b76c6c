"""How far a model's activations sit below fp16's largest finite value (65504), from one fp32 forward.

Two views of the same forward:

- **AMP** (`fp16=True` with fp32 weights): autocast runs the matrix products in fp16 and leaves the rest in fp32, so
  what must fit is the inputs and outputs of those products: `F.linear`, `matmul`/`@`, `bmm`, `baddbmm`, `mm`,
  `addmm`, `einsum`, the convolutions and `scaled_dot_product_attention` (torch's CUDA autocast fp16 op list). A
  `TorchFunctionMode` records them, attributed to the innermost module that called them.
- **half weights** (a model stored in fp16): every tensor is fp16, the residual stream included, so every module's
  floating outputs must fit.

Headroom is `log2(65504 / amax)` bits: below 0 the value overflows to inf in fp16. The residual stream is read at
each decoder block's output (blocks are the classes the model declares unsplittable, `_no_split_modules`).

`FP16_REFUSED_BY_VLLM` is vLLM's own list of model types it refuses to run in float16, kept as data.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from workbench.model.finiteness import largest_magnitude

FP16_MAX = 65504.0
WARN_BITS = 4.0

# vLLM refuses these model types in float16 ("Numerical instability. Please use bfloat16 or float32 instead.").
# Source: vllm-project/vllm, vllm/config/model.py, `_FLOAT16_NOT_SUPPORTED_MODELS` (commit 0052a5b818980ce8a0477706aaf9f75bd5af72cd).
FP16_REFUSED_BY_VLLM: dict[str, str] = {
    "gemma2": "Numerical instability. Please use bfloat16 or float32 instead.",
    "gemma3": "Numerical instability. Please use bfloat16 or float32 instead.",
    "gemma3_text": "Numerical instability. Please use bfloat16 or float32 instead.",
    "plamo2": "Numerical instability. Please use bfloat16 or float32 instead.",
    "glm4": "Numerical instability. Please use bfloat16 or float32 instead.",
}
VLLM_SOURCE = ("vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS (vllm-project/vllm at commit "
               "0052a5b818980ce8a0477706aaf9f75bd5af72cd)")

_F = torch.nn.functional
AMP_FP16_FUNCTIONS = frozenset({
    _F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.bmm,
    torch.Tensor.bmm, torch.baddbmm, torch.Tensor.baddbmm, torch.mm, torch.Tensor.mm, torch.addmm, torch.Tensor.addmm,
    torch.einsum, _F.conv1d, _F.conv2d, _F.conv3d, _F.scaled_dot_product_attention,
})


def headroom_bits(amax: float) -> float:
    """log2(65504 / amax): bits left before fp16 overflows; inf for an all-zero tensor, -inf for inf/NaN."""
    if amax == 0:
        return math.inf
    if not math.isfinite(amax):
        return -math.inf
    return math.log2(FP16_MAX / amax)


def _amax(value: Any) -> float:
    """The largest |x| over the floating tensors in a (nested) output; NaN counts as overflow."""
    if torch.is_tensor(value):
        if not value.is_floating_point() or value.numel() == 0 or value.device.type == "meta":
            return 0.0
        peak = largest_magnitude(value)  # one min/max reduction, no |x| copy of every weight a product reads
        return math.inf if math.isnan(peak) else float(peak)
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return max((_amax(v) for v in value), default=0.0)
    return 0.0


class _AmpRecorder(TorchFunctionMode):
    """Records max |input| (weights included: autocast casts them too), |output| of the products autocast runs in fp16, per innermost module."""

    def __init__(self, stack: list[str], peaks: dict[str, list]) -> None:
        super().__init__()
        self.stack, self.peaks = stack, peaks

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in AMP_FP16_FUNCTIONS:
            where = self.stack[-1] if self.stack else "(model)"
            peak = self.peaks.setdefault(where, [0.0, getattr(func, "__name__", str(func))])
            value = max(_amax(list(args)), _amax(out))
            if value > peak[0]:
                peak[0], peak[1] = value, getattr(func, "__name__", str(func))
        return out


@dataclasses.dataclass
class HeadroomReading:
    amp: list[dict[str, Any]]  # per module: the fp16 products' largest |x| and headroom, lowest first
    half: list[dict[str, Any]]  # per module: its outputs' largest |x| and headroom, lowest first
    residual: list[dict[str, Any]]  # per decoder block, in order: the block output's largest |x| and headroom
    block_class: str | None  # the decoder block class the residual stream is read at

    @property
    def amp_min(self) -> float:
        return min((r["headroom_bits"] for r in self.amp), default=math.inf)

    @property
    def half_min(self) -> float:
        return min((r["headroom_bits"] for r in self.half), default=math.inf)


def _row(name: str, amax: float, **extra: Any) -> dict[str, Any]:
    bits = headroom_bits(amax)
    return {"module": name, "amax": amax if math.isfinite(amax) else "inf",
            "headroom_bits": round(bits, 2) if math.isfinite(bits) else bits, **extra}


def read_headroom(model: nn.Module, inputs: dict, block_names: set[str]) -> HeadroomReading:
    """One forward (no grad, eval) with every module's outputs and every fp16 product recorded."""
    outputs: dict[str, float] = {}
    stack: list[str] = []
    amp: dict[str, list] = {}
    handles = []
    blocks: list[str] = []
    block_class = None

    def pre(name):
        def hook(_module, _args):
            stack.append(name)
        return hook

    def post(name):
        def hook(_module, _args, out):
            if stack and stack[-1] == name:
                stack.pop()
            outputs[name] = max(outputs.get(name, 0.0), _amax(out))
        return hook

    for name, module in model.named_modules():
        if not name:
            continue
        handles.append(module.register_forward_pre_hook(pre(name)))
        handles.append(module.register_forward_hook(post(name)))
        if type(module).__name__ in block_names:
            blocks.append(name)
            block_class = type(module).__name__
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _AmpRecorder(stack, amp):
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    amp_rows = sorted((_row(name, peak, op=op) for name, (peak, op) in amp.items()),
                      key=lambda r: r["headroom_bits"])
    half_rows = sorted((_row(name, peak) for name, peak in outputs.items()), key=lambda r: r["headroom_bits"])
    # the residual stream of the decoder: the blocks of the last block class (a VLM's vision blocks come first and
    # are another stream), numbered within that class
    decoder_blocks = [name for name in blocks if type(model.get_submodule(name)).__name__ == block_class]
    residual = [_row(name, outputs.get(name, 0.0), layer=i) for i, name in enumerate(decoder_blocks)
                if name in outputs]
    return HeadroomReading(amp_rows, half_rows, residual, block_class)


def vllm_fp16_refusal(config) -> tuple[str, str] | None:
    """(model_type, vLLM's reason) when vLLM refuses this model's type (or its text model's) in float16."""
    candidates = [getattr(config, "model_type", None)]
    text = getattr(config, "get_text_config", None)
    if callable(text):
        try:
            candidates.append(getattr(text(), "model_type", None))
        except (TypeError, ValueError, AttributeError):
            pass
    for model_type in candidates:
        if model_type in FP16_REFUSED_BY_VLLM:
            return model_type, FP16_REFUSED_BY_VLLM[model_type]
    return None
