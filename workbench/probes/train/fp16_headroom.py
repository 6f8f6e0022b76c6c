"""How far a model's activations sit below fp16's largest finite value (65504), from one recorded forward
(`workbench.model.activation_peaks`; which forward, `workbench.probes.train.fp16` decides).

Two views of the same forward:

- **AMP** (`fp16=True` with fp32 weights): autocast runs the matrix products in fp16 and leaves the rest in fp32, so
  what must fit is the inputs and outputs of those products: `F.linear`, `matmul`/`@`, `bmm`, `baddbmm`, `mm`,
  `addmm`, `einsum`, the convolutions and `scaled_dot_product_attention` (torch's CUDA autocast fp16 op list),
  attributed to the innermost module that called them.
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

from workbench.model.activation_peaks import ActivationPeaks, recorded_peaks

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

def headroom_bits(amax: float) -> float:
    """log2(65504 / amax): bits left before fp16 overflows; inf for an all-zero tensor, -inf for inf/NaN."""
    if amax == 0:
        return math.inf
    if not math.isfinite(amax):
        return -math.inf
    return math.log2(FP16_MAX / amax)


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
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), recorded_peaks(model) as peaks:
            model(**inputs)
    finally:
        model.train(was_training)
    return headroom_of(model, peaks, block_names)


def headroom_of(model: nn.Module, peaks: ActivationPeaks, block_names: set[str]) -> HeadroomReading:
    """The reading of a recorded forward of `model` (`workbench.model.activation_peaks`)."""
    amp_rows = sorted((_row(name, peak, op=op) for name, (peak, op) in peaks.products.items()),
                      key=lambda r: r["headroom_bits"])
    half_rows = sorted((_row(name, peak) for name, peak in peaks.outputs.items()), key=lambda r: r["headroom_bits"])
    blocks = [(name, type(module).__name__) for name, module in model.named_modules()
              if name and type(module).__name__ in block_names]
    # the residual stream of the decoder: the blocks of the last block class (a VLM's vision blocks come first and
    # are another stream), numbered within that class
    block_class = blocks[-1][1] if blocks else None
    decoder_blocks = [name for name, cls in blocks if cls == block_class]
    residual = [_row(name, peaks.outputs.get(name, 0.0), layer=i) for i, name in enumerate(decoder_blocks)
                if name in peaks.outputs]
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
