"""Inputs that fit a model: image + text for VLMs, text for LLMs, built from what the checkpoint ships.

`vlm_inputs` does what Qwen2VLProcessor.__call__ does (expand each image placeholder to one token per merged
patch) from the tokenizer and the image processor alone, for installs where the processor class cannot be
built (its video half imports torchvision).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, NamedTuple


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


class Candidate(NamedTuple):
    """A batch that may fit the model and how it was made, or (inputs None) a builder that could not build one."""

    inputs: dict | None
    how: str
    error: str | None = None  # why the builder could not build, when inputs is None


def candidate_inputs(model, folder: str | Path, text: str = "What is in this image?",
                     inputs_file: str | None = None) -> Iterator[Candidate]:
    """Batches that may fit the model, best first, each with how it was made (`workbench.model.batch` keeps the
    first the model accepts). The user's tensors (a safetensors file named by the parameters' `forward_inputs`)
    are the only candidate when given. Else, by the model's `main_input_name` and head: for a VLM, image + text
    through the checkpoint's tokenizer and image processor (a red test image, `multimodal_inputs.sample_image`:
    224x224, or the smallest a Qwen2-VL-style processor takes), its saved processor, the image-processor class
    transformers maps to the model type with the model's own image-token count, or the config's sizes
    (`workbench.model.multimodal_inputs`); for speech (`input_features` / `input_values`, also a
    SpeechEncoderDecoder's), the mapped feature extractor; then text through the checkpoint's tokenizer; then
    random token ids, alone, then with what the forward takes beside them (layout boxes, language ids:
    `beside_token_inputs`), then once per codebook (`codebook_ids`). A builder that cannot build yields a
    Candidate without inputs, with its error. Image and audio tensors come in the model's floating
    dtype. Labels are added separately (`with_labels`), to fit the head."""
    import torch

    from workbench.model import multimodal_inputs as mm
    from workbench.model.components import unwrap_model
    from workbench.model.heads import head_kind
    from workbench.model.loading import first_device

    inner, _ = unwrap_model(model)
    config = getattr(inner, "config", None)
    device = first_device(model)

    floating = next((p.dtype for p in inner.parameters() if p.is_floating_point()), torch.float32)

    def placed(inputs: dict) -> dict:
        """On the model's device; image and audio tensors in its floating dtype, as a collator casts them."""
        return {k: (v.to(device, floating) if v.is_floating_point() else v.to(device)) if torch.is_tensor(v) else v
                for k, v in inputs.items()}

    def attempt(label: str, build) -> Iterator[Candidate]:
        """A builder's batch, or a Candidate without inputs when it cannot build one (kept among the rejected)."""
        try:
            built = build()
        except Exception as exc:  # noqa: BLE001 - the next candidate is tried; the reason is kept
            yield Candidate(None, label, f"{type(exc).__name__}: {str(exc)[:200]}")
            return
        if built is not None:
            yield Candidate(placed(built[0]), built[1])

    if inputs_file:
        from safetensors.torch import load_file

        inputs = load_file(inputs_file)
        yield Candidate({k: v.to(device) for k, v in inputs.items()},
                        f"the tensors in {inputs_file} ({', '.join(inputs)})")
        return
    tokenizer, image_processor = load_vlm_parts(folder)
    image = mm.sample_image()
    if head_kind(model) == "image_text_to_text" or getattr(config, "vision_config", None) is not None:
        image_token = mm.token_id(config, "image_token_id", "image_token_index")
        if tokenizer is not None and image_processor is not None and hasattr(image_processor, "merge_size"):
            def through_parts():
                small = mm.sample_image(image_processor)
                return (vlm_inputs(tokenizer, image_processor, small, text),
                        f"image + text (a red {small.width}x{small.height} image and a question, through the "
                        "checkpoint's tokenizer and processor)")

            yield from attempt("the checkpoint's tokenizer and image processor", through_parts)
        if tokenizer is not None and image_processor is not None:
            from workbench.model.loading import load_processor

            def through_processor():
                processor = load_processor(folder)
                small = mm.sample_image(getattr(processor, "image_processor", None))
                built = processor_vlm_inputs(processor, small, text, image_token)
                return None if built is None else (built, f"image + text (a red {small.width}x{small.height} image "
                                                          "and a question, through the checkpoint's processor)")

            yield from attempt("the checkpoint's processor", through_processor)
        yield from attempt("the mapped image processor", lambda: mm.vlm_inputs_from_image_processor(inner, config))
        yield from attempt("the config's image sizes", lambda: mm.vlm_inputs_from_config(inner, config))
        yield from attempt("the mapped image processor, no image token",
                           lambda: mm.image_beside_text(inner, config, image))
    main_input = getattr(inner, "main_input_name", "input_ids")
    audio = {"input_features", "input_values"}
    if main_input in audio or (main_input != "input_ids" and audio & mm.forward_params(inner)):  # "inputs": a composite
        yield from attempt("the mapped feature extractor", lambda: mm.speech_inputs(inner, config))
    if tokenizer is not None:
        yield Candidate(placed(dict(tokenizer([text], return_tensors="pt"))), "text through the checkpoint's tokenizer")
    vocab = getattr(getattr(config, "text_config", config), "vocab_size", 100) or 100
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, 16), generator=generator)
    yield Candidate(placed({"input_ids": ids}),
                    "16 random token ids" + ("" if tokenizer is not None else " (no tokenizer in the checkpoint)"))
    yield from attempt("token ids with layout boxes or language ids", lambda: mm.beside_token_inputs(inner, config, ids))
    yield from attempt("token ids per codebook", lambda: mm.codebook_ids(config, ids))


def sample_inputs(model, folder: str | Path, text: str = "What is in this image?",
                  inputs_file: str | None = None) -> tuple[dict, str]:
    """The first batch of `candidate_inputs` that could be built (not run: `workbench.model.batch.accepted_batch`
    runs each candidate once and keeps the first the model accepts)."""
    return next((c.inputs, c.how) for c in candidate_inputs(model, folder, text, inputs_file) if c.inputs is not None)
