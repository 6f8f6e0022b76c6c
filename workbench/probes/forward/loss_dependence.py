"""Does this batch's loss depend on a tensor at all? Asked by perturbing it, for gradients that came back zero.

A zero gradient is the truth when the loss does not move with the tensor: its contribution is multiplied by an
exact zero (a zero-initialized gate or scale, as `lora_B` is for `lora_A`), masked, or overwritten before the loss
(Longformer's last layer: the classification token takes its global-attention output, not the local one). It is
also the truth when the loss moves only because the shift flips a discrete choice (which expert a router picks,
what a threshold masks) and stays bit-identical under a smaller shift that flips none: the loss is flat between
choices. It is a break when the loss moves without a choice flipping, but the gradient says it does not (a custom
backward that drops it). The forwards here run in the step's own mode and autocast under one fixed random seed
(dropout and sampling draw the same values), without grad; each tensor is put back bit for bit afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from workbench.model.memory import room_for_a_copy
from workbench.probes.forward.loss_reach import caller_site

RELATIVE_STEP = 1e-2  # well above bf16's resolution (2**-8), small enough to stay local
SMALLER_STEPS = (1e-3, 1e-4)  # tried when a shift flips a discrete choice, to see the loss between choices
MIN_CHANGED = 0.5  # a smaller shift counts only when it changes at least this share of the elements (bf16 rounds)
_SEED = 20260101


@dataclasses.dataclass(frozen=True)
class LossResponse:
    """How the loss answers a shift: `moves`, and where a shift flipped a discrete choice when the loss moved only
    across choices (`moves` is then False: flat between them)."""

    moves: bool
    flipped_at: str | None = None  # file:line in function of the first choice a shift flipped


class _DiscreteChoices(TorchFunctionMode):
    """Fingerprints of every integer or boolean tensor a forward computes (indices, masks, comparisons, with their
    data-dependent sizes). Given those of an earlier forward, records where this one first computes a different one."""

    def __init__(self, earlier: list[Any] | None = None):
        super().__init__()
        self.earlier = earlier
        self.fingerprints: list[Any] = []
        self.flipped_at: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _is_uninitialized(func):
            return out
        for value in tree_flatten(out)[0]:
            fingerprint = _fingerprint(value)
            if fingerprint is None:
                continue
            index = len(self.fingerprints)
            self.fingerprints.append(fingerprint)
            if (self.earlier is not None and self.flipped_at is None
                    and (index >= len(self.earlier) or self.earlier[index] != fingerprint)):
                self.flipped_at = caller_site().where
        return out

    def flip(self) -> str | None:
        """Where this forward first computed a choice different from the earlier forward's, None if it computed
        the same ones."""
        if self.flipped_at is None and self.earlier is not None and len(self.fingerprints) != len(self.earlier):
            return "the end of the forward (a different number of integer or boolean values)"
        return self.flipped_at


def _is_uninitialized(func: Any) -> bool:
    """`torch.empty_like(perm)` and kin: memory handed out unwritten, whose values differ from run to run."""
    name = getattr(func, "__name__", "")
    return name in ("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided")


def _fingerprint(value: Any) -> Any:
    """(shape, dtype, hash of the values) of an integer or boolean tensor. Python scalars are left out: those that
    carry data come from a tensor fingerprinted already, and the rest (`data_ptr()`, `_version`) vary between runs."""
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.is_complex():
        return None
    try:
        data = value.detach().contiguous().cpu().numpy()
    except (RuntimeError, TypeError):  # meta, sparse or quantized values: not a choice this check can compare
        return None
    return tuple(value.shape), str(value.dtype), hash(data.tobytes())


def _loss(model: nn.Module, inputs: dict, loss_of: Callable, autocast: contextlib.AbstractContextManager) -> float:
    with torch.random.fork_rng(devices=[]), torch.no_grad(), autocast:
        torch.manual_seed(_SEED)
        return float(loss_of(model(**inputs)).detach().float())


@contextlib.contextmanager
def shifted(params: Sequence[nn.Parameter], floor: float = 0.0, step: float = RELATIVE_STEP):
    """Each tensor moved by a seeded random step of `step` times its mean magnitude (at least `floor`, and at least
    `step / 10` absolute). Yields the share of elements that changed (the rest round back in low precision).
    ResourceError where the copy kept to put them back would take more than half the free memory: only a model
    whose gradients are almost all zero gets here with most of its weights (a detached loss, a checkpoint of zeros),
    and at 7B that copy is a second 16 GB, with the shifted weights written in place (a mapped checkpoint's pages
    copied on write) on top."""
    room_for_a_copy(params, f"shifting {len(params)} tensors keeps a copy of them to put back, which")
    saved = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(_SEED)
    try:
        with torch.no_grad():
            for p in params:
                scale = max(float(p.detach().float().abs().mean()) * step, floor, step / 10)
                noise = torch.randn(p.shape, generator=generator, dtype=torch.float32) * scale
                p.add_(noise.to(device=p.device, dtype=p.dtype))
            total = sum(p.numel() for p in params)
            changed = sum(int((p.detach() != value).sum()) for p, value in zip(params, saved))
        yield changed / total if total else 0.0
    finally:
        with torch.no_grad():
            for p, value in zip(params, saved):
                p.copy_(value)


def loss_moves_with(model: nn.Module, inputs: dict, loss_of: Callable,
                    autocast: Callable[[], contextlib.AbstractContextManager],
                    params: Sequence[nn.Parameter]) -> bool:
    """True when shifting `params` together changes this batch's loss."""
    before = _loss(model, inputs, loss_of, autocast())
    with shifted(params):
        after = _loss(model, inputs, loss_of, autocast())
    return after != before


def loss_response(model: nn.Module, inputs: dict, loss_of: Callable,
                  autocast: Callable[[], contextlib.AbstractContextManager],
                  params: Sequence[nn.Parameter]) -> LossResponse:
    """Whether this batch's loss moves with `params` shifted together, told apart from a loss that moves only
    because the shift flips a discrete choice: then smaller shifts are tried, and one that flips no choice and
    leaves the loss bit-identical shows the loss flat between choices. A loss that moves without a flip, or under
    every shift tried, moves."""
    with _DiscreteChoices() as unshifted:
        before = _loss(model, inputs, loss_of, autocast())
    flipped_at = None
    for step in (RELATIVE_STEP, *SMALLER_STEPS):
        with shifted(params, step=step) as changed:
            if step != RELATIVE_STEP and changed < MIN_CHANGED:
                break
            with _DiscreteChoices(unshifted.fingerprints) as choices:
                after = _loss(model, inputs, loss_of, autocast())
        if after == before:
            return LossResponse(False, flipped_at)
        if choices.flip() is None:
            return LossResponse(True)
        flipped_at = flipped_at or choices.flip()
    return LossResponse(True)


def zero_factors_blocking(model: nn.Module, inputs: dict, loss_of: Callable,
                          autocast: Callable[[], contextlib.AbstractContextManager],
                          params: Sequence[nn.Parameter], zeros: Sequence[nn.Parameter]) -> bool:
    """True when, with the all-zero trainable tensors `zeros` made nonzero, the loss moves with `params`: the exact
    zeros of this checkpoint are what keeps the gradient of `params` at zero."""
    if not zeros:
        return False
    with shifted(zeros, floor=RELATIVE_STEP):
        return loss_moves_with(model, inputs, loss_of, autocast, params)
