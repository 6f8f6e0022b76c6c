"""FSDP as the user's run gets it, applied to the planner's model: accelerate's own FSDP2 preparation, on a fake
process group.

    with fake_process_group(world_size):          # torch's "fake" backend: collectives that move no data
        sharding = shard_as_accelerate(model, setup)

The Trainer hands `TrainingArguments.fsdp_plugin_args` to accelerate's `FullyShardedDataParallelPlugin`, and
`Accelerator.prepare` calls `accelerate.utils.fsdp_utils.fsdp2_prepare_model` (accelerate 1.15), which
`fully_shard`s every module the plugin's auto-wrap policy matches — `TRANSFORMER_BASED_WRAP`: the classes of the
model's `_no_split_modules`, or `transformer_layer_cls_to_wrap` — bottom-up, then the input embedding, the tail (final
norm and output head, kept gathered after forward) and the root; it upcasts trainable parameters to fp32 under mixed
precision, and leaves frozen 4-bit weights (bitsandbytes' `Params4bit` with uint8 storage) out of sharding. Here that
same function runs, with a stand-in for the Accelerator (the attributes it reads: the plugin, the mixed precision, the
device mesh: none, so fully_shard builds its default one over the process group). The plugin's mixed precision is set
as accelerate's state sets it (`FullyShardedDataParallelPlugin.set_mixed_precision`), and its own activation
checkpointing (`fsdp_config.activation_checkpointing`) is accelerate's `fsdp2_apply_ac`.

PEFT under FSDP2: the Trainer installs no PEFT wrap policy for FSDP2 (only for FSDP1), so a LoRA layer's frozen base
weight and its trainable A/B matrices share their decoder layer's unit. FSDP2 allows that (it groups parameters, and
reduce-scatters only the gradients that exist); what it refuses is trainable parameters of different dtypes in one
unit (`train.fsdp_units` checks that), which accelerate's fp32 upcast avoids.
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any

from workbench.errors import UsageError


@functools.cache
def transformers_default_plugin_args() -> dict[str, Any]:
    """The plugin arguments `TrainingArguments(fsdp=True)` gives with no fsdp_config (FSDP2, transformer-based wrap,
    parameters resharded after forward), asked of the installed transformers."""
    from transformers import TrainingArguments

    from workbench.probes.train.configuration import build_arguments

    return dict(build_arguments(TrainingArguments, {"fsdp": True}, "fsdp").fsdp_plugin_args)


# FSDP1's sharding strategies that fully_shard expresses (accelerate's FSDP_SHARDING_STRATEGY names, or their
# 1-based numbers): resharded after forward, or kept gathered until backward
FSDP1_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
FSDP1_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


def as_fsdp2(plugin_args: dict[str, Any], environment: dict[str, str]) -> tuple[dict[str, Any], int]:
    """(the plugin arguments planned as FSDP2, the version asked for). FSDP1 (from fsdp_config version 1 or an
    accelerate config's fsdp_version 1) is planned as fully_shard: its sharding strategy becomes
    reshard_after_forward; a strategy fully_shard cannot express is one line (UsageError)."""
    version = int(plugin_args.get("fsdp_version") or environment.get("FSDP_VERSION") or 1)
    if version != 1:
        return {**plugin_args, "fsdp_version": 2}, version
    strategy = str(plugin_args.get("reshard_after_forward") or plugin_args.get("sharding_strategy")
                   or environment.get("FSDP_SHARDING_STRATEGY") or "FULL_SHARD").upper()
    if strategy.isdigit() and 1 <= int(strategy) <= len(FSDP1_STRATEGIES):
        strategy = FSDP1_STRATEGIES[int(strategy) - 1]
    if strategy not in FSDP1_RESHARD:
        raise UsageError(f"FSDP1 sharding strategy {strategy}: not planned (fully_shard plans FULL_SHARD and "
                         "SHARD_GRAD_OP; use one of them, or fsdp_version 2 with reshard_after_forward)")
    args = {k: v for k, v in plugin_args.items() if k != "sharding_strategy"}
    return {**args, "fsdp_version": 2, "reshard_after_forward": FSDP1_RESHARD[strategy]}, version


@contextlib.contextmanager
def fake_process_group(world_size: int):
    """This process as rank 0 of `world_size` on torch's fake backend (as torchtitan's memory estimator,
    scripts/estimate/estimation.py, initialises it): FSDP shards as on `world_size` GPUs, and its collectives return
    at once. Rank 0 holds the largest shard (fully_shard pads the last ranks' shards)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise UsageError("a torch.distributed process group is already initialized in this process: the FSDP plan "
                         "needs its own (fake) one; run `workbench plan` in a process of its own")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard_as_accelerate(model, setup) -> dict[str, Any]:
    """accelerate's FSDP2 preparation of `model` (module docstring), in place, for the set-up's plugin arguments:
    {"units": the modules fully_shard made units of, "left_out": parameters left unsharded, "version": the
    fsdp_version asked for}. A model accelerate refuses (a wrap class it cannot find) is one line (UsageError)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from workbench.plan.launch import launched

    # FSDP1 is planned as FSDP2 (the caller says so); the plugin reads the launch's FSDP_* fields the training
    # arguments leave unset, as the Trainer's Accelerator builds it in each process of the run
    plugin_args, version = as_fsdp2(setup.fsdp, setup.launch_environment)
    # how the weights reach the ranks (rank 0 loads, then broadcasts), not what a step holds: off, as the fake
    # model's weights are already in place on every rank
    plugin_args["cpu_ram_efficient_loading"] = False
    with launched(setup.launch_environment):
        plugin = FullyShardedDataParallelPlugin(**plugin_args)
    precision = setup.precision
    if precision != "no":
        plugin.set_mixed_precision(precision)
    accelerator = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin), mixed_precision=precision,
                                        is_main_process=False, torch_device_mesh=None)
    try:
        plugin.set_auto_wrap_policy(model)
        if plugin.activation_checkpointing:
            model = fsdp2_apply_ac(accelerator, model)
        prepared = fsdp2_prepare_model(accelerator, model)
    except ValueError as exc:
        raise UsageError(f"FSDP: accelerate's fsdp2_prepare_model refuses this model ({str(exc).splitlines()[0]})"
                         ) from None
    if prepared is not model:  # accelerate shards in place; a copy would leave the caller's model unsharded
        raise RuntimeError("accelerate's fsdp2_prepare_model returned another module than it was given")
    units = [name or "(root)" for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    left_out = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)]
    return {"units": units, "left_out": left_out, "version": version}
