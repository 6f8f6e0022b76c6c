"""Will the Trainer wrap this model in DataParallel? Asked of the installed `transformers.Trainer` itself.

A real Trainer is constructed on the prepared model with the GPU count the training process would see
(`args._n_gpu`), and `_wrap_model` is called. On a machine without those GPUs two things are simulated, and
said: the GPU count, and — because `Trainer.__init__` compares a one-device `hf_device_map` with `args.device`,
which is `cpu` here but `cuda:0` on the user's machine — a map whose only device is GPU 0 is shown to the
Trainer as `cpu` (same answer: "the map's device is args.device").
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
from typing import Any, Iterator

import torch
from torch import nn

from workbench.model.components import unwrap_model

DEFAULT_DATASET_SIZE = 272  # the demo write-up's run: with 2 per device: 136 steps on one GPU, 68 when DataParallel doubles the batch
DEFAULT_PER_DEVICE_BATCH = 2


@dataclasses.dataclass
class WrapObservation:
    scenario: str
    gpus: int
    hf_device_map: dict | None  # as the user's run would have it
    seen_by_trainer: dict | None  # as shown to the Trainer here (see module docstring)
    is_model_parallel: bool | None
    n_gpu: int | None
    wraps_data_parallel: bool | None
    train_batch_size: int | None
    steps_per_epoch: int | None
    simulated: list[str]
    note: str | None = None  # e.g. the Trainer's refusal, and how it was handled

    def as_row(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "DataParallel": self.wraps_data_parallel,
                "is_model_parallel": self.is_model_parallel, "n_gpu": self.n_gpu,
                "train batch": self.train_batch_size, "steps/epoch": self.steps_per_epoch,
                "hf_device_map": str(self.hf_device_map) if self.hf_device_map else "none",
                "note": self.note or ""}


def as_seen_on_this_machine(device_map: dict | None) -> tuple[dict | None, list[str]]:
    """Translate a GPU device map for a CPU-only Trainer so that its args.device comparison answers as on a GPU."""
    if not device_map or torch.cuda.device_count() > 0:
        return device_map, []
    devices = {v for v in device_map.values() if v not in ("cpu", "disk")}
    if len(devices) == 1 and next(iter(devices)) in (0, "cuda", "cuda:0"):
        seen = {k: ("cpu" if v not in ("cpu", "disk") else v) for k, v in device_map.items()}
        return seen, ["the one-device map on GPU 0 is shown to the Trainer as 'cpu': here args.device is cpu, on a "
                      "GPU machine it is cuda:0, and either way the map's device equals args.device"]
    if len(devices) == 1:  # one device other than GPU 0: different from args.device on the user's machine
        only = next(iter(devices))
        seen = {k: ("meta" if v not in ("cpu", "disk") else v) for k, v in device_map.items()}
        return seen, [f"the one-device map on {only!r} is shown to the Trainer as 'meta' (torch cannot name a GPU "
                      "here): like cuda:1 against cuda:0, it differs from args.device"]
    return device_map, []


@contextlib.contextmanager
def _attributes(model: nn.Module, **values: Any) -> Iterator[None]:
    """Set attributes for the duration (as from_pretrained would have set them), then restore them."""
    missing = object()
    old = {k: getattr(model, k, missing) for k in values}
    for k, v in values.items():
        setattr(model, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is missing:
                with contextlib.suppress(AttributeError):
                    delattr(model, k)
            else:
                setattr(model, k, v)


def steps_per_epoch(dataset_size: int, train_batch_size: int, accumulation: int) -> int:
    # Trainer: len(dataloader) // accumulation + int(len(dataloader) % accumulation > 0), at least 1
    batches = math.ceil(dataset_size / train_batch_size)
    return max(batches // accumulation + int(batches % accumulation > 0), 1)


def observe_trainer(model: nn.Module, gpus: int, *, scenario: str = "as loaded", device_map: dict | None = None,
                    dataset_size: int = DEFAULT_DATASET_SIZE, per_device_batch: int = DEFAULT_PER_DEVICE_BATCH,
                    accumulation: int = 1) -> WrapObservation:
    from transformers import Trainer, TrainingArguments

    inner, _ = unwrap_model(model)
    real_map = device_map if device_map is not None else getattr(inner, "hf_device_map", None)
    seen, simulated = as_seen_on_this_machine(real_map)
    visible = torch.cuda.device_count()
    if visible < gpus:
        simulated.insert(0, f"args._n_gpu = {gpus} (this machine has {visible} GPU(s))")
    note = None
    with tempfile.TemporaryDirectory(prefix="workbench-trainer-") as out:
        args = TrainingArguments(output_dir=out, report_to=[], per_device_train_batch_size=per_device_batch,
                                 gradient_accumulation_steps=accumulation, use_cpu=not torch.cuda.is_available())
        _ = args.device  # resolve devices first; then the GPU count the training process would see
        args._n_gpu = gpus
        overrides = {"hf_device_map": seen} if seen is not None else {}
        with _attributes(inner, **overrides):
            try:
                trainer = Trainer(model=model, args=args)
            except ValueError as exc:
                if "quantized" not in str(exc):
                    raise
                # a purely quantized model without adapters: the Trainer refuses to fine-tune it at all
                note = (f"the Trainer refuses this model as it is ({str(exc)[:160]}); observed with an adapter "
                        "flag set, as once LoRA is attached")
                with _attributes(inner, _hf_peft_config_loaded=True):
                    trainer = Trainer(model=model, args=args)
            wrapped = trainer._wrap_model(trainer.model, training=True)
            observation = WrapObservation(
                scenario=scenario, gpus=gpus, hf_device_map=real_map, seen_by_trainer=seen,
                is_model_parallel=bool(trainer.is_model_parallel), n_gpu=args.n_gpu,
                wraps_data_parallel=isinstance(wrapped, nn.DataParallel), train_batch_size=args.train_batch_size,
                steps_per_epoch=steps_per_epoch(dataset_size, args.train_batch_size, accumulation),
                simulated=simulated, note=note)
            del trainer, wrapped
    return observation


def single_gpu_baseline(dataset_size: int, per_device_batch: int, accumulation: int) -> int:
    return steps_per_epoch(dataset_size, per_device_batch, accumulation)
