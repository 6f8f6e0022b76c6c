"""Inputs that fit a model: image + text for VLMs, text for LLMs, built from what the checkpoint ships.

`vlm_inputs` does what Qwen2VLProcessor.__call__ does (expand each image placeholder to one token per merged
patch) from the tokenizer and the image processor alone, for installs where the processor class cannot be
built (its video half imports torchvision).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_vlm_parts(folder: str | Path) -> tuple[Any, Any]:
    """(tokenizer, image_processor) saved beside a checkpoint; either may be None."""
    from transformers import AutoImageProcessor, AutoTokenizer

    folder = Path(folder)
    tokenizer = image_processor = None
    if (folder / "tokenizer_config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if (folder / "preprocessor_config.json").exists():
        image_processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    return tokenizer, image_processor


def vlm_inputs(tokenizer, image_processor, image, text: str, image_token: str = "<|image_pad|>") -> dict:
    """input_ids / attention_mask / pixel_values / image_grid_thw for one image and one user turn."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    vision = image_processor(images=[image], return_tensors="pt")
    merge = getattr(image_processor, "merge_size", 2) ** 2
    n_tokens = int(vision["image_grid_thw"][0].prod()) // merge
    prompt = prompt.replace(image_token, image_token * n_tokens, 1)
    encoded = tokenizer([prompt], return_tensors="pt")
    image_token_id = tokenizer.convert_tokens_to_ids(image_token)
    # modality per token (0 text, 1 image), as ProcessorMixin.create_mm_token_type_ids builds it for M-RoPE
    mm_token_type_ids = (encoded["input_ids"] == image_token_id).long()
    return {**encoded, **vision, "mm_token_type_ids": mm_token_type_ids}


def _forward_params(model) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _text_ids(config, n: int, avoid: set[int], generator):
    """n random ids from the text vocabulary, none of them a special multimodal token."""
    import torch

    vocab = int(getattr(getattr(config, "text_config", config), "vocab_size", 100) or 100)
    ids = torch.randint(3, vocab, (n,), generator=generator)
    for token in avoid:
        ids[ids == token] = 3
    return ids


