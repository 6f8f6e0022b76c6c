"""The real FSDP step the sharded plan predicts, measured on each rank: under torchrun (gloo on the CPU), every rank
builds the model from the same config with random weights (`step.build_model` on the CPU instead of the meta
device), shards it by the same accelerate preparation (`fsdp.shard_as_accelerate`) over the real process group, and
runs the same steps under the same tracker (`fsdp_step.tracked_sharded_steps`) on real tensors, one more than the
plan's: the second and third are the same steady step (Adam's states exist), measured twice, since gloo's CPU
collectives stage temporaries whose release follows its threads' timing. Each rank writes its tracked peak and
breakdown, each step's own peak and what the steps leave held to `OUT/rank<N>.json`. Used by the tests to hold the
fake-tensor plan to a real run.

    launch_ranks("workbench.plan.real_fsdp_step", ["--spec", SPEC_JSON, "--out", OUT], ranks=2, timeout=…, out_dir=OUT)

SPEC_JSON: {"cases": [{"name", "checkpoint": config folder, "training_args": a file with `fsdp` set, "peft": an
adapter_config.json or null, "seq": N, "batch": N}, …], "timeout": seconds}: one launch measures every case in turn,
each its own section of the result file.
"""

from __future__ import annotations

import sys
from typing import Any


def run(spec: dict[str, Any], log) -> None:
    import torch.distributed as dist

    from workbench.runtime import quiet_and_offline

    quiet_and_offline()
    dist.init_process_group("gloo")
    for case in spec["cases"]:
        log.stage(case["name"])
        log.section(case["name"], measure(case, dist.get_world_size()))


def measure(case: dict[str, Any], world_size: int) -> dict[str, Any]:
    import torch

    from workbench.plan.fsdp import shard_as_accelerate
    from workbench.plan.fsdp_step import rank_bytes, sharded_breakdown, tracked_sharded_steps
    from workbench.plan.setup import plan_setup
    from workbench.plan.step import STEPS, build_model, prepare_as_the_trainer, training_batch

    setup = plan_setup(case["checkpoint"], training_args=case["training_args"], peft=case.get("peft"),
                       seq=case["seq"], batch=case["batch"], device="cpu", gpus=world_size)
    torch.manual_seed(0)
    model, _ = build_model(setup, device="cpu")
    prepare_as_the_trainer(setup, model)
    sharding = shard_as_accelerate(model, setup)
    inputs = training_batch(setup, "cpu")
    # a padded position, as a padding collator leaves one (the plan's default): with an all-ones mask on real
    # tensors the model would skip the 4D mask a fake tensor cannot show to be unneeded
    inputs["attention_mask"][:, -1] = 0
    measured = tracked_sharded_steps(setup, model, inputs, steps=STEPS + 1)
    tracker = measured["tracker"]
    breakdown = sharded_breakdown(tracker, measured["replicated"])
    return {"peak_bytes": breakdown["total"], "breakdown": breakdown, "phase": tracker.peak_phase,
            "units": sharding["units"], "weights_bytes": sum(rank_bytes(model)),
            # each step's own peak (the overall peak hides the first step's) and what the steps leave held
            "step_peaks": tracker.step_peaks, "after_steps": tracker.breakdown("current"),
            "phases": [(name, peak) for name, peak, _ in tracker.phases]}


def main(argv: list[str] | None = None) -> int:
    from workbench.distributed.launcher import rank_main

    return rank_main(__doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
