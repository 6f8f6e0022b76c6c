"""Image + text and audio inputs for a model that ships no processor (a Trainer checkpoint often holds none), built
from the model's own contract rather than from a list of families.

- `sample_image`: the red square every VLM batch is built from: 224x224, or for a processor whose output grows with
  the image (Qwen2-VL's `smart_resize` and its kin) the smallest it takes, at most that (`smallest_side`).
- `vlm_inputs_from_image_processor`: the image-processor class transformers maps to the model type, built with its
  defaults (the original checkpoint's image size and normalization), turns a test image into the tensors the model
  takes (`pixel_values`, `image_grid_thw`, `pixel_attention_mask`, `image_sizes`, ...); the model's own
  `get_image_features` says how many image tokens those tensors fill, and the prompt gets that many.
- `vlm_inputs_from_config`: Qwen2-VL style grids, Gemma 3's `mm_tokens_per_image`, LLaVA's patch count, computed
  from the config (the fallback when no image-processor class is mapped).
- `image_beside_text`: pixels beside the text (BLIP-2's Q-Former), the image resized to the vision tower's
  `image_size` when the processor's default differs (its position embeddings have that many rows).
- `codebook_ids`: token ids once per codebook (MusicGen's decoder: `num_codebooks` rows per sample).
- `companion_ids`: token ids a forward requires beside `input_ids` (InstructBLIP's `qformer_input_ids`).
- `beside_token_inputs`: what the forward needs beside the token ids, read from its signature and the config:
  layout boxes (`bbox`: LayoutLM-style integer boxes below `max_2d_position_embeddings`, else Bros's normalized
  floats), language ids (`lang_ids`: X-MOD's adapter of the config's first language).
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


def companion_ids(model, config, n: int = 12) -> dict[str, torch.Tensor]:
    """Token ids a forward requires beside `input_ids` (a parameter without default named `<part>_input_ids`,
    InstructBLIP's `qformer_input_ids`), random ids of that part's vocabulary (`<part>_config.vocab_size`), with
    their attention mask when the forward takes one."""
    try:
        signature = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    out: dict[str, torch.Tensor] = {}
    for name, param in signature.items():
        if not name.endswith("_input_ids") or param.default is not param.empty or name == "decoder_input_ids":
            continue
        part = getattr(config, f"{name[:-len('_input_ids')]}_config", None)
        ids = text_ids(part or config, n, torch.Generator().manual_seed(1)).unsqueeze(0)
        out[name] = ids
        mask = name.replace("_input_ids", "_attention_mask")
        if mask in signature:
            out[mask] = torch.ones_like(ids)
    return out


TEST_IMAGE_SIDE = 224  # the test image's side: a processor of a fixed size resizes the red square to its own


def smallest_side(image_processor) -> int:
    """The side of the square test image for `image_processor`: TEST_IMAGE_SIDE, or, for a processor that keeps the
    image's resolution in merged patches (Qwen2-VL's `smart_resize` and its kin: a `merge_size`, an
    `image_grid_thw` out), the side of what it makes of the smallest image (one merged patch, enlarged by the
    processor to its least pixel count: 56x56 for Qwen2-VL), where that is smaller. Every pass of a diagnosis runs
    on this image, and the checks read dtypes, gradients and crashes, which do not grow with it: for Qwen2-VL
    224x224 is 256 patches and 64 image tokens, 56x56 16 patches and 4 (grad.flow's step on the 7B-shaped bench
    checkpoint: 24 s → 10-11 s on this project's CPU)."""
    from PIL import Image

    merge, patch = getattr(image_processor, "merge_size", None), getattr(image_processor, "patch_size", None)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (merge, patch)):
        return TEST_IMAGE_SIDE
    try:
        tiny = Image.new("RGB", (patch * merge,) * 2, color="red")
        grid = image_processor(images=[tiny], return_tensors="pt")["image_grid_thw"][0].tolist()
    except Exception:  # noqa: BLE001 - a processor that takes no such image, or says no grid: the default square
        return TEST_IMAGE_SIDE
    if len(grid) != 3 or grid[1] != grid[2] or grid[1] < 1:
        return TEST_IMAGE_SIDE
    return min(TEST_IMAGE_SIDE, grid[1] * patch)


def sample_image(image_processor=None):
    """The red square test image for `image_processor` (`smallest_side`; TEST_IMAGE_SIDE without one)."""
    from PIL import Image

    side = smallest_side(image_processor) if image_processor is not None else TEST_IMAGE_SIDE
    return Image.new("RGB", (side, side), color="red")


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


def _own_and_tower_types(config, tower: str) -> list[str]:
    """The model type, then its tower's (`vision_config`), then a composite's encoder's (VisionEncoderDecoder's ViT,
    SpeechEncoderDecoder's Wav2Vec2): the types whose processor classes may fit the model's input."""
    types = [config.model_type]
    for name in (tower, "encoder"):
        sub = getattr(config, name, None)
        if getattr(sub, "model_type", None):
            types.append(sub.model_type)
    return types


def _encoder_config(config, tower: str):
    """The sub-config that takes the pixels or the audio: the tower, else a composite's encoder."""
    return getattr(config, tower, None) or getattr(config, "encoder", None)


