"""Torch's FSDP wrapping replayed without a process group: which units the Trainer's configuration makes, and which
tensors each unit flattens or groups.

The Trainer hands `TrainingArguments.fsdp_plugin_args` to accelerate's `FullyShardedDataParallelPlugin`:

- **FSDP1** (`fsdp_config["version"] = 1`): accelerate builds the policy (`set_auto_wrap_policy`: the
  `transformer_layer_cls_to_wrap` classes, else the model's `_no_split_modules`; or size-based), except for a
  `PeftModel`, where the Trainer first installs PEFT's `fsdp_auto_wrap_policy` (trainer.py: `update_fsdp_plugin_peft`
  when the optimizer creation is delayed, which FSDP1 does). `FullyShardedDataParallel(model, auto_wrap_policy=...)`
  then runs `torch.distributed.fsdp.wrap._recursive_wrap(only_wrap_children=True)`; with mixed precision, BatchNorm
  modules are wrapped on their own (`_wrap_utils._auto_wrap`). Here the same `_recursive_wrap` runs with a wrapper
  that records each module and returns it unchanged; each unit flattens the parameters its subtree holds that no
  inner unit took (`_init_utils._get_orig_params`), in `module.parameters()` order.
- **FSDP2** (the default, version 2): accelerate's `fsdp2_prepare_model` upcasts trainable parameters to fp32 when
  mixed precision is on and no 4-bit parameter exists, leaves non-floating frozen `Params4bit` out of sharding,
  `fully_shard`s every module its policy (`fsdp2_prepare_auto_wrap_policy`) matches bottom-up, then the input
  embedding (untied), the tail (final norm + output embedding) and the root.

Everything runs on a meta-device copy of the model (`meta_copy`): structure, dtypes and `requires_grad` without a
byte of weights.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any

import torch
from torch import nn

from workbench.model.module_tree import meta_copy


@dataclasses.dataclass
class Unit:
    name: str  # the module path ("" for the root)
    params: list[tuple[str, torch.dtype, bool]]  # (name, dtype as FSDP sees it, requires_grad), in flatten order

    @property
    def numel_note(self) -> str:
        return f"{len(self.params)} tensor(s)"


@dataclasses.dataclass
class FsdpPlan:
    version: int
    policy: str  # how the policy was built, in words
    use_orig_params: bool | None
    units: list[Unit]
    ignored: list[str]  # parameters left out of sharding
    upcast: list[str]  # trainable parameters accelerate upcasts to fp32 before sharding (FSDP2)
    copy_how: str


def _names(root: nn.Module) -> dict[int, str]:
    names: dict[int, str] = {}
    for name, p in root.named_parameters():
        names.setdefault(id(p), name)
    return names


def _module_names(root: nn.Module) -> dict[int, str]:
    return {id(m): name for name, m in root.named_modules()}


def _is_peft(model: nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _plugin_policy(plugin_args: dict[str, Any], model: nn.Module):
    """accelerate's own `set_auto_wrap_policy` on a stand-in for the plugin (the real plugin needs a GPU)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    kind = str(plugin_args.get("auto_wrap_policy", "NO_WRAP")).upper()
    names = plugin_args.get("transformer_cls_names_to_wrap")
    stand_in = types.SimpleNamespace(
        auto_wrap_policy={"TRANSFORMER_BASED_WRAP": transformer_auto_wrap_policy,
                          "SIZE_BASED_WRAP": size_based_auto_wrap_policy}.get(kind),
        transformer_cls_names_to_wrap=names.split(",") if isinstance(names, str) else names,
        min_num_params=int(plugin_args.get("min_num_params", 0) or 0))
    if stand_in.auto_wrap_policy is not None:
        FullyShardedDataParallelPlugin.set_auto_wrap_policy(stand_in, model)
    return stand_in, kind


def _flatten_order(units_modules: list[nn.Module], root: nn.Module, ignored: set) -> list[Unit]:
    names, modules = _names(root), _module_names(root)
    taken: set[int] = set()
    units = []
    for module in units_modules:
        params = []
        for p in module.parameters():
            if id(p) in taken or id(p) in ignored:
                continue
            taken.add(id(p))
            params.append((names.get(id(p), "?"), p.dtype, p.requires_grad))
        if params:
            units.append(Unit(modules.get(id(module), "?"), params))
    return units


