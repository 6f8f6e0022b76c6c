"""The Trainer a callback runs in, read as the probes need it and left as training will use it.

    trainer = calling_trainer(callback)          # the Trainer whose callback handler called us (or None)
    with untouched_run(trainer, model):          # RNG streams, buffer values, the accelerator's loaders kept
        batch = first_batch(trainer)             # the first batch your collator builds, rows in dataset order
        prepared = live_prepared(trainer, model) # what the probes call `prepared`, around the live model

`TrainerCallback` events receive the model, the optimizer and the dataloader, not the Trainer; the Trainer calls
its `callback_handler` from its own methods (transformers 5.23 trainer.py `_inner_training_loop`:
`self.callback_handler.on_train_begin(...)`), so the Trainer is the `self` of a frame above the event whose
handler holds this callback.
"""

from __future__ import annotations

import contextlib
import inspect
import random
from pathlib import Path
from typing import Any, Iterator

FRAMES_SEARCHED = 8  # event -> CallbackHandler.call_event -> CallbackHandler.on_* -> the Trainer's method


def calling_trainer(callback) -> Any | None:
    """The transformers.Trainer (trl's trainers included) whose callback handler holds `callback`, from the stack."""
    from transformers import Trainer

    frame = inspect.currentframe()
    try:
        for _ in range(FRAMES_SEARCHED):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                return None
            owner = frame.f_locals.get("self")
            handler = getattr(owner, "callback_handler", None)
            if isinstance(owner, Trainer) and callback in getattr(handler, "callbacks", ()):
                return owner
        return None
    finally:
        del frame


def source_folder(model) -> Path | None:
    """The local folder the model (or a PEFT model's base) was loaded from, when it holds a config.json."""
    config = getattr(model, "config", None)
    base = getattr(model, "get_base_model", None)
    if base is not None:  # a PeftModel: the base's config names the base's folder
        config = getattr(base(), "config", config)
    name = getattr(config, "_name_or_path", "") or getattr(config, "name_or_path", "")
    folder = Path(str(name)).expanduser() if name else None
    return folder.resolve() if folder is not None and (folder / "config.json").is_file() else None


@contextlib.contextmanager
def untouched_run(trainer, model) -> Iterator[None]:
    """Probes run inside; after them the run goes on as if they never had: the Python, NumPy, torch (and CUDA) random
    streams a dataloader iterator and a training-mode forward draw from, the values of the model's buffers (a
    training-mode forward updates BatchNorm statistics in place, which `guard.restored` does not undo: it keeps
    tensor objects, not values), and the accelerator's list of prepared dataloaders (accelerate 1.15
    accelerator.py `prepare_data_loader` appends each one it prepares; `save_state` walks that list), and accelerate's
    process-wide state: building any TrainingArguments clears it (transformers 5.23 training_args.py:1872,
    `AcceleratorState._reset_state(reset_partial_state=True)`), and the training-step checks build theirs, after
    which the live Trainer's next step raises "`AcceleratorState` object has no attribute `distributed_type`"."""
    import numpy as np
    import torch

    from workbench.model.accelerate_state import kept_as_launched

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    buffers = [(b, b.detach().clone()) for b in model.buffers() if b.device.type != "meta"]
    accelerator = getattr(trainer, "accelerator", None)
    loaders = list(getattr(accelerator, "_dataloaders", []))
    try:
        with kept_as_launched():
            yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])
        with torch.no_grad():
            for buffer, value in buffers:
                buffer.copy_(value)
        if accelerator is not None and hasattr(accelerator, "_dataloaders"):
            accelerator._dataloaders[:] = loaders


def first_batch(trainer) -> dict[str, Any]:
    """The first batch the Trainer's own dataloader and collator build, with the sampler made sequential (the rows
    keep their dataset order), as `workbench.probes.data.batches` reads them."""
    from torch.utils.data import SequentialSampler

    trainer._get_train_sampler = lambda *a, **k: SequentialSampler(trainer.train_dataset)
    try:
        loader = trainer.get_train_dataloader()
    finally:
        del trainer._get_train_sampler
    return next(iter(loader))


def tensors_only(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch's tensors, on the CPU and contiguous (what a safetensors file holds)."""
    import torch

    return {k: v.detach().cpu().contiguous() for k, v in batch.items() if isinstance(v, torch.Tensor)}


def tokenizer_of(trainer, processing_class=None):
    """The tokenizer the run pads with: the Trainer's processing class, else its collator's."""
    collator = getattr(trainer, "data_collator", None) if trainer is not None else None
    processor = (processing_class or getattr(trainer, "processing_class", None) or getattr(collator, "tokenizer", None)
                 or getattr(collator, "processor", None))
    return getattr(processor, "tokenizer", processor)


def quant_of(model) -> str:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base, "is_loaded_in_4bit", False):
        return "4bit"
    return "8bit" if getattr(base, "is_loaded_in_8bit", False) else "none"


def runs_sharded(trainer) -> str | None:
    """Why one rank alone cannot run the model (its parameters are sharded across ranks), or None."""
    if trainer is None:
        return None
    if getattr(trainer, "is_fsdp_enabled", False):
        return "FSDP shards the parameters across ranks: a forward on one rank alone waits for the others"
    if getattr(trainer, "is_deepspeed_enabled", False):
        return "DeepSpeed partitions the model across ranks: a forward on one rank alone waits for the others"
    return None
