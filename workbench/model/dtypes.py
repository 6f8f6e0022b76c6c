"""What dtype a model computes in, which tensors it keeps in another dtype on purpose, and one enumeration of the
floating tensors off the compute dtype (the fp32 islands, FSDP's mixed-precision buffers and units all start there).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Callable, Iterator

import torch
from torch import nn

from workbench.model.components import unwrap_model


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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


def dtype_plan_matcher(model: nn.Module, dtype: torch.dtype) -> Callable[[str], torch.dtype | None]:
    """The dtype the model's own dtype plan forces on a checkpoint tensor, or None where it says nothing.

    transformers 5.23 asks `model._get_dtype_plan(dtype)` (modeling_utils.py): `_keep_in_fp32_modules` only when
    loading in fp16 (transformers#20287), `_keep_in_fp32_modules_strict` in fp16 and bf16; and matches its globs
    with an unanchored search of `build_glob_alternation` (core_model_loading.py,
    `convert_and_load_state_dict_in_model`): T5's "wo" and Afmoe's "norm" stay in bf16 in a bf16 load.
    """
    plan_of = getattr(model, "_get_dtype_plan", None)
    plan = plan_of(dtype) if callable(plan_of) else {}
    if not plan:
        return lambda name: None
    from transformers.core_model_loading import build_glob_alternation

    alternation, group_to_glob, _ = build_glob_alternation(list(plan))

    def planned(name: str) -> torch.dtype | None:
        match = alternation.search(name)
        return plan[group_to_glob[match.lastgroup]] if match is not None else None
    return planned


def keep_in_fp32_matcher(model: nn.Module) -> Callable[[str], bool]:
    """A predicate for parameter names that from_pretrained keeps in fp32 (`_keep_in_fp32_modules[_strict]`)."""
    names = set(getattr(model, "_keep_in_fp32_modules", None) or ()) | set(
        getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if not names:
        return lambda name: False
    pattern = re.compile(r"(^|\.)(" + "|".join(re.escape(n) for n in sorted(names)) + r")(\.|$)")
    return lambda name: bool(pattern.search(name))


def is_rotary_module(module: nn.Module) -> bool:
    """A rotary position embedding: transformers' `*RotaryEmbedding` classes all set `rope_type` (a str, or a dict
    per layer type for Gemma 3); remote-code ones keep the class name."""
    return hasattr(module, "rope_type") or type(module).__name__.endswith("RotaryEmbedding")


def is_rotary_buffer(module: nn.Module, short: str) -> bool:
    """A buffer recomputed from the config by a rotary module (non-persistent: never saved), fp32 on purpose."""
    return is_rotary_module(module) and short in getattr(module, "_non_persistent_buffers_set", ())


@dataclasses.dataclass(frozen=True)
class OffDtypeTensor:
    """A floating parameter or buffer whose dtype is not the compute dtype, with the module that holds it."""

    module_name: str
    module: nn.Module
    short: str  # its name inside the module
    kind: str  # parameter | buffer
    tensor: torch.Tensor
    module_frozen: bool  # nothing in the module's subtree is trainable

    @property
    def name(self) -> str:
        return f"{self.module_name}.{self.short}" if self.module_name else self.short

    @property
    def rotary(self) -> bool:
        return self.kind == "buffer" and is_rotary_buffer(self.module, self.short)


def off_compute_dtype(model: nn.Module, compute: torch.dtype,
                      kinds: tuple[str, ...] = ("parameter", "buffer")) -> Iterator[OffDtypeTensor]:
    """Each floating tensor off `compute`, once (a tied parameter is one tensor), module by module, parameters
    before buffers within a module."""
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        tensors = ([("parameter", n, t) for n, t in module.named_parameters(recurse=False)] if "parameter" in kinds
                   else []) + ([("buffer", n, t) for n, t in module.named_buffers(recurse=False)]
                               if "buffer" in kinds else [])
        frozen = None
        for kind, short, tensor in tensors:
            if not tensor.dtype.is_floating_point or tensor.dtype == compute or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            if frozen is None:
                frozen = not any(p.requires_grad for p in module.parameters())
            yield OffDtypeTensor(module_name, module, short, kind, tensor, frozen)
