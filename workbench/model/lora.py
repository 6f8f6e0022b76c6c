"""LoRA as saved: an adapter's tensor names, PEFT's scaling, the update ‖B·A‖ computed from two r×r products, the
shapes its tensors need in the base. Read by the saved-files checks (00), the run's checkpoints (08) and the serving
rules (10): one home, so no probe area imports another's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from workbench.model.checkpoint import CheckpointInspection

A_PARTS = ("lora_A", "lora_embedding_A")
STILL_SHARE = 0.25  # never-moved modules from this share of the adapter up: warn (adapter.weights, run.adapter_progress)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object, or None when the file is absent or not one (checkpoint.integrity reports broken JSON)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def adapter_module(key: str) -> tuple[str, str] | None:
    """A PEFT adapter tensor name -> (module path in the base, the part: lora_A / lora_B / the saved tensor's name)."""
    path = key.removeprefix("base_model.model.")
    for part in (".lora_A.", ".lora_B.", ".lora_embedding_A", ".lora_embedding_B", ".lora_magnitude_vector"):
        if part in path:
            module, _, _ = path.partition(part)
            return module, part.strip(".")
    return None


@dataclasses.dataclass
class ModuleUpdate:
    module: str
    component: str
    rank: int
    scaling: float
    norm_a: float
    norm_b: float
    update_norm: float  # ‖B·A‖_F · scaling

    @property
    def moved(self) -> bool:
        return self.norm_b > 0


def lora_scaling(config: dict[str, Any], module: str, rank: int) -> float:
    """PEFT's LoRA scaling: lora_alpha (or its alpha_pattern entry) / r, or / √r with rsLoRA."""
    alpha = config.get("lora_alpha", 8)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            alpha = value
            break
    if config.get("use_rslora"):
        return alpha / math.sqrt(rank) if rank else 0.0
    return alpha / rank if rank else 0.0


def update_norm(a, b) -> float:
    """‖B·A‖_F without forming B·A: A [r, ...] and B [out, r, ...] flattened to matrices (linear, conv,
    embedding)."""
    import torch

    a = a.float().reshape(a.shape[0], -1)
    b = b.float().reshape(b.shape[0], -1)
    if b.shape[1] != a.shape[0]:  # embeddings: A [r, vocab], B [dim, r] is the usual; anything else: transpose
        b = b.T if b.shape[0] == a.shape[0] else b
    if b.shape[1] != a.shape[0]:
        return float("nan")
    return float(torch.sqrt(torch.clamp(((b.T @ b) * (a @ a.T)).sum(), min=0)))


def adapter_shape_mismatches(adapter: CheckpointInspection, skeleton, map_key) -> tuple[int, list[dict[str, Any]]]:
    """(LoRA tensors checked, mismatches): lora_A is [r, in_features] and lora_B [out_features, r] of the module."""
    checked, mismatches = 0, []
    for header in adapter.headers:
        for t in header.tensors:
            if ".lora_A." not in t.name and ".lora_B." not in t.name:
                continue
            module_key = t.name.removeprefix("base_model.model.").split(".lora_")[0]
            path = map_key(module_key + ".weight").removesuffix(".weight")
            try:
                module = skeleton.get_submodule(path)
            except AttributeError:
                mismatches.append({"tensor": t.name, "problem": f"the base has no module {path}"})
                continue
            in_f, out_f = getattr(module, "in_features", None), getattr(module, "out_features", None)
            if in_f is None or out_f is None or len(t.shape) != 2:
                continue  # conv / embedding LoRA: shapes follow other rules; not checked
            checked += 1
            want = in_f if ".lora_A." in t.name else out_f
            got = t.shape[1] if ".lora_A." in t.name else t.shape[0]
            if want != got:
                mismatches.append({"tensor": t.name, "problem": f"shape {list(t.shape)} against {path} "
                                   f"[{out_f} x {in_f}]"})
    return checked, mismatches
