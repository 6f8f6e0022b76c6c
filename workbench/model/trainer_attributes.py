"""What the Trainer and accelerate read off a model, read off it at one step of the wrapping chain (raw model →
k-bit preparation → PEFT → Trainer → your set-up): each attribute's value, and whether the object holds it itself or
only reaches it through `__getattr__` forwarding (PeftModel forwards to its base model). Notebook 03's
`peft.attributes` compares these snapshots; the qlora set-up takes them as it runs its own steps
(`workbench.model.setups.WRAPPING_STEPS`), so the chain need not be walked again on a load of its own.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
from torch import nn

MISSING = "—"
# read by Trainer.__init__ / _wrap_model / validate_quantization_for_training and by accelerate's prepare
TRAINER_READ = ("hf_device_map", "is_loaded_in_4bit", "is_loaded_in_8bit", "quantization_method", "is_quantized",
                "is_parallelizable", "model_parallel")
ATTRIBUTES = TRAINER_READ + ("_hf_peft_config_loaded", "_keep_in_fp32_modules", "is_gradient_checkpointing",
                             "config.use_cache", "dtype", "device")


def _read(obj: Any, path: str) -> tuple[Any, str]:
    """(value, how): how is 'own' (found without __getattr__), 'forwarded' (only via __getattr__) or 'missing'."""
    head, _, rest = path.partition(".")
    try:
        value = getattr(obj, head)
    except Exception:  # noqa: BLE001 - properties may raise on odd models; that is "missing" for us
        return MISSING, "missing"
    try:
        inspect.getattr_static(obj, head)
        how = "own"
    except AttributeError:
        how = "forwarded"
    if rest:
        value, sub = _read(value, rest)
        how = sub if sub == "missing" else how
    return value, how


def _show(value: Any) -> str:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (set, frozenset)):
        return str(sorted(value))
    return str(value)


@dataclasses.dataclass
class AttributeSnapshot:
    step: str
    object_type: str
    values: dict[str, str]
    how: dict[str, str]
    trainable: int
    total: int


def snapshot(step: str, model: nn.Module) -> AttributeSnapshot:
    values, how = {}, {}
    for name in ATTRIBUTES:
        value, where = _read(model, name)
        values[name], how[name] = _show(value), where
    params = list(model.parameters())
    return AttributeSnapshot(step, type(model).__name__, values, how,
                             sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params))
