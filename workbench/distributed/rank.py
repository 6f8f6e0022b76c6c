"""One rank of the distributed diagnosis, started by `workbench.distributed.launcher` (never imported by a notebook):

    python -m torch.distributed.run --nproc_per_node 2 ... -m workbench.distributed.rank --spec SPEC --out DIR

Each rank re-resolves the target from SPEC (the arguments a notebook kernel receives) and builds the model through
the target's own set-up, so the user's `--setup module:function` is what runs. Then: the DDP trials
(`workbench.distributed.ddp`: gradients present and equal after all-reduce, unused parameters, the Trainer's
`find_unused_parameters` against reentrant checkpointing), the DataLoader's start method
(`workbench.distributed.dataloader`), and an FSDP2 step under `MixedPrecisionPolicy` on a fresh copy of the model
(`workbench.distributed.fsdp`). After every stage the rank rewrites DIR/rank<N>.json (`torchrun.RankLog`), so a
rank that crashes or hangs still says what it found and where it stopped; an exception is written with its
traceback, and the rank exits 1.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import os
import sys
from typing import Any

from workbench.distributed.ddp import ddp_section
from workbench.distributed.fsdp import fsdp_section
from workbench.distributed.launcher import RankLog, rank_main


def build(target, device):
    """The model through the target's own set-up, on this rank's GPU when there is one."""
    from workbench.model.setups import prepare_model

    model = prepare_model(target).model
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    if device.type == "cuda" and on_cpu and not getattr(model, "hf_device_map", None):
        model = model.to(device)
    return model


def run_rank(spec: dict[str, Any], log: RankLog) -> None:
    import datetime as dt

    import torch
    import torch.distributed as dist

    from workbench.model.target import resolve_target
    from workbench.runtime import quiet_and_offline

    torch.set_num_threads(1)  # ranks share the machine's cores
    quiet_and_offline()
    backend = spec.get("backend", "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist.init_process_group(backend, timeout=dt.timedelta(seconds=float(spec.get("timeout", 600))))
    versions = {"torch": torch.__version__}
    for package in ("transformers", "peft", "accelerate", "bitsandbytes"):  # from metadata: importing costs seconds
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    log.update(backend=backend, device=str(device), versions=versions)
    target = resolve_target(**spec["target"])
    # what the imports made lives as long as the rank: each gc.collect() between trials then skips it
    gc.freeze()
    rank = dist.get_rank()
    if "ddp" in spec.get("checks", ("ddp", "fsdp")):
        log.stage("set-up for DDP")
        model = build(target, device)
        log.stage("DDP trials")
        log.section("ddp", ddp_section(model, target, spec, rank))
        del model
        gc.collect()
    if "fsdp" in spec.get("checks", ("ddp", "fsdp")):
        log.stage("set-up for FSDP")  # a fresh model: fully_shard replaces parameters in place for good
        model = build(target, device)
        log.stage("FSDP2 step")
        log.section("fsdp", fsdp_section(model, target, rank))


def main(argv: list[str] | None = None) -> int:
    return rank_main(__doc__.splitlines()[0], run_rank, argv)


if __name__ == "__main__":
    sys.exit(main())
