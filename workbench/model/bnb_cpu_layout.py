"""bitsandbytes' CPU inference layout for 4-bit weights, and keeping the models we diagnose out of it.

`Linear4bit.forward` (bitsandbytes/nn/modules.py, 0.50) repacks its 4-bit weight for the AVX-512 bf16 CPU
inference kernel the first time the layer runs in eval mode on a CPU input that does not require grad, when the
layer's `support_avx512bf16_for_cpu` (set from `has_avx512bf16()` when the layer is built) is true. From then on
`matmul_4bit` calls `gemv_4bit`, which has no autograd kernel: a training forward after such an eval forward sends
no gradient to its input, so every LoRA before that layer learns nothing (at `in_features` 32 the repack itself
raises "shape '[32, 0]' is invalid"). The inverse is bitsandbytes' `_convert_weight_packed_for_cpu_inverse`, which
its own `Linear4bit._save_to_state_dict` calls.

A diagnosis runs eval forwards before training steps on one shared model, so every model we load or prepare keeps
the training layout (`keep_training_layout`): forwards then run the kernels a training step uses, on any CPU.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

REPACK_FLAG = "support_avx512bf16_for_cpu"  # the attribute Linear4bit.forward reads before repacking
HELD_MARK = "workbench_held_training_layout"  # set on the layers keep_training_layout stopped from repacking


def _packed_layers(model: "nn.Module") -> list[tuple[str, "nn.Module"]]:
    """bitsandbytes' own layers (they carry the flag; PEFT's LoRA wrapper only forwards `.weight` to its
    base_layer) whose weight is in the CPU inference layout."""
    out = []
    for name, module in model.named_modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if hasattr(module, REPACK_FLAG) and getattr(state, "packing_format_for_cpu", False):
            out.append((name, module))
    return out


def packed_for_cpu_inference(model: "nn.Module") -> list[str]:
    """Names of the 4-bit layers whose weight is in bitsandbytes' CPU inference layout (no gradient flows)."""
    return [name for name, _ in _packed_layers(model)]


def unpack_cpu_inference(model: "nn.Module") -> int:
    """Put every packed 4-bit weight back in the training layout, with bitsandbytes' own inverse; returns how many."""
    packed = [module for _, module in _packed_layers(model)]
    if packed:
        from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

        for module in packed:
            module.weight.data, module.weight.quant_state = _convert_weight_packed_for_cpu_inverse(
                module.weight.data, module.weight.quant_state)
    return len(packed)


def keep_training_layout(model: "nn.Module") -> int:
    """Unpack what is packed and stop every 4-bit layer from repacking on later eval forwards; returns how many
    layers are held so (0 on a CPU without AVX-512 bf16, where bitsandbytes never repacks). Idempotent."""
    unpack_cpu_inference(model)
    for module in model.modules():
        if getattr(module, REPACK_FLAG, False):
            setattr(module, REPACK_FLAG, False)
            setattr(module, HELD_MARK, True)
    return sum(1 for module in model.modules() if getattr(module, HELD_MARK, False))


def held_layout_note(model: "nn.Module") -> str | None:
    """What the evidence of a finding that ran 4-bit forwards says when `keep_training_layout` held layers back that
    would have repacked: only layers on the CPU (bitsandbytes repacks for CPU inputs alone)."""
    held = sum(1 for module in model.modules() if getattr(module, HELD_MARK, False)
               and getattr(getattr(module, "weight", None), "device", None) is not None
               and module.weight.device.type == "cpu")
    if not held:
        return None
    return (f"bitsandbytes {bitsandbytes_version()} repacks a 4-bit weight for its AVX-512 bf16 CPU inference kernel "
            f"on an eval forward without grad (Linear4bit.forward); this diagnosis kept the {held} Linear4bit layers "
            f"in the training layout ({REPACK_FLAG}=False), so every forward ran the kernels a training step uses")


def bitsandbytes_version() -> str:
    try:
        return metadata.version("bitsandbytes")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def packed_training_fix(names: list[str]) -> str:
    """The fix for a model handed to training with weights in the inference layout, from the model's own names."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"Right after loading, before any evaluation (a Trainer's evaluate() runs eval forwards under no_grad), "
            f"set `{REPACK_FLAG} = False` on every module of the model that has it (bitsandbytes' Linear4bit layers). "
            f"Weights already packed ({shown}): do that, then call `model.state_dict()` once — bitsandbytes' "
            f"`Linear4bit._save_to_state_dict` puts a packed weight back in the training layout.")