def fsdp1_plan(model: nn.Module, plugin_args: dict[str, Any], mixed_precision: bool) -> FsdpPlan:
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import _or_policy, _recursive_wrap, _wrap_module_cls_individually

    copy_, copy_how = meta_copy(model)
    if _is_peft(copy_):
        from peft.utils.other import fsdp_auto_wrap_policy

        policy, how = fsdp_auto_wrap_policy(copy_), ("PEFT's fsdp_auto_wrap_policy (the Trainer installs it for a "
                                                     "PeftModel): trainable leaf modules + _no_split_modules")
    else:
        stand_in, kind = _plugin_policy(plugin_args, copy_)
        policy = stand_in.auto_wrap_policy
        how = (f"{kind}: " + (", ".join(stand_in.transformer_cls_names_to_wrap or []) if kind ==
                              "TRANSFORMER_BASED_WRAP" else f"min_num_params={stand_in.min_num_params}"))
    wrapped: list[nn.Module] = []

    def record(module: nn.Module, **_kwargs: Any) -> nn.Module:
        wrapped.append(module)
        return module

    if policy is not None:
        if mixed_precision:  # FSDP1 wraps the classes mixed precision leaves in fp32 on their own
            policy = functools.partial(_or_policy, policies=[policy, functools.partial(
                _wrap_module_cls_individually, module_classes=MixedPrecision()._module_classes_to_ignore)])
        _recursive_wrap(module=copy_, auto_wrap_policy=policy, wrapper_cls=record, ignored_modules=set(),
                        ignored_params=set(), only_wrap_children=True)
    use_orig = bool(plugin_args.get("use_orig_params", True))
    return FsdpPlan(1, how, use_orig, _flatten_order([*wrapped, copy_], copy_, set()), [], [], copy_how)


def fsdp2_plan(model: nn.Module, plugin_args: dict[str, Any], mixed_precision: bool) -> FsdpPlan:
    from accelerate.utils.fsdp_utils import _find_final_norm, fsdp2_prepare_auto_wrap_policy
    from accelerate.utils.other import get_module_children_bottom_up

    copy_, copy_how = meta_copy(model)
    stand_in, kind = _plugin_policy(plugin_args, copy_)
    policy = fsdp2_prepare_auto_wrap_policy(stand_in, copy_)
    names = _names(copy_)
    has_4bit = any(type(p).__name__ == "Params4bit" for p in model.parameters())
    # meta copies are plain Parameters: read Params4bit-ness from the model, by position
    originals = list(model.parameters())
    ignored = {id(c) for c, o in zip(copy_.parameters(), originals)
               if type(o).__name__ == "Params4bit" and not o.requires_grad and not o.is_floating_point()}
    upcast = []
    if mixed_precision and not has_4bit:
        for name, p in copy_.named_parameters():
            if p.requires_grad and p.dtype != torch.float32:
                upcast.append(name)
                p.data = torch.empty(p.shape, dtype=torch.float32, device="meta")
    groups: list[list[nn.Module]] = []
    sharded: set[int] = set()
    if policy is not None:
        for module in get_module_children_bottom_up(copy_)[:-1]:
            if policy(module) and id(module) not in sharded:
                groups.append([module])
                sharded.add(id(module))
    embed = copy_.get_input_embeddings() if hasattr(copy_, "get_input_embeddings") else None
    head = copy_.get_output_embeddings() if hasattr(copy_, "get_output_embeddings") else None
    tied = embed is not None and getattr(embed, "weight", None) is not None and \
        getattr(embed, "weight", None) is getattr(head, "weight", 0)
    if not tied and embed is not None and id(embed) not in sharded:
        groups.append([embed])
        sharded.add(id(embed))
    tail = [m for m in ((_find_final_norm(copy_), embed, head) if tied else (_find_final_norm(copy_), head))
            if m is not None and id(m) not in sharded]
    if tail:
        groups.append(tail)
        sharded.update(id(m) for m in tail)
    groups.append([copy_])
    modules = _module_names(copy_)
    taken: set[int] = set()
    units = []
    for group in groups:
        params = []
        for root in group:
            for sub in _managed(root, sharded - {id(root)}):
                for p in sub.parameters(recurse=False):
                    if id(p) in taken or id(p) in ignored:
                        continue
                    taken.add(id(p))
                    params.append((names.get(id(p), "?"), p.dtype, p.requires_grad))
        if params:
            units.append(Unit(" + ".join(modules.get(id(m), "?") for m in group), params))
    how = f"{kind}: " + (", ".join(stand_in.transformer_cls_names_to_wrap or [])
                         if kind == "TRANSFORMER_BASED_WRAP" else f"min_num_params={stand_in.min_num_params}")
    if _is_peft(model):
        how += " (FSDP2: the Trainer does not install PEFT's policy)"
    return FsdpPlan(2, how, None, units, [names.get(i, "?") for i in ignored], upcast, copy_how)


def _managed(root: nn.Module, sharded: set[int]) -> list[nn.Module]:
    """torch's `_get_managed_modules`: the subtree, not entering modules that have their own fully_shard."""
    out: list[nn.Module] = []
    seen: set[int] = set()

    def dfs(module: nn.Module) -> None:
        if id(module) in sharded:
            return
        seen.add(id(module))
        for child in module.children():
            if id(child) not in seen:
                dfs(child)
        out.append(module)

    dfs(root)
    return out