def mapped_image_processor(config):
    """The image processor transformers maps to the model type (else to its vision tower's), with its defaults."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    for model_type in _own_and_tower_types(config, "vision_config"):
        processor = _mapped_instance(IMAGE_PROCESSOR_MAPPING_NAMES, model_type)
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


def vlm_inputs_from_image_processor(model, config, image=None) -> tuple[dict, str] | None:
    """Image + text through the image-processor class mapped to the model type and the model's own
    `get_image_features` (module docstring); `image` defaults to that processor's `sample_image`. None when no class is
    mapped or the model has no such method."""
    inner = unwrap_model(model)[0]
    image_token = token_id(config, "image_token_id", "image_token_index")
    processor = mapped_image_processor(config)
    if processor is None or image_token is None or not hasattr(inner, "get_image_features"):
        return None
    image = sample_image(processor) if image is None else image
    vision = {**dict(processor(images=[image], return_tensors="pt", **_tower_size(processor, config))),
              **companion_ids(inner, config)}
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
    Q-Former, Florence-2's encoder): the mapped image processor's tensors the forward takes and twelve text ids
    (as decoder labels when the forward takes no input_ids: VisionEncoderDecoder)."""
    processor = mapped_image_processor(config)
    params = forward_params(model)
    if processor is None or "pixel_values" not in params:
        return None
    vision = {k: v for k, v in dict(processor(images=[image], return_tensors="pt", **_tower_size(processor, config)))
              .items() if k in params}
    vision.update(companion_ids(model, config))
    text_config = getattr(config, "decoder", None) or config  # a composite's text lives in its decoder
    ids = text_ids(text_config, 12, torch.Generator().manual_seed(0)).unsqueeze(0)
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in vision.items() if hasattr(v, "shape"))
    image_how = f"a red {image.width}x{image.height} image through {type(processor).__name__} (its defaults)"
    if "input_ids" not in params and "labels" in params:  # an image encoder and a text decoder: the text is labels
        return {**vision, "labels": ids}, f"{image_how}; 12 random decoder token ids as labels; {shapes}"
    return ({"input_ids": ids, "attention_mask": torch.ones_like(ids), **vision},
            f"{image_how} beside 12 random text ids; {shapes}")


def _tower_size(processor, config) -> dict[str, Any]:
    """The processor's `size` (and `crop_size`) set to the vision tower's square `image_size` when its default
    differs: BLIP-2's processor resizes to 384 while a tower configured for 224 has 16x16 + 1 position rows."""
    side = getattr(_encoder_config(config, "vision_config"), "image_size", None)
    if not isinstance(side, int) or isinstance(side, bool):
        return {}
    out: dict[str, Any] = {}
    for key in ("size", "crop_size"):
        default = getattr(processor, key, None)  # a dict or transformers' SizeDict
        height, width = (getattr(default, "get", lambda _k: None)(k) for k in ("height", "width"))
        if height and width and (height, width) != (side, side):
            out[key] = {"height": side, "width": side}
    return out


def layout_boxes(config, n: int) -> tuple[torch.Tensor, str]:
    """n boxes (x0, y0, x1, y1), one per token left to right on one line: integers in the embedding tables' range
    when the config has `max_2d_position_embeddings` (LayoutLM, LiLT: coordinates 0-1000 index those tables),
    else floats in [0, 1] (Bros scales normalized boxes by `bbox_scale`)."""
    rows = getattr(config, "max_2d_position_embeddings", None)
    top = min(1000, int(rows) - 1) if isinstance(rows, int) and rows > 1 else None
    scale = float(top) if top is not None else 1.0
    x0 = torch.arange(n, dtype=torch.float32) / n
    boxes = torch.stack([x0, torch.full((n,), 0.1), x0 + 1.0 / n, torch.full((n,), 0.2)], dim=-1) * scale
    if top is not None:
        return boxes.round().long().clamp(0, top).unsqueeze(0), f"bbox: {n} integer boxes in 0-{top} on one line"
    return boxes.unsqueeze(0), f"bbox: {n} normalized boxes in [0, 1] on one line"


def beside_token_inputs(model, config, ids: torch.Tensor) -> tuple[dict, str] | None:
    """The token ids with what the forward needs beside them (module docstring); None when it takes neither."""
    params = forward_params(model)
    extra: dict[str, Any] = {}
    said: list[str] = []
    if "bbox" in params:
        extra["bbox"], how = layout_boxes(config, ids.shape[1])
        said.append(how)
    languages = getattr(config, "languages", None)
    if "lang_ids" in params and isinstance(languages, (list, tuple)) and languages:
        extra["lang_ids"] = torch.zeros(ids.shape[0], dtype=torch.long)  # per row, as the default language is
        said.append(f"lang_ids: {languages[0]!r} (the config's first language)")
    if not extra:
        return None
    return {"input_ids": ids, **extra}, f"{ids.shape[1]} random token ids with {'; '.join(said)}"


def codebook_ids(config, ids: torch.Tensor) -> tuple[dict, str] | None:
    """The token ids once per codebook, for a decoder over audio codes whose config has `num_codebooks` (MusicGen's
    decoder takes input_ids of shape (batch x num_codebooks, length)); None for a config without codebooks."""
    books = getattr(config, "num_codebooks", None)
    if not isinstance(books, int) or isinstance(books, bool) or books < 2:
        return None
    return ({"input_ids": ids.repeat(books, 1)},
            f"{ids.shape[1]} random token ids for each of the {books} codebooks (num_codebooks), "
            f"input_ids {[books * ids.shape[0], ids.shape[1]]}")


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

    extractor = next((e for t in _own_and_tower_types(config, "audio_config")
                      if (e := _mapped_instance(FEATURE_EXTRACTOR_MAPPING_NAMES, t)) is not None), None)
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
