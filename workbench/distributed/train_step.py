"""A rank's own batch and one training step, shared by the DDP and FSDP2 trials (`workbench.distributed.ddp`,
`workbench.distributed.fsdp`) that `workbench.distributed.rank` runs on every rank under torchrun.

Each rank uses its own batch (labels shuffled by rank), so gradients differ until DDP averages them; a failure is
kept as one line (`short_error`), its traceback beside it.
"""

from __future__ import annotations


def rank_inputs(model, target, rank: int) -> tuple[dict, str]:
    """The workbench's sample inputs, with labels shuffled by rank: each rank has its own batch."""
    import torch

    from workbench.model.batch import target_inputs

    inputs, how = target_inputs(model, target)
    if "labels" in inputs:
        generator = torch.Generator().manual_seed(1000 + rank)
        order = torch.randperm(inputs["labels"].shape[-1], generator=generator).to(inputs["labels"].device)
        inputs["labels"] = inputs["labels"][..., order]
        return inputs, how + f"; labels shuffled with seed {1000 + rank} on this rank"
    if "input_ids" in inputs:
        inputs["input_ids"] = torch.roll(inputs["input_ids"], shifts=rank + 1, dims=-1)
        return inputs, how + f"; token ids rolled by {rank + 1} on this rank"
    return inputs, how + "; the same batch on every rank"


def train_step(module, inputs: dict, autocast_dtype=None) -> float:
    """Forward (under autocast when a half dtype is given) and backward; the loss, or the logits' mean."""

    from workbench.model.forward import autocast, device_type_of, logits_of

    with autocast(device_type_of(module), autocast_dtype):
        out = module(**inputs)
    loss = out.loss if getattr(out, "loss", None) is not None else logits_of(out).float().mean()
    loss.backward()
    return float(loss.detach().float())


def short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ''}"
