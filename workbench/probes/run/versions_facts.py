"""What a Trainer run recorded about itself, read from its files: the versions it ran with and the facts a known
regression's condition needs (gradient accumulation, trainer, head, quantization, ...).

Sources, never a pickle (`training_args.bin` stays unread; a caller that has the TrainingArguments may pass them as a
mapping):
- the model card (README.md) the Trainer writes: "### Framework versions" (`- Transformers 5.23.0`, trl's
  `- TRL: 0.29.0`, PEFT's `- PEFT 0.21.2`) and "### Training hyperparameters" (transformers' modelcard.py
  `extract_hyperparameters_from_trainer`: gradient_accumulation_steps, distributed_type, mixed_precision_training
  and label_smoothing_factor are written only when they differ from the default, so their absence under a written
  block means the default); trl's card names its trainer ("This model was trained with SFT."); PEFT's card
  lists the bitsandbytes quantization config used in training;
- config.json: `transformers_version`, `architectures`, `problem_type`, `use_cache`, `quantization_config`;
- adapter_config.json: `peft_version`, `task_type`;
- trainer_state.json: `train_batch_size`, `global_step`, `max_steps`.

A fact the files do not record stays None: the verdict then says "cannot tell", never guesses.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Mapping

from workbench.model.lora import read_json

CARD_VERSION = re.compile(r"^-\s*(Transformers|TRL|PEFT|Pytorch|Datasets|Tokenizers|bitsandbytes|Accelerate)\s*:?\s+"
                          r"(\S+)\s*$", re.IGNORECASE | re.MULTILINE)
CARD_TRAINER = re.compile(r"This model was trained with ([A-Za-z0-9_-]+)")
HYPERPARAMETERS_BLOCK = "The following hyperparameters were used during training:"
QUANTIZATION_BLOCK = "The following `bitsandbytes` quantization config was used during training:"
PACKAGE_NAMES = {"transformers": "transformers", "trl": "trl", "peft": "peft", "pytorch": "torch",
                 "datasets": "datasets", "tokenizers": "tokenizers", "bitsandbytes": "bitsandbytes",
                 "accelerate": "accelerate"}
TASK_TYPE_HEADS = {"CAUSAL_LM": "causal_lm", "SEQ_CLS": "sequence_classification",
                   "TOKEN_CLS": "token_classification", "SEQ_2_SEQ_LM": "seq2seq_lm",
                   "QUESTION_ANS": "question_answering", "FEATURE_EXTRACTION": "feature_extraction"}
ARCHITECTURE_HEADS = (("ForCausalLM", "causal_lm"), ("ForSequenceClassification", "sequence_classification"),
                      ("ForTokenClassification", "token_classification"), ("ForImageTextToText", "image_text_to_text"),
                      ("ForQuestionAnswering", "question_answering"), ("LMHeadModel", "causal_lm"))
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclasses.dataclass
class RunFacts:
    """The run as its files describe it; `sources` says where each value came from (shown as evidence)."""

    folders: list[str]
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    version_conflicts: list[str] = dataclasses.field(default_factory=list)
    trainer: str | None = None  # "Trainer", or trl's trainer name: "SFT", "DPO", ...
    head: str | None = None
    architecture: str | None = None  # config.json's architectures[0]
    problem_type: str | None = None  # config.json's problem_type (a classifier's loss sets it on its first forward)
    adapter: bool = False
    gradient_accumulation_steps: int | None = None
    label_smoothing_factor: float | None = None
    distributed: bool | None = None
    fsdp: bool | None = None
    gradient_checkpointing: bool | None = None
    reentrant_default: bool | None = None
    quantization: str | None = None  # "4bit", "8bit", "none"
    attention: str | None = None
    use_cache: bool | None = None
    train_batch_size: int | None = None
    global_step: int | None = None
    sources: dict[str, str] = dataclasses.field(default_factory=dict)

    def note(self, fact: str, value: Any, source: str) -> None:
        """Set a fact once: the first source read wins (the run's root before its checkpoints)."""
        if getattr(self, fact) is None and value is not None:
            setattr(self, fact, value)
            self.sources[fact] = source

    def note_version(self, package: str, version: str, source: str) -> None:
        version = version.split("@")[0].strip()  # peft records dev installs as "0.x.y@<commit>"
        if package not in self.versions:
            self.versions[package] = version
            self.sources[f"version:{package}"] = source
        elif self.versions[package] != version:
            self.version_conflicts.append(f"{package} {self.versions[package]} "
                                          f"({self.sources[f'version:{package}']}) vs {version} ({source})")


def run_folders(run_dir: Path) -> list[Path]:
    """The folders whose files describe the run: the folder itself, then its latest checkpoint-N/."""
    checkpoints = sorted((p for p in run_dir.iterdir() if p.is_dir() and CHECKPOINT.match(p.name)),
                         key=lambda p: int(CHECKPOINT.match(p.name).group(1))) if run_dir.is_dir() else []
    return [run_dir, *checkpoints[-1:]]


def read_run_facts(run_dir: Path, training_args: Mapping[str, Any] | None = None) -> RunFacts:
    run_dir = Path(run_dir)
    folders = run_folders(run_dir)
    facts = RunFacts([str(f) for f in folders])
    if training_args:
        _from_training_args(facts, training_args)
    for folder in folders:
        card = folder / "README.md"
        if card.is_file():
            _from_card(facts, card.read_text(errors="replace"), str(card))
        for name, read in (("config.json", _from_config), ("adapter_config.json", _from_adapter_config),
                           ("trainer_state.json", _from_trainer_state)):
            data = read_json(folder / name)
            if data is not None:
                read(facts, data, str(folder / name))
    if facts.fsdp is None and facts.distributed is False:
        facts.note("fsdp", False, facts.sources["distributed"])  # FSDP needs more than one process
    return facts


def _from_card(facts: RunFacts, text: str, source: str) -> None:
    for name, version in CARD_VERSION.findall(text):
        facts.note_version(PACKAGE_NAMES[name.lower()], version, f"{source} (Framework versions)")
    trained_with = CARD_TRAINER.search(text)
    if trained_with:
        facts.note("trainer", trained_with.group(1), f"{source} (\"This model was trained with …\")")
    elif "generated_from_trainer" in text and "trl" not in _card_tags(text):
        facts.note("trainer", "Trainer", f"{source} (tag generated_from_trainer)")
    if HYPERPARAMETERS_BLOCK in text:
        block = text.split(HYPERPARAMETERS_BLOCK, 1)[1].split("\n\n", 1)[0]
        values = dict(re.findall(r"^-\s*([a-z_]+):\s*(.+?)\s*$", block, re.MULTILINE))
        where = f"{source} (Training hyperparameters)"
        # transformers writes these only when they differ from the default: absent under the block = the default
        facts.note("gradient_accumulation_steps", int(values.get("gradient_accumulation_steps", 1)), where)
        facts.note("label_smoothing_factor", float(values.get("label_smoothing_factor", 0.0)), where)
        facts.note("distributed", "distributed_type" in values or int(values.get("num_devices", 1)) > 1, where)
        if "train_batch_size" in values:
            facts.note("train_batch_size", int(values["train_batch_size"]), where)
    if QUANTIZATION_BLOCK in text:
        block = text.split(QUANTIZATION_BLOCK, 1)[1]
        where = f"{source} (bitsandbytes quantization config)"
        if re.search(r"^-\s*load_in_4bit:\s*True", block, re.MULTILINE):
            facts.note("quantization", "4bit", where)
        elif re.search(r"^-\s*load_in_8bit:\s*True", block, re.MULTILINE):
            facts.note("quantization", "8bit", where)
    elif "library_name: peft" in text:  # PEFT's card lists the quantization config whenever the base had one
        facts.note("quantization", "none", f"{source} (PEFT card without a quantization config)")


def _card_tags(text: str) -> list[str]:
    front = text.split("---", 2)[1] if text.startswith("---") else ""
    return re.findall(r"^\s*-\s*([\w.-]+)\s*$", front, re.MULTILINE)


def _from_config(facts: RunFacts, config: dict[str, Any], source: str) -> None:
    if isinstance(config.get("transformers_version"), str):
        facts.note_version("transformers", config["transformers_version"], source)
    for arch in config.get("architectures") or []:
        head = next((h for suffix, h in ARCHITECTURE_HEADS if str(arch).endswith(suffix)), None)
        facts.note("head", head, f"{source} (architectures)")
        facts.note("architecture", str(arch), f"{source} (architectures)")
    if isinstance(config.get("problem_type"), str):
        facts.note("problem_type", config["problem_type"], source)
    if isinstance(config.get("use_cache"), bool):
        facts.note("use_cache", config["use_cache"], source)
    for key in ("_attn_implementation", "attn_implementation"):
        if isinstance(config.get(key), str):
            facts.note("attention", config[key], source)
    quant = config.get("quantization_config")
    if quant is None and "architectures" in config:  # a saved model's config: no quantization_config, no quantization
        facts.note("quantization", "none", source)
    if isinstance(quant, dict):
        bits = "4bit" if quant.get("load_in_4bit") else "8bit" if quant.get("load_in_8bit") else None
        facts.note("quantization", bits, f"{source} (quantization_config)")


def _from_adapter_config(facts: RunFacts, config: dict[str, Any], source: str) -> None:
    facts.adapter = True
    facts.sources.setdefault("adapter", source)
    if isinstance(config.get("peft_version"), str):
        facts.note_version("peft", config["peft_version"], source)
    facts.note("head", TASK_TYPE_HEADS.get(str(config.get("task_type"))), f"{source} (task_type)")


def _from_trainer_state(facts: RunFacts, state: dict[str, Any], source: str) -> None:
    if isinstance(state.get("train_batch_size"), int):
        facts.note("train_batch_size", state["train_batch_size"], source)
    if isinstance(state.get("global_step"), int):
        facts.note("global_step", state["global_step"], source)


def _from_training_args(facts: RunFacts, args: Mapping[str, Any]) -> None:
    where = "training arguments"
    if args.get("gradient_accumulation_steps") is not None:
        facts.note("gradient_accumulation_steps", int(args["gradient_accumulation_steps"]), where)
    if args.get("label_smoothing_factor") is not None:
        facts.note("label_smoothing_factor", float(args["label_smoothing_factor"]), where)
    if "fsdp" in args:
        fsdp = args.get("fsdp")
        facts.note("fsdp", bool(fsdp) and fsdp not in ("", [], "no"), where)
    if "gradient_checkpointing" in args:
        facts.note("gradient_checkpointing", bool(args["gradient_checkpointing"]), where)
        kwargs = args.get("gradient_checkpointing_kwargs") or {}
        facts.note("reentrant_default", "use_reentrant" not in kwargs, where)
    if args.get("per_device_train_batch_size") is not None:
        facts.note("train_batch_size", int(args["per_device_train_batch_size"]), where)
