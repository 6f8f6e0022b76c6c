"""The batch the forward probes feed a model: the first candidate the model accepts, proven by one plain forward.

    inputs, how = target_inputs(model, target)   # the probes' call: labels that fit the head
    batch = accepted_batch(model, target)        # raises BatchNotAccepted, naming every candidate and its exception
    batch.inputs, batch.labeled, batch.how

A verdict about the model needs a baseline that passes. Each candidate of `workbench.model.inputs.candidate_inputs`
runs once on the model as prepared, in eval mode without autocast (and, when that raises, under autocast with the
compute dtype: a set-up whose dtypes only work under autocast — the defect notebook 04 names — still accepts the
batch). The first that runs is kept, with labels that fit the head when the forward accepts them. When none runs,
either our inputs or the model is at fault, and the forward checks say `error` with every exception, never `fail`.
The accepted batch is kept per model object, so the probes of one diagnosis build and check it once. The
accepting forward also records the largest |x| of every module output and fp16 product (`activation_peaks`): notebook
09 reads the fp16 headroom from it instead of running a forward of its own where that needs no fp32 forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Any

import torch
from torch import nn

from workbench.model.activation_peaks import ActivationPeaks, recorded_peaks
from workbench.model.bnb_cpu_layout import keep_training_layout
from workbench.model.declared_quantization import raise_if_declared_quantization_unapplied
from workbench.model.dtypes import compute_dtype_of
from workbench.model.finiteness import all_finite
from workbench.model.forward import labels_how, logits_of, run_forward, with_labels
from workbench.model.inputs import candidate_inputs
from workbench.model.memory import free_memory
from workbench.model.tracer import DtypeTracer

_ACCEPTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {inputs file: AcceptedBatch}


@dataclasses.dataclass
class AcceptedBatch:
    inputs: dict[str, Any]
    labeled: dict[str, Any]  # inputs with labels that fit the head (the same dict when the head takes none)
    how: str  # how the inputs were made, and their labels
    rejected: list[tuple[str, str]]  # (candidate, exception) tried before this one
    # forwards run on `labeled` through the model as prepared, by (mode, context): ((logits dtype, shape, all
    # finite), what ran it, its dtype tracer where it ran under one). The forward matrix reads such a cell instead of
    # running it again: the accepting forward is the eval / no-autocast cell (where it ran without autocast),
    # grad.flow's forward the train / autocast cell, and forward.mixed_precision_buffers' traced one the train /
    # no-autocast cell where its cast changed nothing (`remember_forward`)
    forwards: dict[tuple[str, str], tuple[tuple[str, tuple, bool], str, Any]] = dataclasses.field(default_factory=dict)
    # the largest |x| per module output and fp16 product of the accepting forward, where it ran without autocast
    peaks: ActivationPeaks | None = None


class BatchNotAccepted(RuntimeError):
    """No candidate batch runs through the model: the forward checks say `error`, with every exception."""

    finding_title = "Could not build a batch this model accepts"
    fix = ("Save one batch your training feeds the model as safetensors (safetensors.torch.save_file(batch, "
           "'inputs.safetensors')) and pass it with `forward_inputs: inputs.safetensors` in a --params file; if your "
           "own batch fails the same way, the model itself is at fault.")

    def __init__(self, rejected: list[tuple[str, str]]) -> None:
        self.rejected = rejected
        self.evidence = {"candidates": [{"inputs": how, "error": error} for how, error in rejected]}
        tried = "; ".join(f"{how} → {error}" for how, error in rejected)
        super().__init__(f"no batch ran one plain forward of the model as prepared (eval, without and with "
                         f"autocast), so no verdict about the model is possible: {tried}")


class ForwardOutOfMemory(RuntimeError):
    """The baseline forward ran out of memory: the batch may fit, the device does not (an `error`, said so)."""

    finding_title = "The forward ran out of memory"
    fix = "Memory was freed; diagnose with a smaller input, 4-bit, or more GPU memory."


def _summary(out) -> tuple[str, tuple, bool] | None:
    try:
        logits = logits_of(out)
        return str(logits.dtype).removeprefix("torch."), tuple(logits.shape), all_finite(logits)
    except Exception:  # noqa: BLE001 - an output without logits: the matrix runs its own forward
        return None


def _runs(model: nn.Module, inputs: dict) -> tuple[str | None, tuple[str, tuple, bool] | None,
                                                  ActivationPeaks | None, DtypeTracer | None]:
    """(None, its logits' dtype, shape and finiteness, its activation peaks, its dtype tracer) when one eval forward
    runs without autocast; (None, None, None, None) when it runs only under autocast; else (the first exception,
    None, None, None). The tracer is kept with the batch's eval / no-autocast cell: the islands' containment trace
    reads it instead of running that forward again."""
    keep_training_layout(model)  # an eval forward must not repack 4-bit weights for CPU inference
    was_training = model.training
    model.eval()
    try:
        first = None
        for context in ("no autocast", "autocast"):
            plain = context == "no autocast"
            with (recorded_peaks(model) if plain else contextlib.nullcontext(None)) as peaks, \
                    (DtypeTracer(model) if plain else contextlib.nullcontext(None)) as tracer:
                out, exc = run_forward(model, inputs, context, compute_dtype_of(model))
            if exc is None:
                return (None, _summary(out), peaks, tracer) if plain else (None, None, None, None)
            if isinstance(exc, torch.OutOfMemoryError):
                free_memory()
                raise ForwardOutOfMemory(f"out of memory: {str(exc)[:300]}") from exc
            first = first or f"{type(exc).__name__}: {str(exc)[:300]}"
        return first, None, None, None
    finally:
        model.train(was_training)


def accepted_batch(model: nn.Module, target) -> AcceptedBatch:
    """The first candidate batch the model accepts (module docstring), cached per model and inputs file."""
    inputs_file = target.params.get("forward_inputs")
    cached = _ACCEPTED.get(model, {}).get(inputs_file)
    if cached is not None:
        return cached
    rejected: list[tuple[str, str]] = []
    for inputs, how, build_error in candidate_inputs(model, target.model_dir, inputs_file=inputs_file):
        if inputs is None:  # the builder could not build a batch
            rejected.append((how, build_error or ""))
            continue
        labeled = with_labels(model, inputs)
        error, output, peaks, tracer = _runs(model, labeled)
        if error is None:
            batch = AcceptedBatch(inputs, labeled, f"{how}; {labels_how(model, labeled)}", rejected)
        elif labeled is not inputs and (unlabeled := _runs(model, inputs))[0] is None:
            batch = AcceptedBatch(inputs, inputs, f"{how}; labels not accepted ({error}): loss from the outputs",
                                  rejected)
            output, peaks, tracer = unlabeled[1:]
        else:
            rejected.append((how, error))
            continue
        if output is not None:  # it ran without autocast
            batch.forwards[("eval", "no autocast")] = (output, "the forward that accepted the batch", tracer)
        batch.peaks = peaks if peaks is not None and peaks.complete else None
        _ACCEPTED.setdefault(model, {})[inputs_file] = batch
        return batch
    raise_if_declared_quantization_unapplied(model)  # the cause of every rejection, named (declared_quantization)
    raise BatchNotAccepted(rejected)


def remember_forward(model: nn.Module, target, inputs: dict, mode: str, context: str, output, by: str,
                     tracer=None) -> None:
    """Keep what a probe's forward of the accepted batch gave (`AcceptedBatch.forwards`): `inputs` must be that
    batch's labeled inputs, the model as prepared; an output without logits is not kept. `tracer`: the
    `DtypeTracer` the forward ran under, if any."""
    batch = _ACCEPTED.get(model, {}).get(target.params.get("forward_inputs"))
    if batch is None or inputs is not batch.labeled:
        return
    with torch.no_grad():
        summary = _summary(output)
    if summary is not None:
        batch.forwards[(mode, context)] = (summary, by, tracer)


def remembered_tracer(model: nn.Module, inputs: dict, mode: str, context: str):
    """The dtype tracer of a forward already run in (`mode`, `context`) on `inputs`, the labeled inputs of a batch
    accepted for `model` (`AcceptedBatch.forwards`); None where no such forward ran under one."""
    for batch in _ACCEPTED.get(model, {}).values():
        if batch.labeled is inputs:
            return batch.forwards.get((mode, context), (None, None, None))[2]
    return None


def target_inputs(model: nn.Module, target, labels: bool = True) -> tuple[dict, str]:
    """The batch the probes feed this target's model (`accepted_batch`), with labels that fit its head unless
    `labels=False`, and how it was built (for the report). Raises BatchNotAccepted when no candidate runs."""
    batch = accepted_batch(model, target)
    return (batch.labeled if labels else batch.inputs), batch.how
