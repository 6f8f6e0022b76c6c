"""The training step of one rank under FSDP, on fake tensors: the user's model built as the single-GPU plan builds
it (`step.build_model`: PEFT, the 4-bit base), gradient checkpointing as the Trainer turns it on, then sharded by
accelerate's own FSDP2 preparation over a fake process group of `--gpus` ranks (`fsdp`), given fake storage, and
stepped twice as the Trainer steps (`step.run_steps`) under torch's FSDPMemTracker (`tracker.ShardedMemTracker`).
This is how torchtitan estimates its models' memory (scripts/estimate/estimation.py: a fake process group,
FakeTensorMode, fully_shard, FSDPMemTracker over two iterations, its module statistics reset after the first);
what it never covers is the Hugging Face side: the model class, PEFT, the Trainer's optimizer, accelerate's units.

    measured = sharded_step(setup)       # StepMemory of rank 0, in the plan's categories

The breakdown keeps the single-GPU plan's names for this rank's shards (weights, gradients, optimizer states) and
names what FSDP adds: `unsharded weights` / `unsharded gradients` (a unit's parameters all-gathered for its forward
and backward, its gradients before reduce-scatter), `all-gather buffers`, `reduce-scatter buffers`, and the batch's
`inputs`. Parameters accelerate leaves out of sharding (frozen uint8 4-bit weights) are whole on every rank and
outside FSDPMemTracker's view (it follows FSDP's own parameters): they are added to the peak as `replicated weights`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from workbench.plan.depth import extended
from workbench.plan.fake_model import describe_trainable, on_fake_storage
from workbench.plan.fsdp import fake_process_group, shard_as_accelerate
from workbench.plan.step import (
    STEPS,
    StepMemory,
    build_model,
    fake_device,
    prepare_as_the_trainer,
    run_steps,
    trainer_optimizer,
    training_batch,
    value_independent,
)
from workbench.plan.tracker import ShardedMemTracker


def sharded_step(setup) -> StepMemory:
    """Rank 0's memory over the set-up's training steps under FSDP on `setup.gpus` ranks (module docstring); a deep
    stack of identical layers measured short and extended (`depth.extended`)."""
    return extended(setup, lambda short: value_independent(_sharded_fake_step, short))


def rank_bytes(model) -> tuple[int, int]:
    """(bytes this rank holds of the parameters FSDP shards, plus buffers; bytes of the parameters left whole)."""
    from torch.distributed.tensor import DTensor

    sharded = replicated = 0
    for p in model.parameters():
        if isinstance(p, DTensor):
            local = p.to_local()
            sharded += local.numel() * local.element_size()
        else:
            replicated += p.numel() * p.element_size()
    sharded += sum(b.numel() * b.element_size() for b in model.buffers())
    return sharded, replicated


def tracked_sharded_steps(setup, model, inputs: dict[str, torch.Tensor], steps: int = STEPS) -> dict[str, Any]:
    """The Trainer's first `steps` steps on a sharded model (fake or real tensors) and a batch, tracked by
    ShardedMemTracker as torchtitan's estimator tracks them: {"tracker", "first" (the first step's peak), "replicated"
    (bytes of parameters left whole: outside the tracker), "optimizer"}. The real runs the tests hold the plan to call
    it too."""
    model.train()
    optimizer, optimizer_name = trainer_optimizer(setup, model)
    device = next(iter(inputs.values())).device.type
    tracker = ShardedMemTracker(model, optimizer)
    tracker.track_inputs(tuple(inputs.values()))
    with tracker:
        first = run_steps(setup, model, optimizer, inputs, tracker, device, steps)
    return {"tracker": tracker, "first": first, "replicated": rank_bytes(model)[1], "optimizer": optimizer_name}


def sharded_breakdown(tracker, replicated: int) -> dict[str, int]:
    """The tracker's peak per category, with the parameters left whole added as `replicated weights`."""
    breakdown = tracker.breakdown()
    if replicated:
        breakdown["replicated weights"] = replicated
        breakdown["total"] += replicated
    return breakdown


def _notes(setup, sharding: dict[str, Any]) -> list[str]:
    notes = [f"FSDP over {setup.gpus} GPUs ({setup.fsdp_source}), measured: accelerate's fsdp2_prepare_model on a "
             f"fake process group, two steps tracked by torch's FSDPMemTracker; the figures are rank 0's (the "
             f"largest shard); the {getattr(setup.config, 'num_hidden_layers', '?')}-layer model measured has "
             f"{len(sharding['units'])} units: {', '.join(sharding['units'][:4])}"
             + (", …" if len(sharding["units"]) > 4 else "")]
    if sharding["version"] == 1:
        notes.append("fsdp_config version 1 (FSDP1, deprecated in transformers 5) planned as FSDP2's fully_shard: the "
                     "same sharding of parameters, gradients and optimizer states; FSDP1's flat parameters and its "
                     "PEFT wrap policy are not modelled")
    if sharding["left_out"]:
        notes.append(f"{len(sharding['left_out'])} parameters left out of sharding by accelerate (frozen 4-bit "
                     "weights in uint8 storage; bnb_4bit_quant_storage set to the compute dtype would shard them): "
                     "whole on every rank, the `replicated weights` line")
    return notes


def _sharded_fake_step(setup) -> StepMemory:
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.monotonic()
    model, notes = build_model(setup)
    device = fake_device(setup, notes)
    prepare_as_the_trainer(setup, model)  # before accelerator.prepare shards the model, as the Trainer
    with fake_process_group(setup.gpus):
        # sharded on the meta device, outside FakeTensorMode: fully_shard builds its device mesh from real tensors
        # (torchtitan builds its mesh outside the fake mode too)
        sharding = shard_as_accelerate(model, setup)
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        on_fake_storage(model, fake_mode, device)
        weights = sum(rank_bytes(model))
        counts = describe_trainable(model)
        with fake_mode:
            measured = tracked_sharded_steps(setup, model, training_batch(setup, device))
    tracker = measured["tracker"]
    breakdown = sharded_breakdown(tracker, measured["replicated"])
    return StepMemory(breakdown["total"], breakdown, tracker.peak_phase or "", measured["first"] + measured["replicated"],
                      weights, tracker.top_modules(), counts["trainable_parameters"], counts["parameters"],
                      measured["optimizer"], time.monotonic() - start, [*notes, *_notes(setup, sharding)], None,
                      tracker.timeline(), list(tracker.phase_ends))
