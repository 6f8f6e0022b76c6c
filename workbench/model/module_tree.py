"""Copies of a model's module tree that cost no load: the same tree over meta tensors, or over the very tensors of
the model itself.

    copy_, how = meta_copy(model)          # structure, dtypes, requires_grad; no byte of weights (the FSDP walk)
    with restored(shared):                 # flags and .data casts on the shared tensors reach the shared model
        raw = as_loaded(shared)            # the plain set-up's model as from_pretrained returned it, adapter removed
        get_peft_model(raw, ...)           # injects into the copy's modules; the shared model's stay as they were
        Trainer(model=tree_copy(qlora_model), ...)  # the qlora chain's last step, on a copy

Both copy the modules with `copy.deepcopy` and a memo that maps each parameter and buffer to the tensor the copy
holds instead, so shared tensors stay shared. A wrap applied to a tree copy (PEFT's injection, gradient
checkpointing's flags, an input-grad hook, a Trainer) changes only the copy's module objects; what it does to the
tensors themselves (`requires_grad_`, `param.data = param.data.to(float32)` in peft's k-bit preparation) reaches the
model, which is why the caller holds `guard.restored` around it.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch
from torch import nn

from workbench.model.loading import meta_model


def meta_copy(model: nn.Module) -> tuple[nn.Module, str]:
    """The model's module tree with every parameter and buffer replaced by a meta tensor of the same shape, dtype
    and requires_grad (shared tensors stay shared); no weight is copied."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="meta")
    try:
        return copy.deepcopy(model, memo), "meta-device copy (no weights)"
    except Exception as exc:  # noqa: BLE001 - a module that refuses deepcopy: walk the model itself, read-only
        return model, f"the model itself, read-only (its meta copy failed: {type(exc).__name__}: {str(exc)[:120]})"


def tree_copy(model: nn.Module) -> nn.Module:
    """New module objects (and config, hooks, attributes) holding the model's own parameter and buffer tensors."""
    memo: dict[int, Any] = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


def why_the_chain_loads(target) -> str | None:
    """Why notebook 03's wrapping chain cannot start from the shared model and loads a raw model of its own, or None
    where it can: the plain set-up returns from_pretrained's model (with the adapter loaded for inference on top,
    which PEFT's `unload()` takes off again); the qlora set-up's steps are the chain's own, snapshotted as it runs
    them (`setups.WRAPPING_STEPS`). Every other set-up has already prepared or wrapped the model past the chain
    (older trl's casts, trl's trainer, yours); an explicit device map hangs accelerate's hooks, which hold the
    offloaded weights, on the modules a copy would duplicate."""
    if target.setup not in ("plain", "qlora"):
        return f"the {target.setup} set-up's model is already wrapped"
    if target.device_map:
        return "an explicit device map: accelerate's hooks hold the offloaded weights"
    return None


def as_loaded(model: nn.Module) -> nn.Module:
    """A tree copy of the plain set-up's model as from_pretrained returned it: a PEFT adapter taken off with PEFT's own
    `unload()` (no merge; the base layers put back), and each parameter's requires_grad as the class leaves it
    (PEFT froze the base): read from the class built on the meta device, as from_pretrained builds it. Hold
    `guard.restored(model)` around its use."""
    from peft import PeftModel

    raw = tree_copy(model)
    if not isinstance(raw, PeftModel):
        return raw
    raw = raw.unload()
    if hasattr(raw, "peft_config"):  # left by PEFT's tuner on the base model it injected into
        del raw.peft_config
    loaded = _requires_grad_as_built(raw)
    for name, p in raw.named_parameters():
        # bitsandbytes' packed weights (Params4bit, Int8Params) are created frozen
        p.requires_grad_(type(p) is nn.Parameter and p.is_floating_point() and loaded.get(name, True))
    return raw


def _requires_grad_as_built(model: nn.Module) -> dict[str, bool]:
    """Each parameter's requires_grad in the model's class built from its config on the meta device (the flags its
    __init__ sets: a frozen sinusoidal table stays frozen); empty where the class does not build there."""
    try:
        skeleton, _ = meta_model(model.config)
    except Exception:  # noqa: BLE001 - a class that does not build on meta: every floating parameter trainable
        return {}
    return {name: p.requires_grad for name, p in skeleton.named_parameters()}
