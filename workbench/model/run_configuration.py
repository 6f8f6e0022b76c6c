"""A Trainer run's configuration as it was recorded: the model card's "Training hyperparameters" (what the Trainer
writes into README.md), and `training_args.bin` when the user allows unpickling it (`--allow-pickle`). Read by the
run autopsy (notebook 08) and by the training-step checks (notebook 09) as the run's own record.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

# keys of the Trainer's model card ("### Training hyperparameters", transformers/modelcard.py
# extract_hyperparameters_from_trainer) and the TrainingArguments attribute each one is
MODEL_CARD_KEYS = {"learning_rate": "learning_rate", "gradient_accumulation_steps": "gradient_accumulation_steps",
                   "lr_scheduler_type": "lr_scheduler_type", "lr_scheduler_warmup_steps": "warmup_steps",
                   "training_steps": "max_steps", "num_epochs": "num_train_epochs",
                   "mixed_precision_training": "fp16", "train_batch_size": "per_device_train_batch_size",
                   "optimizer": "optim"}
_CARD_LINE = re.compile(r"^- (\w+): (.+)$", re.M)



@dataclasses.dataclass(frozen=True)
class RunConfiguration:
    """The run's TrainingArguments that the checks use, each with where it was read (None: not recorded)."""

    values: dict[str, Any]
    sources: dict[str, str]

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def cite(self, key: str) -> str:
        return f"{key}={self.values[key]!r} ({self.sources[key]})" if key in self.values else f"{key} not recorded"


def model_card_hyperparameters(text: str) -> dict[str, Any]:
    """The Trainer model card's "- key: value" hyperparameters, under the TrainingArguments names."""
    values: dict[str, Any] = {}
    section = text.split("### Training hyperparameters", 1)
    if len(section) < 2:
        return values
    body = section[1].split("###", 1)[0]
    for key, raw in _CARD_LINE.findall(body):
        if key not in MODEL_CARD_KEYS:
            continue
        raw = raw.strip()
        if key == "mixed_precision_training":
            values["fp16"] = raw == "Native AMP"
            continue
        if key == "optimizer":
            # transformers 5.23 modelcard.py formats the enum: "Use OptimizerNames.ADAMW_TORCH_FUSED with betas=..."
            named = re.match(r"Use (?:OptimizerNames\.(\w+)|(\S+))", raw)
            if named:
                values["optim"] = _optimizer_value(named.group(1)) if named.group(1) else named.group(2)
            continue
        try:
            value: Any = int(raw) if re.fullmatch(r"-?\d+", raw) else float(raw)
        except ValueError:
            value = raw
        values[MODEL_CARD_KEYS[key]] = value
    return values


def _optimizer_value(member: str) -> str:
    """The `optim` string of an OptimizerNames member name (ADAMW_BNB is 'adamw_bnb_8bit': not always its lower
    case)."""
    try:
        from transformers.training_args import OptimizerNames

        return OptimizerNames[member].value
    except (ImportError, KeyError):
        return member.lower()


_ARGS_ATTRIBUTES = ("learning_rate", "gradient_accumulation_steps", "lr_scheduler_type", "warmup_steps",
                    "warmup_ratio", "max_steps", "num_train_epochs", "fp16", "bf16", "per_device_train_batch_size",
                    "logging_nan_inf_filter", "metric_for_best_model", "greater_is_better", "max_grad_norm", "optim")


def training_arguments(path: Path) -> dict[str, Any]:
    """training_args.bin unpickled as it was written (`torch.save(self.args, ...)` in Trainer._save): with
    `torch.load(weights_only=False)`, which runs code from the file. Only called under --allow-pickle."""
    import torch

    args = torch.load(path, map_location="cpu", weights_only=False)
    out = {}
    for name in _ARGS_ATTRIBUTES:
        if hasattr(args, name):
            value = getattr(args, name)
            out[name] = getattr(value, "value", value)  # enums (lr_scheduler_type) as their string
    return out


def run_configuration(run_dir: Path, folder: Path, allow_pickle: bool) -> RunConfiguration:
    """From the model cards (root, then the diagnosed folder), then training_args.bin when allowed (it wins)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for card in (run_dir / "README.md", folder / "README.md"):
        if card.exists():
            for key, value in model_card_hyperparameters(card.read_text(errors="replace")).items():
                values[key], sources[key] = value, f"model card {card}"
    if "max_steps" not in values and "num_train_epochs" in values:
        values["max_steps"], sources["max_steps"] = -1, sources["num_train_epochs"]
    pickled = next((p for p in (folder / "training_args.bin", run_dir / "training_args.bin") if p.exists()), None)
    if pickled is not None and allow_pickle:
        for key, value in training_arguments(pickled).items():
            values[key], sources[key] = value, f"{pickled} (--allow-pickle)"
    return RunConfiguration(values, sources)
