"""Trainer output_dirs of a real LoRA run for the sweep tests: `transformers.Trainer` on a PEFT LoRA of the tiny
Llama the trl runs start from (`tests/probes/run/trl_runs.py`: `base_model`, the demo's tokenizer), saving
checkpoint-1 … checkpoint-4, one per optimizer step (two good checkpoints before the first
planted fault, one bad after it: what a first_bad needs). The run adds a dedicated pad token (what
tokenizer.special_tokens' fix recommends) and so trains the resized embeddings and head as modules_to_save.

Faulty histories are copies of that one run with a fault planted in every checkpoint from a step k on, as a run that
went bad there would have saved them:

    nan              lora_B of one module NaN (training diverged): adapter.weights fails
    no_modules_to_save  the resized embeddings and head no longer saved (modules_to_save dropped from the config and
                     the file): the tokenizer's added pad has no embedding row on the base; tokenizer.vocab fails
    other_pad        the tokenizer saved with another pad token, added without resizing: its id is past the
                     embedding rows; tokenizer.vocab fails
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

CHECKPOINTS = 4
PAD = "<|pad|>"


def _trl_runs():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probes" / "run"))
    import trl_runs

    return trl_runs


def build_lora_run(root: Path, checkpoints: int = CHECKPOINTS) -> Path:
    """The healthy run: root/base (the tiny Llama, its tokenizer without the pad) and root/healthy (output_dir)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    trl_runs = _trl_runs()
    with trl_runs._one_thread():
        base = trl_runs.base_model(root / "base", warm_steps=0)
        tok = AutoTokenizer.from_pretrained(base)
        tok.add_special_tokens({"pad_token": PAD})
        model = AutoModelForCausalLM.from_pretrained(base)
        model.resize_token_embeddings(len(tok))
        model.config.pad_token_id = tok.pad_token_id
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                                                 target_modules=["q_proj", "v_proj"],
                                                 modules_to_save=["embed_tokens", "lm_head"]))
        generator = torch.Generator().manual_seed(0)
        rows = [{"input_ids": ids, "labels": list(ids)}
                for ids in torch.randint(3, len(tok) - 1, (24, 10), generator=generator).tolist()]
        out = root / "healthy"
        arguments = TrainingArguments(output_dir=str(out), max_steps=checkpoints, save_steps=1, logging_steps=1,
                                      per_device_train_batch_size=4, learning_rate=1e-2, report_to=[], seed=0,
                                      use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, save_only_model=True)
        Trainer(model=model, args=arguments, train_dataset=rows, processing_class=tok).train()
    return out


def plant(healthy: Path, into: Path, faults: dict[str, int]) -> Path:
    """A copy of the healthy run with each fault in every checkpoint from its step on (`{"nan": 3}`)."""
    shutil.copytree(healthy, into)
    for fault, start in faults.items():
        for step in range(start, CHECKPOINTS + 1):
            PLANTERS[fault](into / f"checkpoint-{step}")
    return into


def _nan_adapter(checkpoint: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(checkpoint / "adapter_model.safetensors")
    name = next(k for k in sorted(tensors) if "lora_B" in k)
    tensors[name] = tensors[name] * float("nan")
    save_file(tensors, checkpoint / "adapter_model.safetensors", metadata={"format": "pt"})


def _no_modules_to_save(checkpoint: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(checkpoint / "adapter_model.safetensors")
    save_file({k: v for k, v in tensors.items() if "lora_" in k}, checkpoint / "adapter_model.safetensors",
              metadata={"format": "pt"})
    config_path = checkpoint / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["modules_to_save"] = None
    config_path.write_text(json.dumps(config, indent=2))


def _other_pad(checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    tok.add_special_tokens({"pad_token": "<|other_pad|>"})
    tok.save_pretrained(checkpoint)


PLANTERS = {"nan": _nan_adapter, "no_modules_to_save": _no_modules_to_save, "other_pad": _other_pad}