def _token_id(config, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def vlm_inputs_from_config(model, config) -> tuple[dict, str] | None:
    """Image + text for a VLM whose checkpoint ships no processor, built from its config as its forward expects:
    Qwen2-VL style (`image_grid_thw`: flattened patches and a grid, one token per merged patch, mm_token_type_ids
    for M-RoPE), Gemma 3 (`mm_tokens_per_image` image tokens), LLaVA style (one token per patch of the vision
    tower's image, CLS dropped under the 'default' feature selection). None when the config does not say enough."""
    import torch

    vision = getattr(config, "vision_config", None)
    image_token = _token_id(config, "image_token_id", "image_token_index")
    if vision is None or image_token is None:
        return None
    params = _forward_params(model)
    generator = torch.Generator().manual_seed(0)
    specials = {t for t in (image_token, _token_id(config, "video_token_id"), _token_id(config, "boi_token_index"),
                            _token_id(config, "eoi_token_index"), _token_id(config, "vision_start_token_id"),
                            _token_id(config, "vision_end_token_id")) if t is not None}
    extra: dict[str, Any] = {}
    if "image_grid_thw" in params:
        patch = int(vision.patch_size)
        temporal = int(getattr(vision, "temporal_patch_size", 1) or 1)
        merge = int(getattr(vision, "spatial_merge_size", 1) or 1)
        channels = int(getattr(vision, "in_chans", getattr(vision, "in_channels", 3)) or 3)
        side = 2 * merge
        grid = torch.tensor([[1, side, side]])
        n_image = side * side // (merge * merge)
        extra["pixel_values"] = torch.rand(side * side, channels * temporal * patch * patch, generator=generator)
        extra["image_grid_thw"] = grid
        image = f"{side * patch}x{side * patch} pixels as a {side}x{side} patch grid (image_grid_thw), {n_image} image tokens"
    else:
        size = getattr(vision, "image_size", None)
        patch = getattr(vision, "patch_size", None)
        if isinstance(size, (list, tuple)):
            size = size[0]
        if not size:
            return None
        if getattr(config, "mm_tokens_per_image", None):
            n_image = int(config.mm_tokens_per_image)
            source = "mm_tokens_per_image"
        elif patch and getattr(config, "vision_feature_select_strategy", None) is not None:
            n_image = (int(size) // int(patch)) ** 2 + (1 if config.vision_feature_select_strategy == "full" else 0)
            source = f"(image_size / patch_size)^2, vision_feature_select_strategy={config.vision_feature_select_strategy}"
        elif getattr(config, "image_seq_length", None):
            n_image = int(config.image_seq_length)
            source = "image_seq_length"
        else:
            return None
        channels = int(getattr(vision, "num_channels", 3) or 3)
        extra["pixel_values"] = torch.rand(1, channels, int(size), int(size), generator=generator)
        image = f"a random {size}x{size} image, {n_image} image tokens ({source})"
    start, end = _token_id(config, "vision_start_token_id", "boi_token_index"), _token_id(
        config, "vision_end_token_id", "eoi_token_index")
    pieces = [_text_ids(config, 6, specials, generator)]
    pieces += [torch.tensor([start])] if start is not None else []
    pieces += [torch.full((n_image,), image_token)]
    pieces += [torch.tensor([end])] if end is not None else []
    pieces += [_text_ids(config, 6, specials, generator)]
    ids = torch.cat(pieces).unsqueeze(0)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **extra}
    if "mm_token_type_ids" in params:
        inputs["mm_token_type_ids"] = (ids == image_token).long()
    if "token_type_ids" in params:  # Gemma 3: image tokens attend bidirectionally within their block
        inputs["token_type_ids"] = (ids == image_token).long()
    names = ", ".join(inputs)
    return inputs, (f"image + text built from the config (no processor saved): {image}, image_token_id {image_token}, "
                    f"12 random text ids; tensors {names}")


def processor_vlm_inputs(processor, image, text: str, image_token_id: int | None = None) -> dict | None:
    """Image + text through a saved multimodal processor (LLaVA, Gemma 3, ...): its own image token in the prompt.
    None when the processor's image token is not the one the model's config expects (the config path then builds
    inputs that fit)."""
    token = getattr(processor, "image_token", None)
    if token is None or getattr(processor, "image_processor", None) is None:
        return None
    tokenizer = getattr(processor, "tokenizer", None)
    if image_token_id is not None and (tokenizer is None or tokenizer.convert_tokens_to_ids(token) != image_token_id):
        return None
    return dict(processor(images=[image], text=[f"{token} {text}"], return_tensors="pt"))


def sample_inputs(model, folder: str | Path, text: str = "What is in this image?",
                  inputs_file: str | None = None) -> tuple[dict, str]:
    """Inputs that fit the model, and how they were made: the user's tensors (a safetensors file named by the
    parameters' `forward_inputs`); for a VLM image + text — through the checkpoint's tokenizer and image processor
    (a red 224x224 test image), its saved processor, or built from the config (image token id, the vision
    tower's image and patch size, the number of image tokens the model expects); tokenized text; or random token
    ids. Labels are added separately (`with_labels`), to fit the head."""
    import torch
    from PIL import Image

    from workbench.model.components import unwrap_model
    from workbench.model.heads import head_kind

    inner, _ = unwrap_model(model)
    config = getattr(inner, "config", None)
    from workbench.model.loading import first_device

    device = first_device(model)
    if inputs_file:
        from safetensors.torch import load_file

        inputs = load_file(inputs_file)
        return {k: v.to(device) for k, v in inputs.items()}, f"the tensors in {inputs_file} ({', '.join(inputs)})"
    tokenizer, image_processor = load_vlm_parts(folder)
    image = Image.new("RGB", (224, 224), color="red")
    inputs, how = None, ""
    if head_kind(model) == "image_text_to_text":
        if tokenizer is not None and image_processor is not None and hasattr(image_processor, "merge_size"):
            inputs = vlm_inputs(tokenizer, image_processor, image, text)
            how = "image + text (a red 224x224 image and a question, through the checkpoint's tokenizer and processor)"
        elif tokenizer is not None and image_processor is not None:
            import contextlib

            from workbench.model.loading import load_processor

            with contextlib.suppress(Exception):
                inputs = processor_vlm_inputs(load_processor(folder), image, text,
                                              _token_id(config, "image_token_id", "image_token_index"))
                how = "image + text (a red 224x224 image and a question, through the checkpoint's processor)"
        if inputs is None:
            built = vlm_inputs_from_config(inner, config)
            if built is not None:
                inputs, how = built
    if inputs is not None:
        pass
    elif tokenizer is not None:
        inputs = dict(tokenizer([text], return_tensors="pt"))
        how = "text through the checkpoint's tokenizer"
    else:
        vocab = getattr(getattr(config, "text_config", config), "vocab_size", 100) or 100
        generator = torch.Generator().manual_seed(0)
        inputs = {"input_ids": torch.randint(0, vocab, (1, 16), generator=generator)}
        how = "16 random token ids (no tokenizer in the checkpoint)"
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in inputs.items()}, how
