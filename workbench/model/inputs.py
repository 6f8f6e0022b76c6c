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


def sample_inputs(model, folder: str | Path, text: str = "What is in this image?",
                  inputs_file: str | None = None) -> tuple[dict, str]:
    """Inputs that fit the model, and how they were made: the user's tensors (a safetensors file named by the
    parameters' `forward_inputs`), image + text for a VLM whose checkpoint ships a tokenizer and image processor
    (the seeds' red 224x224 test image), tokenized text, or random token ids."""
    import torch
    from PIL import Image

    from workbench.model.components import unwrap_model

    inner, _ = unwrap_model(model)
    config = getattr(inner, "config", None)
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    if inputs_file:
        from safetensors.torch import load_file

        inputs = load_file(inputs_file)
        return {k: v.to(device) for k, v in inputs.items()}, f"the tensors in {inputs_file} ({', '.join(inputs)})"
    tokenizer, image_processor = load_vlm_parts(folder)
    if getattr(config, "vision_config", None) is not None and tokenizer is not None and image_processor is not None:
        inputs = vlm_inputs(tokenizer, image_processor, Image.new("RGB", (224, 224), color="red"), text)
        how = "image + text (a red 224x224 image and a question, through the checkpoint's tokenizer and processor)"
    elif tokenizer is not None:
        inputs = dict(tokenizer([text], return_tensors="pt"))
        how = "text through the checkpoint's tokenizer"
    else:
        vocab = getattr(getattr(config, "text_config", config), "vocab_size", 100) or 100
        generator = torch.Generator().manual_seed(0)
        inputs = {"input_ids": torch.randint(0, vocab, (1, 16), generator=generator)}
        how = "16 random token ids (no tokenizer in the checkpoint)"
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in inputs.items()}, how
