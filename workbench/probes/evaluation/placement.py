"""`placement.offload`: where the loaded model's modules actually are, and what that breaks.

`device_map="auto"` fills the GPUs, then the CPU, then the disk, and only warns ("Some parameters are on the meta
device because they were offloaded to the cpu"). A joint recipe was evaluated that way after the previous
recipe's memory was never freed: flash-attention needs every tensor on CUDA, every sample failed, and the table
said 0 % detection. This probe reads `hf_device_map` after loading, names every module on cpu / disk / meta with its
bytes (the memory that would have been needed on the GPU), and fails when the attention implementation cannot run
there. `--device-map auto --max-memory cpu=100KB` reproduces an offload on a CPU-only machine.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from workbench.display.nodes import Cell, Code, Display, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.components import unwrap_model

OFFLOAD_DEVICES = ("cpu", "disk", "meta")


def device_label(device: Any) -> str:
    """hf_device_map values: an int is a CUDA index; strings are cpu / disk / meta / cuda:N / mps."""
    if isinstance(device, int) or (isinstance(device, str) and device.isdigit()):
        return f"cuda:{device}"
    if isinstance(device, torch.device):
        return str(device)
    return str(device)


def module_bytes(module: nn.Module) -> int:
    """Parameter and buffer bytes (meta tensors count by shape and dtype: what loading them would take)."""
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclasses.dataclass(repr=False)
class PlacementResult(ProbeResult):
    model_name: str
    device_map: dict[str, str] | None
    attn_implementation: str | None
    placed: list[dict[str, Any]]  # {module, device, bytes}, every map entry
    meta_parameters: list[str]  # parameters still on meta without a map entry saying so
    cuda_available: bool

    @property
    def offloaded(self) -> list[dict[str, Any]]:
        on_gpu = any(p["device"] not in OFFLOAD_DEVICES for p in self.placed)  # cuda, xpu, npu, mps …
        return [p for p in self.placed if p["device"] in ("disk", "meta") or (p["device"] == "cpu" and on_gpu)]

    def findings(self) -> list[Finding]:
        off = self.offloaded
        offloaded_bytes = sum(p["bytes"] for p in off)
        evidence = {"model": self.model_name, "hf_device_map": self.device_map, "attn_implementation":
                    self.attn_implementation, "offloaded": off[:50], "offloaded_bytes": offloaded_bytes,
                    "meta_parameters": self.meta_parameters[:20], "cuda_available": self.cuda_available}
        fix = ("Free the previous model before loading the next (del model; gc.collect(); torch.cuda.empty_cache(); "
               "torch.cuda.synchronize()), give the GPUs more room (--max-memory), quantize, or load on fewer "
               "recipes at a time; for evaluation prefer device_map={'': 0} so that a model that does not fit fails "
               "loudly instead of offloading.")
        if not off and not self.meta_parameters:
            devices = sorted({p["device"] for p in self.placed}) or ["one device (no device map)"]
            return [Finding("placement.offload", "pass", "Nothing offloaded",
                            f"{self.model_name} is on {', '.join(devices)}; attention: {self.attn_implementation}.",
                            evidence)]
        names = ", ".join(f"{p['module'] or '(whole model)'} → {p['device']}" for p in off[:6])
        if self.meta_parameters and not off:
            names = ", ".join(self.meta_parameters[:6])
        detail = (f"{len(off)} module(s), {offloaded_bytes:,} bytes that did not fit the compute devices' memory, are "
                  f"offloaded: {names}. " if off else f"{len(self.meta_parameters)} parameter(s) on meta: {names}. ")
        if "flash" in (self.attn_implementation or ""):  # flash_attention_2/3, hub kernels (…/flash-attn…)
            return [Finding("placement.offload", "fail",
                            f"{self.attn_implementation} cannot run on offloaded modules",
                            detail + f"{self.attn_implementation} needs every tensor on CUDA: each forward fails "
                            "(0 % detection) or the evaluation silently scores zero.", evidence, fix)]
        return [Finding("placement.offload", "warn", f"{len(off) or len(self.meta_parameters)} module(s) offloaded "
                        f"to {', '.join(sorted({p['device'] for p in off})) or 'meta'}",
                        detail + f"Attention ({self.attn_implementation}) still runs, slowly: offloaded weights are "
                        "moved in for every forward.", evidence, fix)]

    def details(self):
        rows = [[Code(p["module"] or "(whole model)"), p["device"], Cell(f"{p['bytes']:,}", align="right")]
                for p in self.placed[:60]]
        table = (Table(["module", "device", "bytes"], rows) if rows
                 else Paragraph("No device map: the model sits on one device."))
        return Display(table)


def placement_of(model: nn.Module, name: str = "model") -> PlacementResult:
    inner, _ = unwrap_model(model)
    device_map = getattr(inner, "hf_device_map", None) or getattr(model, "hf_device_map", None)
    placed = []
    for module_name, device in (device_map or {}).items():
        try:
            module = inner.get_submodule(module_name) if module_name else inner
            size = module_bytes(module)
        except AttributeError:
            size = 0
        placed.append({"module": module_name, "device": device_label(device), "bytes": size})
    mapped_meta = {p["module"] for p in placed if p["device"] in ("disk", "meta")}
    meta = [n for n, p in inner.named_parameters() if p.device.type == "meta"
            and not any(n.startswith(m + ".") or m == "" for m in mapped_meta)]
    config = getattr(inner, "config", None)
    attn = getattr(config, "_attn_implementation", None) if config is not None else None
    return PlacementResult(name, {k: device_label(v) for k, v in device_map.items()} if device_map else None, attn,
                           placed, meta, torch.cuda.is_available())


def placement_probe(prepared, target=None) -> PlacementResult:
    """Placement of the model the set-up prepared (loaded with the target's --device-map / --max-memory)."""
    name = target.name if target is not None else type(prepared.model).__name__
    return placement_of(prepared.model, name)
