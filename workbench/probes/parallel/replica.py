"""What a DataParallel replica runs: a forward in a worker thread started inside the caller's autocast.

Autocast state is thread-local, so a thread started under `torch.autocast(..., dtype=bf16)` runs without it;
and from transformers 4.30 autocast reaches the model only through `accelerator.prepare(model)`, which the
Trainer skips for a DataParallel-wrapped model. A model with fp32 norms or buffers then feeds fp32 activations to
a bf16 matmul: `expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from workbench.model.forward import autocast, autocast_reaches_a_new_thread
from workbench.model.loading import first_device
from workbench.model.tracer import DtypeTracer


@dataclasses.dataclass
class ForwardOutcome:
    scenario: str
    ok: bool | None  # None: not run here (`same_as` says which forward answers for it)
    autocast_active: bool  # was autocast enabled where the forward ran?
    output_dtype: str | None = None
    error: str | None = None
    same_as: str | None = None  # the forward this row is (not run again), and why

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _forward(model: nn.Module, inputs: dict, scenario: str, device_type: str) -> tuple[ForwardOutcome, Any]:
    """The outcome of one no-grad forward, and its output (None when it raised)."""
    active = torch.is_autocast_enabled(device_type)
    try:
        with torch.no_grad():
            out = model(**inputs)
        logits = getattr(out, "logits", None)
        if logits is None:  # a bare model: its last_hidden_state
            logits = out[0] if isinstance(out, (tuple, list, dict)) else out
        return ForwardOutcome(scenario, True, active, str(logits.dtype).removeprefix("torch.")), out
    except Exception as exc:  # noqa: BLE001 - the failing forward is the evidence
        return ForwardOutcome(scenario, False, active, None, f"{type(exc).__name__}: {str(exc)[:300]}"), None


# called with the replica thread's output and the dtype tracer it ran under, where it ran without autocast: the
# model in training mode, no grad, no autocast, on the inputs given (`batch.remember_forward`), as notebook 02's
# Trainers leave it (their __init__ sets config.use_cache), which is how notebook 04's forwards find it too
RanWithoutAutocast = Callable[[Any, DtypeTracer], None]


# the main thread's forward under autocast where the replica's ran: what answers for it instead
MAIN_THREAD_NOT_RUN = ("notebook 04's forward matrix, its train / autocast cell (grad.flow's training step where "
                       "anything is trainable): the same forward; run here only as the contrast to a replica forward "
                       "that fails")


def replica_forward_check(model: nn.Module, inputs: dict, compute_dtype: torch.dtype,
                          ran_without_autocast: RanWithoutAutocast | None = None) -> list[ForwardOutcome]:
    """Three forwards in training mode: main thread under autocast (a single-GPU Trainer), a worker thread started
    under autocast (a DataParallel replica), the main thread with no autocast (a wrapped model in Trainer >= 4.30).
    The first is run only where the replica's forward fails, as the contrast that shows autocast is what the replica
    lacks; where the replica's runs, no verdict reads it, and notebook 04's forward matrix runs that forward anyway
    (its train / autocast cell): its row says so (`MAIN_THREAD_NOT_RUN`). The third is the replica's forward, not
    run again, where torch says a thread started under autocast runs without it (`autocast_reaches_a_new_thread`,
    torch 2.13: always) and the replica ran without it: the same model, mode, inputs and grad mode, with autocast
    off. The replica runs under the dtype tracer, which hooks modules in any thread; where it ran and without
    autocast, `ran_without_autocast` gets its output and trace."""
    device_type = first_device(model).type
    was_training = model.training
    model.train()
    outcomes: list[ForwardOutcome] = []
    try:
        with autocast(device_type, compute_dtype):
            holder: list[tuple[ForwardOutcome, Any]] = []
            with DtypeTracer(model) as tracer:
                worker = threading.Thread(name="replica-0", target=lambda: holder.append(
                    _forward(model, inputs, "replica thread started under autocast", device_type)))
                worker.start()
                worker.join()
            replica, replica_out = holder[0]
            outcomes.append(_forward(model, inputs, "main thread, autocast", device_type)[0] if not replica.ok else
                            ForwardOutcome("main thread, autocast", None, torch.is_autocast_enabled(device_type),
                                           same_as=MAIN_THREAD_NOT_RUN))
            outcomes.append(replica)
        if replica.ok and not replica.autocast_active and ran_without_autocast is not None:
            ran_without_autocast(replica_out, tracer)
        del replica_out
        if not replica.autocast_active and not autocast_reaches_a_new_thread(device_type, compute_dtype):
            outcomes.append(dataclasses.replace(
                replica, scenario="main thread, no autocast",
                same_as="the replica thread's forward (a thread started under autocast runs without it: torch keeps "
                        "autocast's state per thread)"))
        else:
            outcomes.append(_forward(model, inputs, "main thread, no autocast", device_type)[0])
    finally:
        model.train(was_training)
    return outcomes
