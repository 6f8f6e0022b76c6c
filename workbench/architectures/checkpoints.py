"""Tiny random checkpoints of any architecture, saved as a user would save them.

    folder = build_tiny_checkpoint(Architecture("deepseek_v3", "causal_lm", "DeepseekV3ForCausalLM"), parent)

`tiny_config` shrinks the config class's defaults; the model class of the architecture's head is built on it
from seed 0 and saved with `save_pretrained` in bf16 (the dtype fine-tuning checkpoints usually carry), with no
tokenizer or processor: what a Trainer checkpoint of a VLM often holds. Weights transformers initializes to all
zero (a gate, a projection) get small random values, as in any trained checkpoint, so that a zero does not cut
a gradient path of the random model.
"""

from __future__ import annotations

from pathlib import Path

from workbench.architectures.model_types import Architecture

DTYPE = "bfloat16"


def build_tiny_checkpoint(arch: Architecture, parent: str | Path) -> Path:
    """Save the tiny checkpoint of `arch` under parent/model_type (rebuilt identically; reused when present)."""
    import torch
    import transformers
    from transformers import CONFIG_MAPPING

    from workbench.architectures.tiny_config import tiny_config

    folder = Path(parent) / arch.model_type
    if (folder / "config.json").exists():
        return folder
    config = tiny_config(type(CONFIG_MAPPING[arch.model_type]()))
    torch.manual_seed(0)
    model = getattr(transformers, arch.class_name)(config)
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim >= 2 and param.is_floating_point() and not param.any():
                param.normal_(0.0, 0.02)
    model = model.to(getattr(torch, DTYPE)).eval()
    model.config.dtype = DTYPE
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    return folder
