"""Tiny random checkpoints of any architecture, saved as a user would save them.

    folder = build_tiny_checkpoint(Architecture("deepseek_v3", "causal_lm", "DeepseekV3ForCausalLM"), parent)

`tiny_config` shrinks the config class's defaults (of a composite, the sub-config the head's class declares it
takes: `config_the_class_takes`); the model class of the architecture's head is built on it from seed 0 (a model
that cannot be built with every kind of layer kept at the tiny depth, Zamba with a single hybrid layer whose
shared-block tying needs two, is built on the plain prefix of its layer lists) and saved with `save_pretrained`
in bf16 (the dtype fine-tuning checkpoints usually carry), with no tokenizer or processor: what a Trainer
checkpoint of a VLM often holds. Weights transformers initializes to all zero (a gate, a projection) get small
random values, as in any trained checkpoint, so that a zero does not cut a gradient path of the random model.
"""

from __future__ import annotations

from pathlib import Path

from workbench.architectures.model_types import Architecture

DTYPE = "bfloat16"


def config_the_class_takes(model_class, config):
    """The config itself, or the sub-config of a composite that the model class is built on: the type's mapped
    config holds several models' configs (MusicgenConfig: text encoder, audio encoder, decoder) while the head's
    class declares the one it takes (`MusicgenForCausalLM.config_class` is MusicgenDecoderConfig)."""
    wanted = getattr(model_class, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return config
    return next((v for v in vars(config).values() if isinstance(v, wanted)), config)


def fill_zero_weights(model) -> None:
    """Weights transformers initializes to all zero (a gate, a projection) get small random values, as in any trained
    checkpoint, so that a zero does not cut a gradient path of the random model."""
    import torch

    with torch.no_grad():
        for param in model.parameters():
            if param.ndim >= 2 and param.is_floating_point() and not param.any():
                param.normal_(0.0, 0.02)


def build_tiny_checkpoint(arch: Architecture, parent: str | Path) -> Path:
    """Save the tiny checkpoint of `arch` under parent/model_type (rebuilt identically; reused when present)."""
    import torch
    import transformers
    from transformers import CONFIG_MAPPING

    from workbench.architectures.tiny_config import tiny_config

    folder = Path(parent) / arch.model_type
    if (folder / "config.json").exists():
        return folder
    model_class = getattr(transformers, arch.class_name)
    config_class = type(CONFIG_MAPPING[arch.model_type]())
    torch.manual_seed(0)
    config = config_the_class_takes(model_class, tiny_config(config_class))
    try:
        model = model_class(config)
    except Exception:  # noqa: BLE001 - the plain prefix of the layer lists is tried next
        prefix = config_the_class_takes(model_class, tiny_config(config_class, keep_layer_kinds=False))
        if prefix.to_dict() == config.to_dict():
            raise
        torch.manual_seed(0)
        model = model_class(prefix)
    fill_zero_weights(model)
    model = model.to(getattr(torch, DTYPE)).eval()
    model.config.dtype = DTYPE
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    return folder
