"""Batches of VLM inputs for the grounding task: prompts for generation (left-padded) and prompt + answer with the
prompt masked in the labels (right-padded), what a training step and a teacher-forced evaluation both feed."""

from __future__ import annotations

from typing import Sequence

import torch
from torch.nn.functional import pad

from workbench.model.inputs import vlm_inputs


def teacher_forced_inputs(tokenizer, image_processor, image, question: str, answer: str) -> dict:
    """`vlm_inputs` for the question followed by the answer and the end-of-turn token, with `labels` masked
    (-100) on the prompt: what a training step and a teacher-forced evaluation both feed the model."""
    prompt = vlm_inputs(tokenizer, image_processor, image, question)
    answer_ids = tokenizer(answer + tokenizer.eos_token, add_special_tokens=False,
                           return_tensors="pt")["input_ids"]
    n_prompt = prompt["input_ids"].shape[1]
    return {
        **prompt,
        "input_ids": torch.cat([prompt["input_ids"], answer_ids], dim=1),
        "attention_mask": torch.ones(1, n_prompt + answer_ids.shape[1], dtype=torch.long),
        "mm_token_type_ids": torch.cat([prompt["mm_token_type_ids"], torch.zeros_like(answer_ids)], dim=1),
        "labels": torch.cat([torch.full((1, n_prompt), -100), answer_ids], dim=1),
    }


def collate_teacher_forced(items: Sequence[dict], pad_token_id: int) -> dict:
    """Batch `teacher_forced_inputs`: token rows padded on the right, images concatenated."""
    length = max(item["input_ids"].shape[1] for item in items)
    fill = {"input_ids": pad_token_id, "attention_mask": 0, "mm_token_type_ids": 0, "labels": -100}
    batch = {key: torch.cat([pad(item[key], (0, length - item[key].shape[1]), value=value) for item in items])
             for key, value in fill.items()}
    batch["pixel_values"] = torch.cat([item["pixel_values"] for item in items])
    batch["image_grid_thw"] = torch.cat([item["image_grid_thw"] for item in items])
    return batch


def collate_prompts(items: Sequence[dict], pad_token_id: int) -> dict:
    """Batch `vlm_inputs` for generation: token rows padded on the left (generation appends on the right; the
    attention mask and M-RoPE's positions skip the padding), images concatenated."""
    length = max(item["input_ids"].shape[1] for item in items)
    fill = {"input_ids": pad_token_id, "attention_mask": 0, "mm_token_type_ids": 0}
    batch = {key: torch.cat([pad(item[key], (length - item[key].shape[1], 0), value=value) for item in items])
             for key, value in fill.items() if key in items[0]}
    for key in ("pixel_values", "image_grid_thw"):
        batch[key] = torch.cat([item[key] for item in items])
    return batch
