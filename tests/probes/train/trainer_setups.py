"""Set-ups that return a real Trainer, for notebook 09's end-to-end tests (`--setup trainer_setups:FUNCTION`, with
this folder on sys.path): the fault planted the way users plant it, and its healthy twin."""

from __future__ import annotations

import atexit
import shutil
import tempfile

import torch


def _output_dir(prefix: str) -> str:
    """The Trainer's output_dir (these set-ups never save into it), removed when the process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


def _trainer(model, **fields):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=_output_dir("trainer-setup-"), report_to="none", use_cpu=True,
                             per_device_train_batch_size=2, **fields)
    return Trainer(model=model, args=args)


def classifier_under_accumulation(checkpoint, **_):
    """A sequence-classification head on the checkpoint, gradient accumulation 4 (transformers #47688)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=3, dtype=torch.float32)
    model.config.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    return _trainer(model, gradient_accumulation_steps=4)


def causal_lm_under_accumulation(checkpoint, **_):
    from transformers import AutoModelForCausalLM

    return _trainer(AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32),
                    gradient_accumulation_steps=4)


def lora_with_peft_checkpointing(checkpoint, **_):
    """LoRA after checkpointing enabled as peft's prepare_model_for_kbit_training does it (kwargs {}): reentrant."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={})
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    return _trainer(model)
