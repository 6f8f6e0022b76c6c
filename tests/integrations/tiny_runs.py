"""A tiny Llama checkpoint with the demo's tokenizer and chat template, and the real Trainer (or trl's SFTTrainer)
training it on the demo's chat rows: what the callback tests run, healthy or with one defect planted."""

from __future__ import annotations

from pathlib import Path

import torch

ROWS = 16


def tiny_checkpoint(folder: Path) -> Path:
    """A 2-layer fp32 Llama and its tokenizer, saved as from_pretrained reads them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.demo.build import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tokenizer

    tokenizer = build_tokenizer(SPECIAL_TOKENS[:3])
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def chat_dataset(tokenizer, rows: int = ROWS):
    from datasets import Dataset

    from workbench.demo.chat_data import chat_rows

    return Dataset.from_list([{"input_ids": list(tokenizer.apply_chat_template(
        r["messages"], tokenize=True, return_dict=True)["input_ids"])} for r in chat_rows(rows)])


class MaskEverything:
    """A collator that masks every label: the run trains on nothing (data.labels fails)."""

    def __init__(self, collator) -> None:
        self.collator = collator

    def __call__(self, features):
        batch = self.collator(features)
        batch["labels"] = torch.full_like(batch["labels"], -100)
        return batch


def reentrant_lora(model):
    """A LoRA over checkpointing called with peft's `{}` options (prepare_model_for_kbit_training's): torch's
    reentrant default, which DDP with find_unused_parameters (a PeftModel's rule) refuses at the first backward."""
    from peft import LoraConfig, get_peft_model

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={})
    model.enable_input_require_grads()
    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


def saved_head_lora(model, *, half: bool = True):
    """A LoRA whose modules_to_save copies lm_head, on the model in fp16 (`half`): PEFT copies the head in the
    base's dtype, fp16 and trainable (peft #341), which GradScaler refuses under fp16=True. `half=False`: the same
    adapter on the fp32 model, whose copy is fp32 (the healthy twin)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model.half() if half else model, LoraConfig(
        r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"], task_type="CAUSAL_LM"))


def trainer_for(checkpoint: Path, output_dir: Path, callbacks=(), *, masked: bool = False, max_steps: int = 3,
                reentrant: bool = False, prepare=None, **arguments):
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    if reentrant:
        model = reentrant_lora(model)
    if prepare is not None:
        model = prepare(model)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    args = TrainingArguments(output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=max_steps,
                             logging_steps=1, learning_rate=1e-3, report_to=[], disable_tqdm=True, seed=0,
                             use_cpu=True, **{"save_strategy": "no", **arguments})
    return Trainer(model=model, args=args, train_dataset=chat_dataset(tokenizer), processing_class=tokenizer,
                   data_collator=MaskEverything(collator) if masked else collator, callbacks=list(callbacks))


def sft_trainer_for(checkpoint: Path, output_dir: Path, callbacks=(), *, max_steps: int = 3):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from workbench.demo.chat_data import chat_rows

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    args = SFTConfig(output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=max_steps, logging_steps=1,
                     learning_rate=1e-3, report_to=[], disable_tqdm=True, seed=0, use_cpu=True, save_strategy="no",
                     assistant_only_loss=False, max_length=128)
    return SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(list(chat_rows(ROWS))),
                      processing_class=tokenizer, callbacks=list(callbacks))


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def vlm_trainer_for(base: Path, data: Path, output_dir: Path, callbacks=(), *, max_steps: int = 3):
    """The real Trainer on a LoRA of a Qwen2-VL checkpoint, fed grounding rows (an image, a question, a box as the
    answer) through a collator that pads the prompt + answer rows and concatenates the images' patches."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2VLForConditionalGeneration, Trainer, TrainingArguments

    from workbench.model.inputs import load_vlm_parts
    from workbench.model.vlm_batches import collate_teacher_forced, teacher_forced_inputs
    from workbench.tasks.grounding import read_dataset

    tokenizer, image_processor = load_vlm_parts(base)
    items = [teacher_forced_inputs(tokenizer, image_processor, r.image, r.question, r.answer)
             for r in read_dataset(data)]
    torch.manual_seed(0)
    model = get_peft_model(Qwen2VLForConditionalGeneration.from_pretrained(str(base), dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    args = TrainingArguments(output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=max_steps,
                             logging_steps=1, learning_rate=1e-3, report_to=[], disable_tqdm=True, seed=0,
                             use_cpu=True, save_strategy="no", remove_unused_columns=False)
    return Trainer(model=model, args=args, train_dataset=items, processing_class=tokenizer,
                   data_collator=lambda rows: collate_teacher_forced(rows, tokenizer.pad_token_id),
                   callbacks=list(callbacks))
