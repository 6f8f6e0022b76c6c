"""What a user hands the workbench, built for real once per family: a tiny healthy checkpoint with a chat-templated
tokenizer, the LoRA adapters a real `transformers.Trainer` trains on it (a few optimizer steps, checkpoints saved),
one of them with `modules_to_save`, and the chat JSONL and TrainingArguments YAML of `--data` / `--training-args`.

Three families: OLMo-2 (a causal LM outside the demo's Llama/Qwen), Qwen2-VL (the demo's VLM base, its own
tokenizer and image processor) and T5 v1.1 (an encoder-decoder, tied)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch

STEPS = 4  # optimizer steps per run; a checkpoint every 2
ROWS = 16
HUB_BASE = "entry-forms/unreachable-base"  # a hub id no cache and no server holds


@dataclasses.dataclass
class Artifacts:
    family: str
    checkpoint: Path  # the base: config, weights, tokenizer (and image processor)
    run: Path  # the Trainer's output_dir: checkpoint-2/, checkpoint-4/, the final adapter at its root
    adapter: Path  # the final adapter alone (adapter_config.json records `checkpoint`)
    adapter_saved_head: Path  # a second run's adapter with modules_to_save
    data: Path  # chat `messages` rows
    training_args: Path  # a YAML of TrainingArguments fields
    callback_report: str | None = None  # the WorkbenchCallback's report folder (first run)
    stopped: str | None = None  # what stopped that run, if anything did
    losses: list[float] = dataclasses.field(default_factory=list)  # its logged losses, one per step

    def save(self) -> None:
        record = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()}
        (self.checkpoint.parent / "artifacts.json").write_text(json.dumps(record, indent=2))

    @classmethod
    def load(cls, root: Path) -> Artifacts:
        record = json.loads((root / "artifacts.json").read_text())
        paths = {f.name for f in dataclasses.fields(cls) if f.type == "Path"}
        return cls(**{k: Path(v) if k in paths else v for k, v in record.items()})

    def run_with_unreachable_base(self, parent: Path) -> Path:
        """A copy of the run whose adapters record a hub id that cannot be reached as their base."""
        out = parent / f"{self.family}-run-hub-base"
        if not out.exists():
            shutil.copytree(self.run, out, ignore=shutil.ignore_patterns("workbench"))
            for config in out.rglob("adapter_config.json"):
                data = json.loads(config.read_text())
                data["base_model_name_or_path"] = HUB_BASE
                config.write_text(json.dumps(data, indent=2))
        return out


def chat_tokenizer():
    from workbench.demo.build import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tokenizer

    tokenizer = build_tokenizer(SPECIAL_TOKENS[:3])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def olmo2_checkpoint(folder: Path) -> Path:
    """A 2-layer OLMo-2 (the tiny config the census builds, on the demo's chat tokenizer), bf16."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    from workbench.architectures.tiny_config import tiny_config

    tokenizer = chat_tokenizer()
    config = tiny_config(Olmo2Config)
    config.update(dict(vocab_size=len(tokenizer), bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False))
    torch.manual_seed(0)
    model = Olmo2ForCausalLM(config).to(torch.bfloat16).eval()
    model.config.dtype = "bfloat16"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def t5_checkpoint(folder: Path) -> Path:
    """A 2-layer T5 v1.1 (no decoder-output scaling; transformers 5 ties its head to `shared` whatever
    tie_word_embeddings says) on the demo's chat tokenizer, fp32."""
    from transformers import T5Config, T5ForConditionalGeneration

    tokenizer = chat_tokenizer()
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(
        vocab_size=len(tokenizer), d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        decoder_start_token_id=tokenizer.pad_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def qwen2_vl_checkpoint(folder: Path, demo_base: Path) -> Path:
    shutil.copytree(demo_base, folder)
    return folder


# --- the training runs ----------------------------------------------------------------------------------------------
def _rows(rows: int = ROWS):
    from workbench.demo.chat_data import chat_rows

    return list(chat_rows(rows))


def causal_parts(checkpoint: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    items = [{"input_ids": list(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)
                                ["input_ids"])} for r in _rows()]
    return model, tokenizer, items, DataCollatorForLanguageModeling(tokenizer, mlm=False), ["q_proj", "v_proj"]


def seq2seq_parts(checkpoint: Path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint, dtype=torch.float32)
    items = []
    for row in _rows():
        prompt = tokenizer.apply_chat_template(row["messages"][:-1], tokenize=False, add_generation_prompt=True)
        answer = row["messages"][-1]["content"]
        items.append({"input_ids": tokenizer(prompt)["input_ids"],
                      "labels": tokenizer(answer)["input_ids"] + [tokenizer.eos_token_id]})
    return model, tokenizer, items, DataCollatorForSeq2Seq(tokenizer, model=model), ["q", "v"]


def vlm_parts(checkpoint: Path, grounding: Path):
    from transformers import Qwen2VLForConditionalGeneration

    from workbench.model.inputs import load_vlm_parts
    from workbench.model.vlm_batches import collate_teacher_forced, teacher_forced_inputs
    from workbench.tasks.grounding import read_dataset

    tokenizer, image_processor = load_vlm_parts(checkpoint)
    items = [teacher_forced_inputs(tokenizer, image_processor, r.image, r.question, r.answer)
             for r in read_dataset(grounding)]
    model = Qwen2VLForConditionalGeneration.from_pretrained(str(checkpoint), dtype=torch.float32)
    return (model, tokenizer, items, lambda rows: collate_teacher_forced(rows, tokenizer.pad_token_id),
            ["q_proj", "v_proj"])


def train_adapter(parts, output_dir: Path, callbacks=(), *, task_type: str, modules_to_save=None,
                  adapter_dir: Path | None = None):
    """A LoRA trained by the real Trainer for STEPS steps, a checkpoint every 2, the final adapter saved at the
    output_dir's root (and alone in `adapter_dir`). Returns the trainer; what stops training raises."""
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments

    model, tokenizer, items, collator, targets = parts
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets,
                                             modules_to_save=modules_to_save, task_type=task_type))
    args = TrainingArguments(output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=STEPS,
                             logging_steps=1, learning_rate=1e-3, report_to=[], disable_tqdm=True, seed=0,
                             use_cpu=True, save_strategy="steps", save_steps=2, remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=items, processing_class=tokenizer,
                      data_collator=collator, callbacks=list(callbacks))
    trainer.train()
    trainer.save_model()
    if adapter_dir is not None:
        trainer.model.save_pretrained(adapter_dir)
        tokenizer.save_pretrained(adapter_dir)
    return trainer


