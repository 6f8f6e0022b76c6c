"""Image + text and audio inputs for a model that ships no processor (a Trainer checkpoint often holds none), built
from the model's own contract rather than from a list of families.

- `vlm_inputs_from_image_processor`: the image-processor class transformers maps to the model type, built with its
  defaults (the original checkpoint's image size and normalization), turns a test image into the tensors the model
  takes (`pixel_values`, `image_grid_thw`, `pixel_attention_mask`, `image_sizes`, ...); the model's own
  `get_image_features` says how many image tokens those tensors fill, and the prompt gets that many.
- `vlm_inputs_from_config`: Qwen2-VL style grids, Gemma 3's `mm_tokens_per_image`, LLaVA's patch count, computed
  from the config (the fallback when no image-processor class is mapped).
- `speech_inputs`: for `main_input_name == "input_features"`, the feature-extractor class mapped to the model type
  (its defaults: Whisper's 80 mel bins × 3000 frames) on one second of a quiet tone; decoder labels are token ids.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

from workbench.model.components import unwrap_model

MULTIMODAL_TOKENS = ("image_token_id", "image_token_index", "video_token_id", "boi_token_index", "eoi_token_index",
                     "vision_start_token_id", "vision_end_token_id", "audio_token_id", "audio_token_index",
                     "boa_token_index", "eoa_token_index")


def forward_params(model) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def token_id(config, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    text = getattr(config, "text_config", None)
    return token_id(text, *names) if text is not None and text is not config else None


def text_ids(config, n: int, generator) -> torch.Tensor:
    """n random ids from the text vocabulary, none of them a special multimodal token."""
    vocab = int(getattr(getattr(config, "text_config", config), "vocab_size", 100) or 100)
    ids = torch.randint(3, max(4, vocab), (n,), generator=generator)
    for name in MULTIMODAL_TOKENS:
        special = token_id(config, name)
        if special is not None:
            ids[ids == special] = 3
    return ids


def image_text_batch(model, config, n_image: int, vision: dict[str, Any], generator) -> dict[str, Any]:
    """Six text ids, [start] + n_image image tokens + [end], six text ids; the vision tensors; the token-type ids
    the model's forward takes (M-RoPE's mm_token_type_ids, Gemma 3's token_type_ids)."""
    image_token = token_id(config, "image_token_id", "image_token_index")
    start = token_id(config, "vision_start_token_id", "boi_token_index")
    end = token_id(config, "vision_end_token_id", "eoi_token_index")
    pieces = [text_ids(config, 6, generator)]
    pieces += [torch.tensor([start])] if start is not None else []
    pieces += [torch.full((n_image,), image_token)]
    pieces += [torch.tensor([end])] if end is not None else []
    pieces += [text_ids(config, 6, generator)]
    ids = torch.cat(pieces).unsqueeze(0)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **vision}
    params = forward_params(model)
    if "mm_token_type_ids" in params:
        inputs["mm_token_type_ids"] = (ids == image_token).long()
    if "token_type_ids" in params:  # Gemma 3: image tokens attend bidirectionally within their block
        inputs["token_type_ids"] = (ids == image_token).long()
    return inputs


def _mapped_instance(mapping: dict, model_type: str):
    """The first class of an auto-mapping entry that this install can build (PIL before torchvision variants),
    built with its defaults (the original checkpoint's sizes and normalization)."""
    import transformers

    names = mapping.get(model_type)
    if isinstance(names, dict):
        names = [names.get("pil"), names.get("slow"), *names.values()]
    elif isinstance(names, str):
        names = [names]
    for name in names or ():
        if name:
            with contextlib.suppress(Exception):  # a class whose backend is missing raises when built
                return getattr(transformers, name)()
    return None


