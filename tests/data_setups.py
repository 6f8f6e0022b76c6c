"""Set-ups that return a Trainer built on --data, each with a defect planted the way users plant it (notebook 07's
tests: `--setup data_setups:FUNCTION`; pytest puts tests/, the folder of conftest.py, on sys.path)."""

from __future__ import annotations

import json
import tempfile

import torch


def _rows(data):
    with open(data, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _trainer(checkpoint, tokenizer, rows, collator):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    dataset = Dataset.from_list([{"input_ids": list(tokenizer.apply_chat_template(
        r["messages"], tokenize=True, return_dict=True)["input_ids"])} for r in rows])
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="data-setup-"), report_to=[], use_cpu=True,
                             per_device_train_batch_size=4)
    return Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)


def pad_is_eos(checkpoint, data=None, **_):
    """The classic: pad = EOS, and transformers' LM collator masks every pad id, EOS included, as -100."""
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.pad_token = tokenizer.eos_token
    return _trainer(checkpoint, tokenizer, _rows(data), DataCollatorForLanguageModeling(tokenizer, mlm=False))


class CompletionOnlyCollator:
    """What trl's DataCollatorForCompletionOnlyLM did (removed from trl): mask everything up to the response
    template; a row where the template is not found is masked whole."""

    def __init__(self, tokenizer, response_template: str):
        self.tokenizer = tokenizer
        self.response = tokenizer(response_template, add_special_tokens=False)["input_ids"]

    def __call__(self, features):
        batch = self.tokenizer.pad([{"input_ids": f["input_ids"]} for f in features], return_tensors="pt")
        labels = batch["input_ids"].clone()
        labels[batch["attention_mask"] == 0] = -100
        n = len(self.response)
        for i, ids in enumerate(batch["input_ids"].tolist()):
            found = next((j for j in range(len(ids) - n + 1) if ids[j:j + n] == self.response), None)
            if found is None:
                labels[i, :] = -100
            else:
                labels[i, :found + n] = -100
        batch["labels"] = labels
        return batch


def response_template_never_matches(checkpoint, data=None, **_):
    """A completion-only collator looking for '### Answer:' while the chat template renders <|im_start|>assistant."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return _trainer(checkpoint, tokenizer, _rows(data), CompletionOnlyCollator(tokenizer, "### Answer:"))


def response_template_matches(checkpoint, data=None, **_):
    """The same collator with the template's own assistant header: healthy."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return _trainer(checkpoint, tokenizer, _rows(data), CompletionOnlyCollator(tokenizer, "<|im_start|>assistant\n"))


def sft_trainer(checkpoint, data=None, **_):
    """A real trl SFTTrainer on prompt/completion rows (completion-only loss, trl's collator): healthy."""
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    args = SFTConfig(output_dir=tempfile.mkdtemp(prefix="data-sft-"), report_to=[], use_cpu=True, bf16=False,
                     max_length=48, per_device_train_batch_size=4)
    return SFTTrainer(model=model, args=args, processing_class=tokenizer,
                      train_dataset=load_dataset("json", data_files=str(data), split="train"))