def write_data(folder: Path) -> tuple[Path, Path]:
    from workbench.demo.chat_data import write_chat_data

    data = write_chat_data(folder / "chat.jsonl", rows=24)
    args = folder / "training_args.yaml"
    args.write_text("per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nlearning_rate: 1.0e-4\n"
                    "max_steps: 10\nlogging_steps: 1\nuse_cpu: true\nreport_to: []\n")
    return data, args


FAMILIES = ("olmo2", "qwen2_vl", "t5")
TASK_TYPES = {"olmo2": "CAUSAL_LM", "qwen2_vl": "CAUSAL_LM", "t5": "SEQ_2_SEQ_LM"}
# modules_to_save: the head where it is untied. T5's head is tied to `shared` (transformers 5 forces the tie): a
# copy of lm_head trained apart is the real defect config.tied_embeddings fails on (peft #2777), and peft 0.21.2's
# ensure_weight_tying=True, the remedy, crashes its first forward on T5 (the lm_head copy wraps encoder.embed_tokens
# too: "mat1 and mat2 shapes cannot be multiplied (4x42 and 64x400)"); T5 saves its untied final norms instead
SAVED_MODULES = {"olmo2": ["lm_head"], "qwen2_vl": ["lm_head"], "t5": ["final_layer_norm"]}


def build(family: str, parent: Path, demo_base: Path | None = None) -> Artifacts:
    """Every artifact of `family` under parent/family: the checkpoint, the run (trained with a
    WorkbenchCallback(raise_on="fail")), the adapter with modules_to_save (trained without), the data files."""
    from workbench.integrations import WorkbenchCallback

    root = parent / family
    root.mkdir(parents=True, exist_ok=True)
    data, training_args = write_data(root)
    if family == "olmo2":
        checkpoint = olmo2_checkpoint(root / "checkpoint")
    elif family == "t5":
        checkpoint = t5_checkpoint(root / "checkpoint")
    else:
        checkpoint = qwen2_vl_checkpoint(root / "checkpoint", demo_base)

    def parts():
        if family == "olmo2":
            return causal_parts(checkpoint)
        if family == "t5":
            return seq2seq_parts(checkpoint)
        from workbench.tasks.grounding import write_dataset

        grounding = root / "grounding"
        if not grounding.exists():
            write_dataset(grounding, ROWS)
        return vlm_parts(checkpoint, grounding)

    callback = WorkbenchCallback(raise_on="fail")
    built = Artifacts(family, checkpoint, root / "run", root / "adapter", root / "run-saved-head", data,
                      training_args)
    try:
        trainer = train_adapter(parts(), built.run, [callback], task_type=TASK_TYPES[family],
                                adapter_dir=built.adapter)
        built.losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    except Exception as exc:  # noqa: BLE001 - the callback's test names it; the other forms need the run anyway
        built.stopped = f"{type(exc).__name__}: {exc}"
        shutil.rmtree(built.run, ignore_errors=True)
        train_adapter(parts(), built.run, task_type=TASK_TYPES[family], adapter_dir=built.adapter)
    built.callback_report = str(callback.report_folder) if callback.report_folder else None
    train_adapter(parts(), built.adapter_saved_head, task_type=TASK_TYPES[family],
                  modules_to_save=SAVED_MODULES[family])
    built.save()
    return built
