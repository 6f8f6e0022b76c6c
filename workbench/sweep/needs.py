"""What one member asks a scheduler for (Ray's resources): CPUs, a GPU, memory.

Memory comes from the checkpoint's size as its safetensors headers state it (the member's own weights, and an
adapter's local base), read without loading a tensor: a diagnosis holds one copy of the model at a time (the
runner's rule), so a member needs that copy, half again for loading and the probes' activations, and the kernel's
own imports. A GPU is asked for when the cluster has GPUs and the set-up loads on CUDA (no `--device-map cpu`): one
whole GPU per member, so that two members never share one (Ray places a `num_gpus=1` task alone on its GPU).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from workbench.model.lora import read_json

KERNEL_BYTES = 3 * 1024**3 // 2  # a kernel with torch, transformers and peft imported, and the task's own process
LOAD_FACTOR = 1.5  # one copy of the weights, half again while loading and for the probes' activations


@dataclasses.dataclass(frozen=True)
class MemberNeeds:
    cpus: float
    gpus: int
    memory_bytes: int
    stored_bytes: int  # the weights as the headers state them

    def as_ray_options(self) -> dict:
        return {"num_cpus": self.cpus, "num_gpus": self.gpus, "memory": self.memory_bytes}


def stored_bytes(folder: Path) -> int:
    """Bytes of weights the member loads: its own safetensors, and its adapter's base when that is a local folder."""
    from workbench.model.checkpoint import inspect_checkpoint

    folders = [folder]
    adapter = read_json(folder / "adapter_config.json")
    base = Path(str((adapter or {}).get("base_model_name_or_path") or ""))
    base = base if base.is_absolute() else folder / base
    if adapter is not None and base.is_dir() and base != folder:
        folders.append(base)
    total = 0
    for f in folders:
        try:
            total += inspect_checkpoint(f).weight_bytes
        except Exception:  # noqa: BLE001 - unreadable headers: the member's own diagnosis reports them
            continue
    return total


def member_needs(folder: Path, *, cluster_gpus: float, device_map: str | None) -> MemberNeeds:
    stored = stored_bytes(folder)
    gpus = 1 if cluster_gpus >= 1 and (device_map or "").lower() != "cpu" else 0
    return MemberNeeds(1.0, gpus, int(KERNEL_BYTES + LOAD_FACTOR * stored), stored)
