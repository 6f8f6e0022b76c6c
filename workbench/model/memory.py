"""Refuse, before loading, a model that cannot fit: the numbers come from the safetensors headers (and, for 4-bit
and 8-bit, the meta-device prediction), not from the OOM killer."""

from __future__ import annotations

import torch

from workbench.environment import host_available_bytes  # callers import and tests patch it here
from workbench.model.checkpoint import inspect_checkpoint
from workbench.model.loading import auto_config
from workbench.model.quantized_prediction import predicted_load_bytes


def free_memory() -> None:
    """Collect garbage and give cached CUDA memory back (what an evaluation loop over several models needs before each load)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class ResourceError(RuntimeError):
    """The load would not fit; the message carries both numbers."""


def available_bytes() -> tuple[int, str]:
    """Free memory where the weights will land: the GPUs' free memory, else the machine's MemAvailable."""
    if torch.cuda.is_available():
        free = sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
        return free, f"free memory on {torch.cuda.device_count()} GPU(s)"
    return host_available_bytes()


def free_on(device: torch.device) -> tuple[int, str] | None:
    """Free memory on one device: a GPU's own free memory, the machine's for the CPU; None where it cannot be read
    (meta, another backend)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], f"free memory of {device}"
    if device.type == "cpu":
        return host_available_bytes()
    return None


def room_for_a_copy(tensors, what: str, element_size: int | None = None) -> None:
    """Raise ResourceError when a copy of `tensors` a probe is about to make (`what`; at `element_size` bytes an
    element, else their own) would take more than half the free memory of the device it lands on: the probe then
    says so, where the copy would have run the machine out of memory."""
    need: dict[torch.device, int] = {}
    for t in tensors:
        need[t.device] = need.get(t.device, 0) + t.numel() * (element_size or t.element_size())
    for device, bytes_needed in need.items():
        free = free_on(device)
        if free is not None and bytes_needed > free[0] // 2:
            raise ResourceError(f"{what} needs {bytes_needed / 2**30:.1f} GiB: more than half the {free[1]} "
                                f"({free[0] / 2**30:.1f} GiB)")


def estimated_load_bytes(target) -> int:
    """Bytes the loaded weights will take: quantized per the meta prediction, else as stored in the headers."""
    folders = [target.model_dir] + ([target.adapter_dir] if target.adapter_dir else [])
    stored = sum(inspect_checkpoint(f).weight_bytes for f in folders)
    if target.quant in ("4bit", "8bit"):
        config = auto_config(target.model_dir, trust_remote_code=target.trust_remote_code)
        return predicted_load_bytes(config, target.quant) + (stored - inspect_checkpoint(target.model_dir).weight_bytes)
    return stored


def two_copies_fit_easily(target) -> bool:
    """Whether two copies of the model sit comfortably in memory: below a quarter of what is free, and small (under
    2 GB). The rule for running notebooks side by side and for keeping the shared model while a probe loads its own
    copy; when unsure, no."""
    try:
        need = estimated_load_bytes(target)
        have, _ = available_bytes()
    except Exception:  # noqa: BLE001 - when unsure, one copy at a time
        return False
    return 2 * need < 0.25 * have and need < 2 * 1024**3


def check_fits(target) -> None:
    """Raise ResourceError when the weights would not fit (90 % of what is available, or params' memory_limit)."""
    need = estimated_load_bytes(target)
    limit = target.params.get("memory_limit_bytes")
    have, where = (int(limit), "memory_limit_bytes in the parameters") if limit else available_bytes()
    if need > 0.9 * have:
        raise ResourceError(
            f"loading needs about {need / 1e9:.2f} GB of weights ({target.quant}) but {where} is "
            f"{have / 1e9:.2f} GB; not loaded. Use --quant 4bit, a machine with more memory, or a device map "
            "that offloads (--device-map auto --max-memory ...)")