def mapped_image_processor(config):
    """The image processor transformers maps to the model type (else to its vision tower's), with its defaults."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    for model_type in (config.model_type, getattr(getattr(config, "vision_config", None), "model_type", None)):
        processor = _mapped_instance(IMAGE_PROCESSOR_MAPPING_NAMES, model_type) if model_type else None
        if processor is not None:
            return processor
    return None


def _feature_rows(features: Any) -> int:
    """How many image tokens `get_image_features` output fills: rows of its (last-dim) feature vectors."""
    if hasattr(features, "pooler_output") and features.pooler_output is not None:
        features = features.pooler_output
    elif hasattr(features, "last_hidden_state") and not isinstance(features, torch.Tensor):
        features = features.last_hidden_state
    if isinstance(features, torch.Tensor):
        return features.numel() // features.shape[-1]
    if isinstance(features, (list, tuple)):
        return sum(_feature_rows(f) for f in features)
    raise TypeError(f"get_image_features returned {type(features).__name__}")


def vlm_inputs_from_image_processor(model, config, image) -> tuple[dict, str] | None:
    """Image + text through the image-processor class mapped to the model type and the model's own
    `get_image_features` (module docstring). None when no class is mapped or the model has no such method."""
    inner = unwrap_model(model)[0]
    image_token = token_id(config, "image_token_id", "image_token_index")
    processor = mapped_image_processor(config)
    if processor is None or image_token is None or not hasattr(inner, "get_image_features"):
        return None
    vision = dict(processor(images=[image], return_tensors="pt"))
    takes = set(inspect.signature(inner.get_image_features).parameters)
    device = next(inner.parameters()).device
    vision = {k: v.to(device) if hasattr(v, "to") else v for k, v in vision.items()}
    if any(p.kind is p.VAR_KEYWORD for p in inspect.signature(inner.get_image_features).parameters.values()):
        takes |= set(vision)
    forward = forward_params(inner)
    vision = {k: v for k, v in vision.items() if k in forward or k in takes}
    dtype = next((p.dtype for p in inner.parameters() if p.is_floating_point()), torch.float32)
    was_training = inner.training
    inner.eval()
    try:
        with torch.no_grad():
            pixels = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v
                      for k, v in vision.items() if k in takes}
            n_image = _feature_rows(inner.get_image_features(**pixels))
    finally:
        inner.train(was_training)
    generator = torch.Generator().manual_seed(0)
    inputs = image_text_batch(inner, config, n_image, vision, generator)
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in vision.items() if hasattr(v, "shape"))
    return inputs, (f"image + text built without a processor: a red {image.width}x{image.height} image through "
                    f"{type(processor).__name__} (its defaults), {n_image} image tokens (counted by the model's "
                    f"get_image_features), image_token_id {image_token}; {shapes}")


def image_beside_text(model, config, image) -> tuple[dict, str] | None:
    """For a model that takes pixels beside its text rather than in place of image tokens (BLIP, BLIP-2's
    Q-Former, Florence-2's encoder): the mapped image processor's tensors and twelve text ids."""
    processor = mapped_image_processor(config)
    if processor is None or "pixel_values" not in forward_params(model):
        return None
    vision = {k: v for k, v in dict(processor(images=[image], return_tensors="pt")).items()
              if k in forward_params(model)}
    ids = text_ids(config, 12, torch.Generator().manual_seed(0)).unsqueeze(0)
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in vision.items() if hasattr(v, "shape"))
    return ({"input_ids": ids, "attention_mask": torch.ones_like(ids), **vision},
            f"a red {image.width}x{image.height} image through {type(processor).__name__} (its defaults) beside 12 random text "
            f"ids; {shapes}")


def vlm_inputs_from_config(model, config) -> tuple[dict, str] | None:
    """Image + text computed from the config alone: Qwen2-VL style (`image_grid_thw`: flattened patches and a grid,
    one token per merged patch), Gemma 3 (`mm_tokens_per_image`), LLaVA style (one token per patch of the vision
    tower's image, CLS dropped under the 'default' feature selection). None when the config does not say enough."""
    vision = getattr(config, "vision_config", None)
    image_token = token_id(config, "image_token_id", "image_token_index")
    if vision is None or image_token is None:
        return None
    generator = torch.Generator().manual_seed(0)
    extra: dict[str, Any] = {}
    if "image_grid_thw" in forward_params(model):
        patch = int(vision.patch_size)
        temporal = int(getattr(vision, "temporal_patch_size", 1) or 1)
        merge = int(getattr(vision, "spatial_merge_size", 1) or 1)
        channels = int(getattr(vision, "in_chans", getattr(vision, "in_channels", 3)) or 3)
        side = 2 * merge
        n_image = side * side // (merge * merge)
        extra["pixel_values"] = torch.rand(side * side, channels * temporal * patch * patch, generator=generator)
        extra["image_grid_thw"] = torch.tensor([[1, side, side]])
        image = f"{side * patch}x{side * patch} pixels as a {side}x{side} patch grid (image_grid_thw), {n_image} image tokens"
    else:
        size = getattr(vision, "image_size", None)
        patch = getattr(vision, "patch_size", None)
        if isinstance(size, (list, tuple)):
            size = size[0]
        if not size:
            return None
        if getattr(config, "mm_tokens_per_image", None):
            n_image, source = int(config.mm_tokens_per_image), "mm_tokens_per_image"
        elif patch and getattr(config, "vision_feature_select_strategy", None) is not None:
            n_image = (int(size) // int(patch)) ** 2 + (1 if config.vision_feature_select_strategy == "full" else 0)
            source = f"(image_size / patch_size)^2, vision_feature_select_strategy={config.vision_feature_select_strategy}"
        elif getattr(config, "image_seq_length", None):
            n_image, source = int(config.image_seq_length), "image_seq_length"
        else:
            return None
        channels = int(getattr(vision, "num_channels", 3) or 3)
        extra["pixel_values"] = torch.rand(1, channels, int(size), int(size), generator=generator)
        image = f"a random {size}x{size} image, {n_image} image tokens ({source})"
    inputs = image_text_batch(model, config, n_image, extra, generator)
    return inputs, (f"image + text built from the config (no processor saved): {image}, image_token_id {image_token}, "
                    f"12 random text ids; tensors {', '.join(inputs)}")


def speech_inputs(model, config) -> tuple[dict, str] | None:
    """input_features through the feature-extractor class mapped to the model type (module docstring)."""
    import numpy as np
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES

    extractor = _mapped_instance(FEATURE_EXTRACTOR_MAPPING_NAMES, config.model_type)
    if extractor is None:
        return None
    rate = int(getattr(extractor, "sampling_rate", 16000) or 16000)
    wave = (0.1 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)).astype(np.float32)
    features = dict(extractor(wave, sampling_rate=rate, return_tensors="pt"))
    params = forward_params(model)
    inputs = {k: v for k, v in features.items() if k in params}
    if not inputs:
        return None
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
    return inputs, f"one second of a 440 Hz tone through {type(extractor).__name__} (its defaults): {shapes}"
