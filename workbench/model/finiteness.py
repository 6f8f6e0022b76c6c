"""The largest |x| of a tensor, and whether it holds only finite values, asked of logits, saved adapters, checkpoints'
tensors and the activations train.fp16 reads."""

from __future__ import annotations

import math

import torch


def largest_magnitude(tensor: torch.Tensor) -> float:
    """max |x|, read from one min/max reduction without the |x| copy `abs().max()` makes (a 256k-vocab logits tensor:
    0.01 s against 0.14 s for `isfinite`): NaN when any element is NaN (it propagates into both), inf when any is
    infinite, 0.0 for an empty tensor."""
    if tensor.numel() == 0:
        return 0.0
    try:
        low, high = torch.aminmax(tensor.detach())
    except (RuntimeError, NotImplementedError):  # a dtype aminmax does not cover on this device (float8 on CPU)
        return float(tensor.detach().float().abs().max())
    low, high = float(low), float(high)
    return math.nan if math.isnan(low) or math.isnan(high) else max(-low, high)


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every element is finite (exact: NaN and infinities reach `largest_magnitude`)."""
    return math.isfinite(largest_magnitude(tensor))
