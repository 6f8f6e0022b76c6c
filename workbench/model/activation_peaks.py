"""The largest |x| one forward produces: per module output, and per product that fp16 autocast would run in half.

    with recorded_peaks(model) as peaks:
        model(**inputs)
    peaks.outputs       # module path -> largest |x| over its floating outputs (NaN counts as inf)
    peaks.products      # module path -> [largest |x| over the inputs and outputs of its fp16 products, the op]
    peaks.complete      # False when recording itself failed somewhere: the peaks are partial, read none of them

Any forward can carry it: notebook 09's fp16 headroom reads it from its own fp32 forward, and the batch check
(`workbench.model.batch`) records it on the forward that accepts the batch, so that a diagnosis whose training is
not fp16 reads the headroom without a forward of its own. Recording never changes the forward: the function mode
calls each function first and records after, and a recording that raises marks the peaks incomplete instead of
raising into the model.

`AMP_FP16_FUNCTIONS` are the products autocast runs in fp16 (torch's CUDA autocast fp16 op list): `F.linear`,
`matmul`/`@`, `bmm`, `baddbmm`, `mm`, `addmm`, `einsum`, the convolutions and `scaled_dot_product_attention`. A
product's weight is among its inputs: autocast casts it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from workbench.model.finiteness import largest_magnitude

_F = torch.nn.functional
AMP_FP16_FUNCTIONS = frozenset({
    _F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.bmm,
    torch.Tensor.bmm, torch.baddbmm, torch.Tensor.baddbmm, torch.mm, torch.Tensor.mm, torch.addmm, torch.Tensor.addmm,
    torch.einsum, _F.conv1d, _F.conv2d, _F.conv3d, _F.scaled_dot_product_attention,
})


def largest_abs(value: Any) -> float:
    """The largest |x| over the floating tensors in a (nested) output; NaN counts as overflow (inf)."""
    if torch.is_tensor(value):
        if not value.is_floating_point() or value.numel() == 0 or value.device.type == "meta":
            return 0.0
        peak = largest_magnitude(value)  # one min/max reduction, no |x| copy of every weight a product reads
        return math.inf if math.isnan(peak) else float(peak)
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return max((largest_abs(v) for v in value), default=0.0)
    return 0.0


@dataclasses.dataclass
class ActivationPeaks:
    outputs: dict[str, float] = dataclasses.field(default_factory=dict)
    products: dict[str, list] = dataclasses.field(default_factory=dict)  # path -> [largest |x|, op name]
    complete: bool = True


class _ProductRecorder(TorchFunctionMode):
    """Records the largest |input| and |output| of each fp16-autocast product, per innermost module."""

    def __init__(self, stack: list[str], peaks: ActivationPeaks) -> None:
        super().__init__()
        self.stack, self.peaks = stack, peaks

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in AMP_FP16_FUNCTIONS and self.peaks.complete:
            try:
                where = self.stack[-1] if self.stack else "(model)"
                name = getattr(func, "__name__", str(func))
                peak = self.peaks.products.setdefault(where, [0.0, name])
                value = max(largest_abs(list(args)), largest_abs(out))
                if value > peak[0]:
                    peak[0], peak[1] = value, name
            except Exception:  # noqa: BLE001 - a recording that cannot read a value leaves the forward alone
                self.peaks.complete = False
        return out


@contextlib.contextmanager
def recorded_peaks(model: nn.Module) -> Iterator[ActivationPeaks]:
    """Record the forwards run inside the block (module docstring); hooks and mode removed on exit."""
    peaks = ActivationPeaks()
    stack: list[str] = []

    def pre(name):
        def hook(_module, _args):
            stack.append(name)
        return hook

    def post(name):
        def hook(_module, _args, out):
            if stack and stack[-1] == name:
                stack.pop()
            if peaks.complete:
                try:
                    peaks.outputs[name] = max(peaks.outputs.get(name, 0.0), largest_abs(out))
                except Exception:  # noqa: BLE001 - see _ProductRecorder
                    peaks.complete = False
        return hook

    handles = []
    try:
        for name, module in model.named_modules():
            if name:
                handles.append(module.register_forward_pre_hook(pre(name)))
                handles.append(module.register_forward_hook(post(name)))
        with _ProductRecorder(stack, peaks):
            yield peaks
    finally:
        for handle in handles:
            handle.remove()
