"""Running a model once, as the probes and the torchrun ranks do: the inputs a target's model takes (with labels
that fit its head), its device, and one forward in a context (plain, under autocast, or in a replica thread started
under autocast: autocast state is thread-local, which is how DataParallel's replicas lose it).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any

import torch
from torch import nn

from workbench.model.heads import DESCRIPTIONS, head_kind, labels_for
from workbench.model.loading import first_device


def device_type_of(model: nn.Module) -> str:
    return first_device(model).type


def logits_of(out: Any) -> torch.Tensor:
    return getattr(out, "logits", None) if getattr(out, "logits", None) is not None else out[0]


def autocast(device_type: str, dtype: torch.dtype):
    """torch.autocast in `dtype`, or no context for a dtype autocast does not cast to (float32): torch would disable
    itself for it anyway, after a UserWarning ("CPU Autocast only supports dtypes of torch.bfloat16, torch.float16")
    that lands in a training script's console when the callback checks an fp32 model."""
    if dtype not in (torch.bfloat16, torch.float16):
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)


@functools.cache
def autocast_reaches_a_new_thread(device_type: str, dtype: torch.dtype) -> bool:
    """Whether a thread started under autocast runs under it, asked of torch: a thread reads
    torch.is_autocast_enabled while the starting thread holds autocast (torch 2.13 keeps its state per thread: no)."""
    seen: dict[str, bool] = {}
    with autocast(device_type, dtype):
        reader = threading.Thread(target=lambda: seen.update(on=torch.is_autocast_enabled(device_type)))
        reader.start()
        reader.join()
    return seen["on"]


def run_forward(model: nn.Module, inputs: dict, context: str, compute_dtype: torch.dtype, grad: bool = False):
    """Run one forward in a context; returns (output, exception)."""
    device_type = device_type_of(model)
    box: dict[str, Any] = {}

    def forward() -> None:
        try:
            with (contextlib.nullcontext() if grad else torch.no_grad()):
                box["out"] = model(**inputs)
        except Exception as exc:  # noqa: BLE001 - the failure is the result
            box["exc"] = exc

    if context == "no autocast":
        forward()
    else:
        with autocast(device_type, compute_dtype):
            if context == "autocast":
                forward()
            else:
                worker = threading.Thread(target=forward, name="replica-0")
                worker.start()
                worker.join()
    return box.get("out"), box.get("exc")


def with_labels(model: nn.Module, inputs: dict) -> dict:
    """Add labels that fit the head (workbench.model.heads) when the model's forward takes them: the input ids for
    a causal / image-text / seq2seq LM, one class per row for sequence classification, one class per token for
    token classification, none for a bare model."""
    if "labels" in inputs or ("input_ids" not in inputs and head_kind(model) != "seq2seq_lm"):
        return inputs
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return inputs
    if "labels" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        labels = labels_for(model, inputs)
        if labels is not None:
            return {**inputs, "labels": labels}
    return inputs


def labels_how(model: nn.Module, inputs: dict) -> str:
    """How the labels of a batch were made, for the report."""
    head = head_kind(model)
    if "labels" not in inputs:
        return f"{DESCRIPTIONS[head]} head: no labels (loss from the mean of its outputs)"
    shape = list(inputs["labels"].shape)
    what = {"seq_cls": "one class per row", "token_cls": "one class per token"}.get(
        head, "labels = input_ids" if "input_ids" in inputs else "random decoder token ids as labels")
    return f"{DESCRIPTIONS[head]} head: {what} {shape}"
